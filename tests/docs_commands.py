"""The commands the documentation shows, as tests/test_docs_commands.py reads them.

A command is a line that runs mmrl (`mmrl ...`, `python -m mmrl ...`, or `torchrun` / `accelerate
launch ... -m mmrl ...`, after any `VAR=value` settings): each such line of a ```bash block in
README.md and docs/ (a line ending in a backslash continues on the next), the `command:` of a
launched server in a ```yaml block, and each `mmrl ...` in backticks in a shipped recipe's header
comment. Prose that names a command in backticks elsewhere is a mention, not a command.

A command that cannot run on a CPU in seconds says why, with a marker the test reads: in a block, a
trailing comment holding `needs: WHAT`; in a recipe's header, `(needs: WHAT)` right after the
closing backtick. WHAT is one or more of `NEEDS`, separated by commas (`needs: gpu, weights`). A command with a placeholder in capitals (RECIPE, NAME,
OUTPUT_DIR, ...) or `...` is a synopsis.

A code block whose first line is a comment naming a file (`# my_rewards.py`) holds that file.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NEEDS = {
    "gpu": "a GPU (or several)",
    "weights": "model weights from the hub, or a path to them",
    "data": "a data set from the hub, or the user's own files",
    "minutes": "minutes on a CPU (the demos, sweeps, multi-process launches); run by `pytest -m slow`",
}
PLACEHOLDERS = {"RECIPE", "RECIPE_OR_DEMO", "NAME", "KEY", "OUTPUT_DIR", "DIR", "OUT", "CHECKPOINT", "FILE", "N",
                "V1", "V2", "K", "V", "K2", "T"}
MARKER = re.compile(r"needs:\s*(\w+(?:\s*,\s*\w+)*)")
FILE_HEADER = re.compile(r"^#\s*([\w./-]+\.(?:py|yaml|yml|jsonl|json))\s*$")


@dataclass
class Command:
    where: str  # FILE:LINE of the command's first line
    text: str  # as written (continuation lines joined)
    argv: list[str]  # mmrl's own arguments
    launcher: list[str] = field(default_factory=list)  # what runs mmrl when not `mmrl` itself (torchrun ...)
    needs: set[str] = field(default_factory=set)  # the marker's words

    @property
    def document(self) -> str:
        return self.where.rpartition(":")[0]

    @property
    def synopsis(self) -> bool:
        words = {w for token in self.argv for w in re.split(r"[/=,.\s\[\]|]+", token) if w}
        return bool(words & PLACEHOLDERS) or any("..." in token or token.startswith("[") for token in self.argv)

    @property
    def sub_command(self) -> str:
        return self.argv[0] if self.argv else "--help"


def mmrl_arguments(tokens: list[str]) -> tuple[list[str], list[str]] | None:
    """(launcher, mmrl's arguments) of a shell command's `tokens`, None when it does not run mmrl."""
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):  # VAR=value settings
        tokens = tokens[1:]
    if not tokens:
        return None
    if tokens[0] == "mmrl":
        return [], tokens[1:]
    for at in range(len(tokens) - 1):
        if tokens[at:at + 2] == ["-m", "mmrl"]:
            return tokens[:at], tokens[at + 2:]
    return None


def shell_command(where: str, line: str) -> Command | None:
    """The mmrl command of one shell line (its comment may hold a marker)."""
    code = line.split(" #")[0] if not line.lstrip().startswith("#") else ""
    try:
        tokens = shlex.split(code)
    except ValueError:
        return None
    found = mmrl_arguments(tokens)
    if found is None:
        return None
    return Command(where, line.strip(), found[1], found[0], needs(line[len(code):]))


def needs(comment: str) -> set[str]:
    """The words of a `needs:` marker in `comment`."""
    marker = MARKER.search(comment)
    return {w.strip() for w in marker.group(1).split(",")} if marker else set()


def markdown_commands(path: Path) -> list[Command]:
    """The commands of the ```bash blocks (and yaml `command:` lines) of a markdown file."""
    name = str(path.relative_to(ROOT))
    found, fence, pending, start = [], None, "", 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = None if fence is not None else line.strip()[3:].strip()
            continue
        if fence in ("bash", "sh", "shell"):
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            command = shell_command(f"{name}:{start}", pending + line)
            pending = ""
        elif fence == "yaml" and re.match(r"\s*command:\s*mmrl ", line):
            command = shell_command(f"{name}:{number}", line.split("command:", 1)[1])
        else:
            continue
        if command is not None:
            found.append(command)
    return found


def recipe_header_commands(path: Path) -> list[Command]:
    """The backticked `mmrl ...` commands of a recipe's header comment (the comment lines before the
    first line of YAML), each with the `(needs: WHAT)` that follows it."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    text = " ".join(lines)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    found = []
    for match in re.finditer(r"`(mmrl [^`]+)`(\s*\(needs:[^)]*\))?", text):
        number = max(i for i, s in enumerate(starts) if s <= match.start()) + 1
        where = f"{path.relative_to(ROOT)}:{number}"
        found.append(Command(where, match.group(1), shlex.split(match.group(1))[1:], [], needs(match.group(2) or "")))
    return found


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_commands() -> list[Command]:
    found = [c for path in documents() for c in markdown_commands(path)]
    return found + [c for path in sorted((ROOT / "tasks" / "recipes").glob("*.yaml")) for c in recipe_header_commands(path)]


def example_files() -> dict[str, str]:
    """{file name: text} of every code block whose first line names its file (`# my_rewards.py`)."""
    files = {}
    for path in documents():
        for block in re.findall(r"```\w*\n(.*?)```", path.read_text(), flags=re.DOTALL):
            header = FILE_HEADER.match(block.splitlines()[0]) if block.strip() else None
            if header:
                files[header.group(1)] = block
    return files
