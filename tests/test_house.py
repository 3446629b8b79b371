"""The house's two rules beyond the layers (docs/architecture.md): no import circle anywhere in the
library (imports inside functions included), and small pieces: no module of `mmrl/`, `tasks/` or
`rewards/` over 300 lines and no function over 60, unless the file says why at its top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layers import imported_modules

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = [p for root in ("mmrl", "tasks", "rewards") for p in sorted((ROOT / root).rglob("*.py"))]
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 300, 60
EXCEPTION_MARK = "# over the size limits:"  # a line of its own near the top of a file, followed by the reason


def installed_name(path: Path) -> str:
    """The module's name as installed: tasks/ and rewards/ are mmrl.tasks and mmrl.rewards."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("tasks", "rewards"):
        parts.insert(0, "mmrl")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: list[Path]) -> dict[str, set[str]]:
    """module -> the library's modules it imports (an imported name that is a module counts as one)."""
    names = {installed_name(p): p for p in files}
    graph = {}
    for name, path in names.items():
        targets = set()
        for _, module in imported_modules(path):
            for prefix in ("tasks.", "rewards."):
                if module.startswith(prefix):
                    module = "mmrl." + module
            if module in names and module != name:
                targets.add(module)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle():
    found = circles(import_graph(LIBRARY))
    assert not found, "import circles (each a set of modules that import each other):\n" + "\n".join(map(str, found))


def test_the_circle_check_sees_a_circle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    probe = ROOT / "mmrl" / "core" / "_circle_probe.py"
    probe.write_text("def f():\n    from mmrl.core import _circle_probe_b\n")
    other = ROOT / "mmrl" / "core" / "_circle_probe_b.py"
    other.write_text("from mmrl.core._circle_probe import f\n")
    try:
        assert ["mmrl.core._circle_probe", "mmrl.core._circle_probe_b"] in circles(import_graph([probe, other]))
    finally:
        probe.unlink()
        other.unlink()


def size_problems(path: Path) -> list[str]:
    text = path.read_text()
    head = text.splitlines()[:30]
    if any(line.startswith(EXCEPTION_MARK) and line[len(EXCEPTION_MARK):].strip() for line in head):
        return []
    problems = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        problems.append(f"{lines} lines (at most {MAX_MODULE_LINES})")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                problems.append(f"line {node.lineno}: {node.name} is {length} lines (at most {MAX_FUNCTION_LINES})")
    return problems


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(ROOT)))
def test_modules_and_functions_are_small(path: Path):
    problems = size_problems(path)
    assert not problems, (f"{path.relative_to(ROOT)}: " + "; ".join(problems)
                          + f" (split it by concept, or say why not in a line '{EXCEPTION_MARK} REASON' at its top)")


def test_the_size_check_sees_a_long_function_and_takes_a_reason(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    long = tmp_path / "long.py"
    long.write_text(f'"""A probe."""\n\n\ndef f():\n{body}\n')
    assert size_problems(long) == ["line 4: f is 62 lines (at most 60)"]
    long.write_text(f'"""A probe."""\n{EXCEPTION_MARK} one table of constants\n\n\ndef f():\n{body}\n')
    assert size_problems(long) == []
