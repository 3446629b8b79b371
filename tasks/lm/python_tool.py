"""The built-in `python` tool: a calculator that runs the model's Python in a sandbox.

The code runs in a fresh `python -I -S` subprocess (`mmrl.sandbox`: a scratch working directory,
an empty environment, wall-time, CPU-time and memory limits) whose builtins have no `open`,
`exec`, `eval`, `compile`, `input` or `breakpoint`, whose `import` reaches only the
`ALLOWED_MODULES` (maths), and in which an audit hook refuses every file open, process start,
socket, `os` call, import and `ctypes` use once the code starts. The tool returns what the code
printed and, as a REPL does, the value of its last line when that is an expression; a refused
operation, an exception or a limit reached is a tool error the model reads.
"""


import json
import sys
import tempfile

from mmrl.sandbox import Limits, run_limited

from .tools import register_tool

ALLOWED_MODULES = ("math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "random")
PYTHON_LIMITS = Limits(timeout=5.0, memory_mb=256, file_mb=0, open_files=16)
MAX_OUTPUT = 2000  # characters of output the model reads back
MAX_CODE = 10_000  # characters of code accepted

# Runs in the child: reads the code from stdin, locks itself down, runs it.
RUNNER = r"""
import ast, builtins, sys
ALLOWED = set(__ALLOWED__)
for name in ALLOWED:
    __import__(name)
code = sys.stdin.read()
def refuse(event, args):
    if event == "import" or event == "open" or event.split(".")[0] in (
            "os", "subprocess", "socket", "shutil", "ctypes", "_posixsubprocess", "pty", "mmap", "fcntl", "gc",
            "sys", "glob", "urllib", "http", "ftplib", "smtplib", "webbrowser", "resource", "signal"):
        if event == "sys._getframe":
            return
        raise PermissionError(f"the calculator may not use {event}")
def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if name.split(".")[0] not in ALLOWED:
        raise ImportError(f"the calculator may import only {', '.join(sorted(ALLOWED))}, not {name!r}")
    return __import__(name, globals, locals, fromlist, level)
safe = {k: v for k, v in vars(builtins).items()
        if k not in ("open", "exec", "eval", "compile", "input", "breakpoint", "__import__", "help", "exit", "quit")}
safe["__import__"] = guarded_import
tree = ast.parse(code, "<tool>", "exec")
last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
body = compile(tree, "<tool>", "exec")
tail = compile(ast.Expression(last.value), "<tool>", "eval") if last is not None else None
scope = {"__builtins__": safe, "__name__": "__tool__"}
sys.addaudithook(refuse)
exec(body, scope)
if tail is not None:
    value = eval(tail, scope)
    if value is not None:
        print(repr(value))
"""


@register_tool("python")
def python(code: str) -> str:
    """Run Python code as a calculator and return what it prints (and the value of its last line).
    Only the modules math, cmath, fractions, decimal, statistics, itertools, functools and random
    can be imported; there is no file or network access.

    Args:
        code: the Python code to run
    """
    return run_python(code)


def run_python(code: str, limits: Limits = PYTHON_LIMITS) -> str:
    """What `code` printed (and its last expression's value) in the sandbox; a RuntimeError with
    the reason when it fails, is refused or runs past a limit."""
    if len(code) > MAX_CODE:
        raise RuntimeError(f"the code is longer than {MAX_CODE} characters")
    runner = RUNNER.replace("__ALLOWED__", json.dumps(list(ALLOWED_MODULES)))
    with tempfile.TemporaryDirectory(prefix="mmrl-python-") as work:
        status, out = run_limited([sys.executable, "-I", "-S", "-c", runner], work, {"LC_ALL": "C"}, limits,
                                  stdin=code.encode())
    if status is None:
        raise RuntimeError(f"the code ran past the time limit of {limits.timeout:g} s")
    if status != 0:
        raise RuntimeError(last_error(out, limits))
    return out[:MAX_OUTPUT]


def last_error(out: str, limits: Limits) -> str:
    """The exception line a failed run ended with (a memory or CPU limit named as such)."""
    lines = [line for line in out.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else "the process was killed"
    if "MemoryError" in last:
        return f"MemoryError: the code ran past the memory limit of {limits.memory_mb} MB"
    return last[:MAX_OUTPUT]
