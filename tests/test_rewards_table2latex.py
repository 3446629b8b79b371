"""Table2LaTeX-RL's reward rules (preset table2latex_rl) against hand-written references of their
plugin's steps: the grid, the structure TEDS, their CW-SSIM, and the format / accuracy rules."""

import shutil
import subprocess

import mmrl.rewards  # noqa: F401  (registration)
import numpy as np
import pytest
from mmrl.rewards import latex_sandbox as S
from mmrl.rewards import table2latex_rl as T

from mmrl.core.scoring import get_reward, metric_logger

ROW = r"\begin{tabular}{cccc} a & b & c & d \\ \end{tabular}"
TWO_ROWS = r"\begin{tabular}{cc}\hline a & b \\ c & d \\ \hline \end{tabular}"


def test_grid_follows_their_conversion():
    code = r"\begin{tabular}{ccc} \multirow{2}{*}{M} & \multicolumn{2}{c}{H} \\ & x & y \\ \end{tabular}"
    # rows split at \\ (the first row's text starts with the \begin line, the last holds \end),
    # multirow marks the slot below "^^", multicolumn the slot to its right "<<"; the second row's
    # empty placeholder takes the first free slot, pushing y off the grid
    grid = T.latex_grid(code)
    assert grid == [[r"\begin{tabular}{ccc} M", "H", "<<"], ["^^", "", "x"], [r"\end{tabular}", "", ""]]
    tree = T.grid_tree(grid)
    assert [[(td.colspan, td.rowspan) for td in tr.children] for tr in tree.children] == [
        [(1, 2), (2, 1)], [(1, 1), (1, 1)], [(1, 1), (1, 1), (1, 1)]]
    assert T.latex_grid("no table") is None
    assert T.latex_grid(r"\begin{tabular}{c} a") is None  # no \end{tabular}


def test_structure_teds_counts_the_table_node():
    # the row split: TED 3; TableRecognitionMetric normalises by the larger tree with its root: 7 nodes
    row, two_rows = ROW.replace(r"\\ \end", r"\end"), TWO_ROWS.replace(r"\\ \hline \end", r"\end")
    assert T.structure_teds(row, two_rows) == pytest.approx(1 - 3 / 7)
    # their split keeps the text after a final \\ as one more row ("\end{tabular}", one cell, padded
    # to the grid width): 4 + 4 cells against 2 + 2 + 2; TED 5 (split the first row: 3, drop 2 cells)
    assert T.structure_teds(ROW, TWO_ROWS) == pytest.approx(1 - 5 / 11)
    assert T.structure_teds(TWO_ROWS, TWO_ROWS.replace(" a ", " zz ")) == 1.0  # structure only
    assert T.structure_teds("plain text", TWO_ROWS) == 0.0


def reference_cw_ssim(p: np.ndarray, q: np.ndarray) -> float:
    """Their steps written out pixel by pixel in Python integers (uint8 wrap: % 256)."""
    def bands(img):
        h, w = img.shape[0] // 2 * 2, img.shape[1] // 2 * 2
        out = [[], [], [], []]
        for i in range(0, h, 2):
            for j in range(0, w, 2):
                a, b, c, d = int(img[i, j]), int(img[i, j + 1]), int(img[i + 1, j]), int(img[i + 1, j + 1])
                out[0].append(((a + b + c + d) % 256) * 0.25)
                out[1].append(((a - c) % 256) * 0.5)
                out[2].append(((a - b) % 256) * 0.5)
                out[3].append(((a - d) % 256) * 0.5)
        return out

    def ssim(x, y):
        n = len(x)
        mx, my = sum(x) / n, sum(y) / n
        vx, vy = sum((v - mx) ** 2 for v in x) / n, sum((v - my) ** 2 for v in y) / n
        if vx ** 0.5 < 1e-6 and vy ** 0.5 < 1e-6:
            return 1.0 if mx == my else 0.0
        cov = sum((a - mx) * (b - my) for a, b in zip(x, y)) / (n - 1)
        c1, c2 = 6.5025, 58.5225
        return min(1.0, max(0.0, (2 * mx * my + c1) * (2 * cov + c2) / ((mx ** 2 + my ** 2 + c1) * (vx + vy + c2))))

    return sum(ssim(x, y) for x, y in zip(bands(p), bands(q))) / 4


def test_cw_ssim_against_reference():
    rng = np.random.default_rng(0)
    page = np.full((9, 11), 255, np.uint8)
    page[2:6, 3:8] = 0  # ink
    shifted = np.roll(page, 1, axis=1)
    noisy = rng.integers(0, 256, (9, 11)).astype(np.uint8)
    for other in (page, shifted, noisy, 255 - page):
        assert T.cw_ssim(other, page) == pytest.approx(reference_cw_ssim(other, page), abs=1e-12)
    assert T.cw_ssim(page, page) == 1.0
    # a 128 + 128 sum wraps to 0 in their uint8 arithmetic
    grey = np.full((2, 2), 128, np.uint8)
    assert T._bands(grey)[0][0, 0] == 0.0
    # a page of another size is resized to the reference's first
    assert T.cw_ssim(np.full((4, 6), 255, np.uint8), np.full((8, 8), 255, np.uint8)) == 1.0


def test_format_and_accuracy_rules_with_given_pages():
    page = np.full((8, 8), 255, np.uint8)
    page[2:5, 2:6] = 0
    pages = {"same": page, "other": 255 - page, "broken": None}
    calls = []

    def render(code):
        calls.append(code)
        return pages[code.split("%")[-1]]

    near = TWO_ROWS.replace("c & d", "c & d \\\\ e & f")  # one more row: TED 3 over 13 nodes
    assert T.structure_teds(near, TWO_ROWS) == pytest.approx(1 - 3 / 13)
    assert T.format_reward(TWO_ROWS, TWO_ROWS) == 1.0 and T.format_reward(near, TWO_ROWS) == 0.0
    assert T.accuracy_reward(TWO_ROWS + "%same", TWO_ROWS + "%same", render, render) == 1.0
    assert T.accuracy_reward(near + "%same", TWO_ROWS + "%other", render, render) == 0.0  # CW-SSIM <= 0.6
    assert T.accuracy_reward(TWO_ROWS + "%broken", TWO_ROWS + "%same", render, render) == 0.0
    calls.clear()
    assert T.accuracy_reward("no table %same", TWO_ROWS + "%same", render, render) == 0.0 and calls == []  # TEDS < 0.3


def test_latex_render_preset_sums_format_and_accuracy(monkeypatch):
    page = np.full((8, 8), 255, np.uint8)
    page[1:4, 1:7] = 0
    monkeypatch.setattr(T, "render_page", lambda code, timeout=20.0: S.Render(
        None if "broken" in code else page, "latex", "! Undefined control sequence." if "broken" in code else None))
    reward = get_reward("latex_render")
    refs = [TWO_ROWS, TWO_ROWS, TWO_ROWS, None]
    comps = [TWO_ROWS, ROW, TWO_ROWS.replace(" a ", r" \textbf{broken} "), "x"]
    # identical: 1 + 1; the row split: TEDS 6/11 fails format, passes 0.3, pages equal: 0 + 1; broken render: 1 + 0
    counts: dict[str, float] = {}
    assert reward(None, comps, reference=refs, preset="table2latex_rl",
                  log_metric=metric_logger(counts)) == [2.0, 1.0, 1.0, None]
    assert counts["fail/compile"] == 1.0
    assert reward(None, comps[:2], reference=refs[:2], preset="table2latex_rl", component="format") == [1.0, 0.0]
    counts.clear()
    assert reward(None, [r"\input{x}" + TWO_ROWS], reference=[TWO_ROWS], preset="table2latex_rl",
                  component="accuracy", log_metric=metric_logger(counts)) == [0.0]  # refused before any render
    assert counts["fail/forbidden"] == 1.0
    with pytest.raises(ValueError, match="reference does not render"):
        reward(None, [TWO_ROWS], reference=[comps[2]], preset="table2latex_rl")
    with pytest.raises(ValueError, match="preset='pubtabnet'"):
        reward(None, ["x"], reference=["x"], preset="pubtabnet")
    with pytest.raises(ValueError, match="component='both'"):
        reward(None, ["x"], reference=["x"], preset="table2latex_rl", component="both")
    with pytest.raises(ValueError, match="visual_weight"):
        reward(None, ["x"], reference=["x"], preset="table2latex_rl", visual_weight=1.0)


needs_pdf = pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdftoppm") is None,
                               reason="needs pdflatex and poppler")


@needs_pdf
def test_pdf_pages_render_whole_at_the_given_dpi():
    doc = (r"\documentclass{article}" + S.PAGE_CAP
           + r"\begin{document}\begin{tabular}{cc} a & b \end{tabular}\end{document}")
    page = S.compile_pdf_page(doc, dpi=100)
    # the whole page, untrimmed: A4 or US letter as the TeX installation's default paper
    assert page.image.dtype == np.uint8 and page.image.shape in ((1170, 827), (1100, 850))
    assert page.image.min() < 128 < page.image.max()
    assert S.compile_pdf_page(doc.replace("{cc}", "{c"), dpi=100).image is None
    many = doc.replace(r"\begin{tabular}", r"\newpage x\newpage x\newpage \begin{tabular}")
    assert S.compile_pdf_page(many, dpi=50).image is not None  # page 1 only, the page cap stops TeX


@needs_pdf
@pytest.mark.skipif(shutil.which("kpsewhich") is None
                    or not subprocess.run(["kpsewhich", "multirow.sty"], capture_output=True).stdout,
                    reason="their preamble needs multirow.sty (texlive-latex-extra)")
def test_their_document_renders_at_300_dpi():
    page = T.render_page(TWO_ROWS).image
    assert page is not None and page.dtype == np.uint8 and page.shape in ((3508, 2480), (3300, 2550))  # 300 dpi
    assert get_reward("latex_render")(None, [TWO_ROWS], reference=[TWO_ROWS], preset="table2latex_rl") == [2.0]
