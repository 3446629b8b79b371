"""Compile model-written LaTeX to an image inside a sandbox.

Every compile runs `latex` then `dvipng` in a fresh temporary directory that is its only working
directory, with: no shell escape (`-no-shell-escape`, `shell_escape=f`), `openin_any=p` and
`openout_any=p` (no absolute paths, no `..`, no dot files), HOME pointed at the temp dir, a
wall-time limit (the whole process group is killed), CPU-time, address-space and file-size
limits on each process, a cap on input size, and a page cap (only page 1 is rendered; a page
counter hook stops TeX after `max_pages`). A failed or killed compile returns no image and the
reason. Without TeX on the machine, formulas fall back to matplotlib's mathtext.

`FORBIDDEN` names the primitives the rewards refuse a snippet for before any compile, and
`failure_reason` sorts a failed render's error into the kinds they count.
"""

from __future__ import annotations

import functools
import io
import os
import re
import shutil
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from mmrl.sandbox import Limits, run_limited

PREAMBLE = r"""\documentclass[12pt]{article}
\usepackage{amsmath,amssymb}
\pagestyle{empty}
\AddToHook{shipout/after}{\ifnum\value{page}>%(max_pages)d \batchmode\csname @@end\endcsname\fi}
\begin{document}
"""

_MATHTEXT_LOCK = threading.Lock()
# primitives a model-written snippet may not use (file access, catcodes, a document of its own): the
# rewards refuse a snippet that names one before any compile
FORBIDDEN = re.compile(r"\\(write|openin|openout|read|input|include|immediate|special|catcode|"
                       r"usepackage|documentclass|newwrite|newread|end\{document\})", re.IGNORECASE)


@dataclass
class Render:
    """A grayscale image in [0, 1] (1 = white), or None with the reason the compile failed."""

    image: np.ndarray | None
    renderer: str
    error: str | None = None


def tex_available() -> bool:
    return shutil.which("latex") is not None and shutil.which("dvipng") is not None


def wrap_document(snippet: str, kind: str, max_pages: int) -> str:
    """A minimal document around a formula (display math) or a table (as written)."""
    body = f"\\[\n{snippet}\n\\]" if kind == "formula" else snippet
    return PREAMBLE % {"max_pages": max_pages} + body + "\n\\end{document}\n"


def _run(cmd: list[str], cwd: str, timeout: float, memory_mb: int, file_mb: int) -> tuple[int | None, str]:
    """Run TeX's `cmd` in `cwd` under `mmrl.sandbox`'s limits, with TeX's file-access settings."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cwd, "TEXMFOUTPUT": cwd,
           "openin_any": "p", "openout_any": "p", "shell_escape": "f", "TEXMFVAR": cwd, "TEXMFCONFIG": cwd,
           "LC_ALL": "C"}
    return run_limited(cmd, cwd, env, Limits(timeout=timeout, memory_mb=memory_mb, file_mb=file_mb))


Renderer = Literal["auto", "latex", "mathtext"]


def resolve_renderer(renderer: Renderer = "auto") -> str:
    """`auto`: `latex` where TeX is installed, else `mathtext`; `latex` or `mathtext` as asked."""
    if renderer not in get_args(Renderer):
        raise ValueError(f"latex renderer={renderer!r} is not one of {', '.join(get_args(Renderer))}")
    if renderer == "auto":
        if tex_available():
            return "latex"
        _warn_no_tex()
        return "mathtext"
    return renderer


@functools.cache
def _warn_no_tex() -> None:
    """Say once per process that `auto` fell back to mathtext, and how to install TeX."""
    warnings.warn("latex_render: no TeX installation found (latex, dvipng); rendering formulas "
                  "with matplotlib's mathtext instead. Install texlive-latex-base "
                  "texlive-latex-recommended dvipng poppler-utils for TeX renders.", stacklevel=3)


def compile_latex(snippet: str, kind: str = "formula", timeout: float = 10.0, memory_mb: int = 1024,
                  max_bytes: int = 20_000, max_pages: int = 1, dpi: int = 150, renderer: str = "auto") -> Render:
    """Render `snippet` (a formula or a tabular) to a grayscale image, sandboxed; `renderer` as in
    `resolve_renderer` (`mathtext` is a Python parser with no file access: formulas only, ~15x
    less CPU than a TeX compile: 0.012 s against 0.18 s here)."""
    if kind not in ("formula", "table"):
        raise ValueError(f"latex kind={kind!r} is not one of formula, table")
    renderer = resolve_renderer(renderer)
    if len(snippet.encode(errors="replace")) > max_bytes:
        return Render(None, "latex", f"input larger than {max_bytes} bytes")
    if "\x00" in snippet or not snippet.isprintable() and any(ord(c) < 9 for c in snippet):
        return Render(None, "latex", "binary input")
    if renderer == "mathtext":
        return _mathtext(snippet, kind, dpi)
    if not tex_available():
        return Render(None, "latex", "TeX (latex and dvipng) is not installed")
    with tempfile.TemporaryDirectory(prefix="mmrl-latex-") as work:
        with open(os.path.join(work, "doc.tex"), "w") as f:
            f.write(wrap_document(snippet, kind, max_pages))
        code, log = _run(["latex", "-no-shell-escape", "-interaction=nonstopmode", "-halt-on-error",
                          "doc.tex"], work, timeout, memory_mb, file_mb=32)
        if code != 0 or not os.path.exists(os.path.join(work, "doc.dvi")):
            return Render(None, "latex", "timeout" if code is None else _first_error(log))
        code, log = _run(["dvipng", "-q", "-T", "tight", "-D", str(dpi), "-bg", "White", "-gray",
                          "-p", "1", "-l", "1", "-o", "page.png", "doc.dvi"], work, timeout, memory_mb, file_mb=32)
        png = os.path.join(work, "page.png")
        if code != 0 or not os.path.exists(png):
            return Render(None, "latex", "timeout" if code is None else "dvipng failed")
        return Render(_load_gray(png), "latex")


def compile_pdf_page(document: str, dpi: int = 300, timeout: float = 20.0, memory_mb: int = 1024,
                     max_bytes: int = 40_000) -> Render:
    """A whole LaTeX `document` compiled with `pdflatex` and its first page rasterised at `dpi`
    with poppler's `pdftoppm` (what pdf2image runs), in colour then converted to grayscale by PIL,
    the page untrimmed; sandboxed as `compile_latex`. The caller adds no page cap: `document`
    should carry its own (see `PAGE_CAP`)."""
    if len(document.encode(errors="replace")) > max_bytes:
        return Render(None, "latex", f"input larger than {max_bytes} bytes")
    if shutil.which("pdflatex") is None or shutil.which("pdftoppm") is None:
        return Render(None, "latex", "pdflatex and pdftoppm (poppler) are not installed")
    with tempfile.TemporaryDirectory(prefix="mmrl-latex-") as work:
        with open(os.path.join(work, "doc.tex"), "w") as f:
            f.write(document)
        code, log = _run(["pdflatex", "-no-shell-escape", "-interaction=nonstopmode", "doc.tex"], work, timeout,
                         memory_mb, file_mb=32)
        if code is None or not os.path.exists(os.path.join(work, "doc.pdf")):
            return Render(None, "latex", "timeout" if code is None else _first_error(log))
        code, _ = _run(["pdftoppm", "-r", str(dpi), "-f", "1", "-l", "1", "-singlefile", "doc.pdf", "page"], work,
                       timeout, memory_mb, file_mb=64)
        ppm = os.path.join(work, "page.ppm")
        if code != 0 or not os.path.exists(ppm):
            return Render(None, "latex", "timeout" if code is None else "pdftoppm failed")
        from PIL import Image
        with Image.open(ppm) as im:
            return Render(np.asarray(im.convert("L")), "latex")  # uint8, 0..255


PAGE_CAP = r"\AddToHook{shipout/after}{\ifnum\value{page}>1 \batchmode\csname @@end\endcsname\fi}"


def failure_reason(error: str) -> str:
    """The kind of a failed render's `Render.error`, as the rewards count it (``fail/<kind>``):
    forbidden, timeout, capacity, input or compile."""
    if error.startswith("forbidden"):
        return "forbidden"
    if error == "timeout":
        return "timeout"
    if "capacity exceeded" in error:
        return "capacity"
    if "larger than" in error or error == "binary input":
        return "input"
    return "compile"


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if line.startswith("!"):
            return line[:200]
    return "latex failed"


def _load_gray(path_or_buffer) -> np.ndarray:
    from PIL import Image
    with Image.open(path_or_buffer) as im:
        return np.asarray(im.convert("L"), dtype=np.float32) / 255.0


def _mathtext(snippet: str, kind: str, dpi: int) -> Render:
    """matplotlib's mathtext, for formulas on machines without TeX."""
    if kind != "formula":
        return Render(None, "mathtext", "tables need TeX (latex and dvipng)")
    from matplotlib import mathtext
    buf = io.BytesIO()
    try:
        with _MATHTEXT_LOCK:  # matplotlib's parser is not thread-safe (the reward renders on a pool)
            mathtext.math_to_image(f"${snippet}$", buf, dpi=dpi, format="png")
    except Exception as e:  # mathtext's parser raises ValueError and others on bad input
        return Render(None, "mathtext", f"mathtext: {str(e).splitlines()[0][:200]}")
    buf.seek(0)
    return Render(_load_gray(buf), "mathtext")
