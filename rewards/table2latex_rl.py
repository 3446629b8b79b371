"""Table2LaTeX-RL's reward rules (Ling et al., NeurIPS 2025; github.com/newLLing/Table2LaTeX-RL,
examples/train/grpo/plugin/plugin.py), for ``latex_render`` with ``preset: table2latex_rl``.

- format: 1 when the structure-only TEDS of completion and reference exceeds 0.9, else 0.
- accuracy: 0 when that TEDS is below 0.3; otherwise both are compiled with `pdflatex` in their
  document (``\\resizebox{0.5\\columnwidth}{!}{...}`` inside a centred ``table`` of an
  ``article``), page 1 rasterised at 300 dpi, and the reward is 1 when the CW-SSIM of the two
  pages exceeds 0.6 (0 when either does not compile).

Their structure TEDS goes LaTeX -> grid -> HTML -> TableRecognitionMetric's TEDS; `latex_grid`
and `grid_tree` follow their conversion step for step (comments and ``\\\\[..]`` removed,
rules dropped, rows split at ``\\\\``, cells at unescaped ``&``, ``\\multirow`` then
``\\multicolumn`` read by their first-brace patterns, cells placed on a grid that skips taken
slots and shifts later rows by the smallest rowspan of a row minus 1), and the score normalises
by the larger tree counting the ``table`` node, as TableRecognitionMetric does. One case is not
followed: a row none of whose cells finds a free slot, which in their code appends 9999 empty
rows to the grid, scores 0 here.

Their CW-SSIM is not Sampat's steerable-pyramid index but a one-level Haar-like split of each
8-bit page into four bands, a = (p00 + p01 + p10 + p11) / 4, h = (p00 - p10) / 2,
v = (p00 - p01) / 2, d = (p00 - p11) / 2, the sums and differences taken in uint8 arithmetic
(wrapping modulo 256, as numpy does on their uint8 arrays), then one global SSIM per band
(population variances, sample covariance, C1 = (0.01 x 255)^2, C2 = (0.03 x 255)^2, clipped to
[0, 1]; two constant bands: 1 if their means agree else 0), averaged over the four bands; the
completion's page is first resized to the reference's (PIL's default filter). Their GPU path
(used when CUDA is present) takes the variances unbiased and the covariance biased: a relative
difference of 1/n, n ~ 2 million band pixels at 300 dpi.

`preset_scores` applies both rules to a batch of completions, as ``latex_render`` scores them under
the preset (sandboxed renders on a thread pool, each distinct text rendered once per call).
"""

from __future__ import annotations

import functools
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, get_args

import numpy as np

from .latex_sandbox import FORBIDDEN, PAGE_CAP, Render, compile_pdf_page, failure_reason
from .teds import Node, tree_edit_distance
from .text import completion_text

FORMAT_ABOVE, STRUCTURE_BELOW, CW_SSIM_ABOVE, DPI = 0.9, 0.3, 0.6, 300

DOCUMENT = (r"\documentclass[standalone]{article}\usepackage[utf8]{inputenc}\usepackage[T1]{fontenc}"
            r"\usepackage{amsmath, amsthm, amssymb, graphicx, geometry, array,xcolor}"
            r"\usepackage{booktabs, multirow, natbib, tabularx, multicol, bm}" + "\n" + PAGE_CAP + "\n"
            r"\begin{document}\begin{table}\centering\resizebox{0.5\columnwidth}{!}{%s}\end{table}\end{document}")

_RULES = re.compile(r"\\cmidrule{\s*}|\\cdashline\{[0-9]+(-[0-9]+)?\}\s*|"
                    r"\\cmidrule\((?:lr|r|l)?\)\{[0-9]+\-[0-9]+\}\s*|"
                    r"\\arrayrulecolor{.*?}\s*|\\caption{.*?}\s*|\\centering\s*|\\hline\s*|\\cline{.*?}\s*|"
                    r"\\toprule\s*|\\midrule\s*|\\bottomrule\s*")
_TABULAR = re.compile(r"\\begin\{tabular[x]*\*?\}.*?\\end\{tabular[x]*\*?\}", re.DOTALL)
_SPANS = (("rowspan", re.compile(r"\\multirow{(\d+)}{.*?}{(.*?)}")),
          ("colspan", re.compile(r"\\multicolumn{(\d+)}{.*?}{(.*?)}")))
_LEFT, _UP, _CORNER = "<<", "^^", ".."
_NO_SLOT = 10000  # their sentinel for "no cell of this row was placed"


class _Degenerate(Exception):
    """A row with no free slot (their grid would grow by 9999 empty rows)."""


def _cells(row: str) -> list[dict]:
    cells = []
    for raw in re.split(r"(?<!\\)&", row):
        cell = {"content": raw.strip(" \n"), "rowspan": 1, "colspan": 1}
        for key, pattern in _SPANS:
            m = pattern.search(cell["content"])
            if m:
                cell[key] = int(m.group(1))
                cell["content"] = cell["content"].replace(m.group(0), m.group(2).strip(), 1).strip()
        cells.append(cell)
    return cells


def latex_grid(latex: str) -> list[list[str]] | None:
    """Their table grid: cell texts, with "<<" (covered from the left), "^^" (from above);
    None when there is no complete tabular or no row."""
    latex = re.sub(r"(?<!\\)%.*$", "", latex, flags=re.MULTILINE)
    latex = re.sub(r"(?<!\\)\\\\\[.*?\]", "", latex, flags=re.DOTALL)
    latex = latex.replace("\n", "").replace("\t", "")
    if not re.search(r"\\end{tabular[x]*\*?\}", latex):
        return None
    found = _TABULAR.findall(latex)
    if not found:
        return None
    body = _RULES.sub("", found[0]).replace("\\tabularnewline", "\\\\")
    body = re.sub(r"\n\s*\n", "\n", body).strip(" \n")
    rows = [_cells(r) for r in body.strip(" \n").split("\\\\") if r.strip()]
    if not rows:
        return None
    width = max(sum(c["colspan"] for c in r) for r in rows)
    grid: list[list[str | None]] = [[None] * width for _ in rows]
    shift = 0
    for index, row in enumerate(rows):
        r0 = index + shift
        while r0 >= len(grid):
            grid.append([None] * width)
        col, smallest_rowspan = 0, _NO_SLOT
        for cell in row:
            while col < width and grid[r0][col] is not None:
                col += 1
            if col >= width:
                break
            smallest_rowspan = min(smallest_rowspan, cell["rowspan"])
            grid[r0][col] = cell["content"]
            for dr in range(cell["rowspan"]):
                for dc in range(cell["colspan"]):
                    if dr == 0 and dc == 0:
                        continue
                    if r0 + dr >= len(grid):
                        grid.append([None] * width)
                    if col + dc < width:
                        grid[r0 + dr][col + dc] = _UP if dr > 0 else _LEFT
            col += cell["colspan"]
        if smallest_rowspan == _NO_SLOT:
            raise _Degenerate
        shift += smallest_rowspan - 1
    return [["" if c is None else c for c in r] for r in grid]


def grid_tree(grid: list[list[str]]) -> Node:
    """The structure-only table -> tr -> td tree of their HTML: a td for each grid slot that is
    not covered, its rowspan / colspan the runs of "^^" below / "<<" to its right."""
    table = Node("table")
    for r, row in enumerate(grid):
        tr = Node("tr")
        for c, text in enumerate(row):
            if text in (_LEFT, _UP, _CORNER):
                continue
            rowspan = colspan = 1
            while r + rowspan < len(grid) and grid[r + rowspan][c] == _UP:
                rowspan += 1
            while c + colspan < len(row) and row[c + colspan] == _LEFT:
                colspan += 1
            tr.children.append(Node("td", colspan, rowspan))
        table.children.append(tr)
    return table


@functools.lru_cache(maxsize=4096)  # the format and accuracy rules both ask for it
def structure_teds(candidate: str, reference: str) -> float:
    """Their structure-only TEDS: 1 - TED / max(|T1|, |T2|), |T| counting the table node;
    0 when either side has no table."""
    try:
        a, b = latex_grid(candidate), latex_grid(reference)
    except _Degenerate:
        return 0.0
    if a is None or b is None:
        return 0.0
    ta, tb = grid_tree(a), grid_tree(b)
    return 1.0 - tree_edit_distance(ta, tb) / max(ta.size(), tb.size())


# -- CW-SSIM as their code computes it -----------------------------------------------------------

def _bands(page: np.ndarray) -> list[np.ndarray]:
    h, w = page.shape[0] // 2 * 2, page.shape[1] // 2 * 2
    p = page[:h, :w].astype(np.uint8)
    p00, p01, p10, p11 = p[0::2, 0::2], p[0::2, 1::2], p[1::2, 0::2], p[1::2, 1::2]
    return [(p00 + p01 + p10 + p11) * 0.25, (p00 - p10) * 0.5, (p00 - p01) * 0.5, (p00 - p11) * 0.5]


def _global_ssim(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.ravel(), y.ravel()
    if np.std(x) < 1e-6 and np.std(y) < 1e-6:
        return 1.0 if np.mean(x) == np.mean(y) else 0.0
    c1, c2 = (0.01 * 255.0) ** 2, (0.03 * 255.0) ** 2
    mx, my = np.mean(x), np.mean(y)
    cov = np.sum((x - mx) * (y - my)) / (x.size - 1)
    value = (2 * mx * my + c1) * (2 * cov + c2) / ((mx ** 2 + my ** 2 + c1) * (np.var(x) + np.var(y) + c2))
    return float(min(1.0, max(0.0, value)))


def cw_ssim(candidate: np.ndarray, reference: np.ndarray) -> float:
    """Their CW-SSIM of two 8-bit grayscale pages (uint8 arrays); see the module docstring."""
    if candidate.shape != reference.shape:
        from PIL import Image
        candidate = np.asarray(Image.fromarray(candidate.astype(np.uint8)).resize(reference.shape[::-1]))
    return float(np.mean([_global_ssim(a, b) for a, b in zip(_bands(candidate), _bands(reference))]))


def render_page(code: str, timeout: float = 20.0) -> Render:
    """Page 1 of their document around `code`, 300 dpi, uint8 grayscale (no image, and the
    reason, if it does not compile)."""
    return compile_pdf_page(DOCUMENT % code, dpi=DPI, timeout=timeout)


def format_reward(candidate: str, reference: str) -> float:
    return 1.0 if structure_teds(candidate, reference) > FORMAT_ABOVE else 0.0


def accuracy_reward(candidate: str, reference: str, render_candidate, render_reference) -> float:
    """`render_*(code)`: the page as a uint8 array, or None when it does not compile."""
    if structure_teds(candidate, reference) < STRUCTURE_BELOW:
        return 0.0
    a, b = render_candidate(candidate), render_reference(reference)
    if a is None or b is None:
        return 0.0
    return 1.0 if cw_ssim(a, b) > CW_SSIM_ABOVE else 0.0


# -- the preset: both rules over a batch ---------------------------------------------------------

Component = Literal["sum", "format", "accuracy"]
COMPONENTS = get_args(Component)


def preset_scores(completions, reference, component: str, timeout: float, workers: int,
                  log_metric) -> list[float | None]:
    """Table2LaTeX-RL's format and accuracy rewards on the raw completion text (as its code
    reads it), `component` both summed or one of them; sandboxed renders, cached by text. A
    reference that does not compile is an error (their code would score every completion 0)."""
    if component not in COMPONENTS:
        raise ValueError(f"latex_render: component={component!r} is not one of {', '.join(COMPONENTS)}")
    codes = [completion_text(c) for c in completions]
    pages: dict[str, Render] = {}

    def page(code: str) -> Render:
        if code not in pages:
            bad = FORBIDDEN.search(code)
            pages[code] = (Render(None, "latex", f"forbidden command {bad.group(0)}") if bad
                           else render_page(code, timeout))
        return pages[code]

    def render_candidate(code: str) -> np.ndarray | None:
        result = page(code)
        log_metric(f"renderer/{result.renderer}")
        if result.image is None:
            log_metric(f"fail/{failure_reason(result.error)}")
        return result.image

    def render_reference(code: str) -> np.ndarray:
        result = page(code)
        if result.image is None:
            raise ValueError(f"latex_render: a reference does not render with preset table2latex_rl "
                             f"({result.error}): {code[:80]!r}")
        return result.image

    def score(i: int) -> float | None:
        if reference[i] is None:
            return None
        fmt = format_reward(codes[i], reference[i]) if component != "accuracy" else 0.0
        acc = (accuracy_reward(codes[i], reference[i], render_candidate, render_reference)
               if component != "format" else 0.0)
        return fmt + acc

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(score, range(len(codes))))
