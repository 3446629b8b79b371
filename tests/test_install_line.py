"""One install for the README, CI and the tests: CI (`.ci/run`) runs the README's own setup line, read
from README.md; docs/install.md shows the same line; and the `test` extra that line installs brings
every optional package the default suite uses (the served-reward and judge servers, ruff for CI's
lint, DeepSpeed for the ZeRO-3 tests)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def setup_block(markdown: Path, heading: str) -> list[str]:
    """The lines of the first ```bash block under `heading` in `markdown`."""
    text = markdown.read_text()
    section = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.DOTALL)
    assert block, f"{markdown}: no ```bash block under {heading!r}"
    return block.group(1).splitlines()


def test_ci_runs_the_readme_setup_line_and_the_docs_show_the_same():
    readme = setup_block(ROOT / "README.md", "## Set up")
    install = setup_block(ROOT / "docs" / "install.md", "## A fresh machine")
    assert readme[0].startswith("python3 -m venv ") and 'pip install -e ".[test]"' in readme[0]
    assert "pip install torch==2.14.1 torchvision==0.29.1" in readme[0]  # the reference setup's pin
    assert install[0] == readme[0]
    ci = (ROOT / ".ci" / "run").read_text()
    extract = next(line for line in ci.splitlines() if line.startswith("SETUP_LINE="))
    found = subprocess.run(["bash", "-c", f'{extract}\nprintf %s "$SETUP_LINE"'], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    assert found == readme[0]
    assert 'eval "$SETUP_LINE"' in ci
    # nothing else is installed: CI sees what a newcomer sees
    assert [line for line in ci.splitlines() if "pip install" in line and not line.lstrip().startswith("#")] == []
    assert ci.index("ruff check .") < ci.index("python -m pytest -q")


def extra_closure(extras: dict[str, list[str]], name: str) -> set[str]:
    """The packages extra `name` installs, through the project's own extras (``mmrl[a,b]``)."""
    found: set[str] = set()
    for requirement in extras[name]:
        package = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if package == "mmrl":
            for inner in re.search(r"\[(.*?)\]", requirement).group(1).split(","):
                found |= extra_closure(extras, inner.strip())
        else:
            found.add(package)
    return found


def test_the_test_extra_brings_what_the_default_suite_uses():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    test = extra_closure(extras, "test")
    for extra in ("serve", "lint", "deepspeed"):  # served rewards and judges; CI's ruff; the ZeRO-3 tests
        assert extra_closure(extras, extra) <= test, extra
    assert {"pytest", "fastapi", "uvicorn", "openai", "ruff", "deepspeed"} <= test
