"""The sandboxed LaTeX render reward: the attack suite scores 0, finishes in time, touches
nothing outside its temp dir and leaves no process; identical LaTeX scores 1; a one-cell change
scores lower than the identical table."""

import subprocess
import time

import numpy as np
import pytest
from mmrl.rewards import get_reward
from mmrl.rewards.latex_render import cw_ssim, ssim, teds, token_similarity
from mmrl.rewards.latex_sandbox import compile_latex, tex_available

from mmrl.core.scoring import metric_logger

needs_tex = pytest.mark.skipif(not tex_available(), reason="latex and dvipng are not installed")
FORMULA = r"\frac{a+b}{\sqrt{c}} = x^{2}"
TABLE = r"\begin{tabular}{|c|c|}\hline a & b \\ \hline 1 & 2 \\ \hline\end{tabular}"
ATTACKS = {
    "input": r"\input{/etc/passwd}",
    "openin": r"\newread\f \openin\f=/etc/hostname \read\f to\x \x",
    "write18": r"\immediate\write18{touch OUTSIDE} x",
    "write_outside": r"\newwrite\f \immediate\openout\f=OUTSIDE \immediate\write\f{hi}\immediate\closeout\f x",
    "recursive_macro": r"\def\a{\a x}\a",
    "infinite_loop": r"\loop x \iftrue\repeat",
    "page_bomb": r"\newcount\n \n=0 \loop \ifnum\n<20000 \advance\n1 \null\newpage\repeat",
    "binary": "\x00\x01\x02\xff\xfe\x7f garbage",
    "huge": "x" * 100_000,
}


def latex_processes() -> int:
    out = subprocess.run(["ps", "-eo", "comm"], capture_output=True, text=True).stdout.split()
    return sum(name in ("latex", "pdftex", "dvipng") for name in out)


@needs_tex
def test_attacks_score_zero_in_time_and_touch_nothing(tmp_path):
    outside = tmp_path / "pwned.txt"
    reward = get_reward("latex_render")
    counts = {}
    for name, code in ATTACKS.items():
        code = code.replace("OUTSIDE", str(outside))
        t0 = time.perf_counter()
        score = reward(None, [code], reference=[FORMULA], timeout=5, log_metric=metric_logger(counts))
        assert score == [0.0], name
        assert time.perf_counter() - t0 < 8, name
        assert not outside.exists(), name
    assert latex_processes() == 0
    fails = {k: v for k, v in counts.items() if k.startswith("fail/")}
    assert sum(fails.values()) == len(ATTACKS) and fails.get("fail/forbidden", 0) >= 3


@needs_tex
def test_the_sandbox_itself_blocks_reads_and_writes(tmp_path):
    # past the reward's denylist: the compile itself must refuse absolute paths
    target = tmp_path / "written.txt"
    r = compile_latex(r"\newwrite\f \immediate\openout\f=" + str(target) + r" \immediate\write\f{x} y")
    assert r.image is None and not target.exists()
    r = compile_latex(r"\input{/etc/hostname}")
    assert r.image is None


@needs_tex
def test_identical_scores_one_and_a_changed_cell_scores_lower():
    reward = get_reward("latex_render")
    same = reward(None, [FORMULA, TABLE], reference=[FORMULA, TABLE])
    assert same == pytest.approx([1.0, 1.0])
    changed = TABLE.replace("1 & 2", "1 & 3")
    lower = reward(None, [changed], reference=[TABLE])[0]
    assert 0.5 < lower < 1.0
    assert reward(None, ["```latex\n" + FORMULA + "\n```"], reference=[FORMULA]) == pytest.approx([1.0])
    assert reward(None, [FORMULA], reference=[None]) == [None]


def test_structure_scores_by_hand():
    assert token_similarity(r"\frac{a}{b}", r"\frac{a}{c}") == pytest.approx(1 - 1 / 7)
    # TEDS (rewards.teds): one cell of two rows of two changed in one character: TED 1 over the
    # 2 rows x (1 + 2) nodes below the table node
    a = r"\begin{tabular}{cc} a & b \\ 1 & 2 \end{tabular}"
    b = r"\begin{tabular}{cc} a & b \\ 1 & 3 \end{tabular}"
    assert teds(a, b) == pytest.approx(1 - 1 / 6)
    assert teds(a, r"\begin{tabular}{cc} a & b \end{tabular}") == pytest.approx(1 - 3 / 6)  # a row: its 3 nodes


def test_ssim_properties():
    rng = np.random.default_rng(0)
    img = rng.random((20, 30)).astype(np.float32)
    assert ssim(img, img) == pytest.approx(1.0)
    assert ssim(img, 1 - img) < 0.2
    assert ssim(img[:10], img) < 1.0  # padding with white is not free


def test_bad_arguments_are_named():
    reward = get_reward("latex_render")
    with pytest.raises(ValueError, match="'reference' has 1 values for 2"):
        reward(None, ["a", "b"], reference=["a"])
    with pytest.raises(ValueError, match="kind"):
        compile_latex("x", kind="poem")


@needs_tex
def test_cw_ssim_tolerates_small_shifts_and_separates_formulas():
    a = compile_latex(r"\frac{a+b}{c}").image
    shifted = np.pad(a, ((0, 0), (2, 0)), constant_values=1.0)
    other = compile_latex(r"x^2 + y^2 = z^2").image
    assert cw_ssim(a, a) == pytest.approx(1.0)
    assert cw_ssim(a, shifted) > ssim(a, shifted) + 0.1
    assert cw_ssim(a, other) < cw_ssim(a, shifted)


def test_mathtext_fallback_without_tex(monkeypatch):
    import mmrl.rewards.latex_sandbox as sandbox
    monkeypatch.setattr(sandbox, "tex_available", lambda: False)
    r = sandbox.compile_latex(r"\frac{a}{b}")
    assert r.renderer == "mathtext" and r.image is not None and r.image.min() < 0.5
    table = sandbox.compile_latex(TABLE, kind="table")
    assert table.image is None and "TeX" in table.error
    reward = get_reward("latex_render")
    counts = {}
    assert reward(None, [FORMULA], reference=[FORMULA],  # FORMULA's TeX render is cached
                  log_metric=metric_logger(counts)) == pytest.approx([1.0])
    assert counts == {"renderer/mathtext": 1.0}
    monkeypatch.undo()
    counts = {}
    assert reward(None, [r"\frac{a}{b}"], reference=[r"\frac{a}{b}"], renderer="mathtext",
                  log_metric=metric_logger(counts)) == pytest.approx([1.0])
    assert counts == {"renderer/mathtext": 1.0}
    with pytest.raises(ValueError, match="renderer='pdf'"):
        reward(None, ["a"], reference=["a"], renderer="pdf")
    many = [f"x^{{{i}}}" for i in range(16)]  # rendered on the reward's thread pool
    assert reward(None, many, reference=many, renderer="mathtext") == pytest.approx([1.0] * 16)


def test_repeated_completions_compile_once(monkeypatch):
    import mmrl.rewards.latex_render as latex_render
    from mmrl.rewards.latex_sandbox import Render
    compiled = []

    def fake_compile(snippet, kind="formula", timeout=10.0, renderer="auto"):
        compiled.append(snippet)
        return Render(np.ones((8, 8), dtype=np.float32), "fake")

    monkeypatch.setattr(latex_render, "compile_latex", fake_compile)
    monkeypatch.setattr(latex_render, "_completion_cache", type(latex_render._completion_cache)())
    monkeypatch.setattr(latex_render, "_reference_cache", type(latex_render._reference_cache)())
    reward = get_reward("latex_render")
    ref = r"\sqrt{q}"
    first = reward(None, ["a+b", "a+b", "$a+b$", "c"], reference=[ref] * 4)
    assert first[0] == first[1] == first[2] and [s for s in compiled if s != ref] == ["a+b", "c"]
    reward(None, ["c", "d"], reference=[ref] * 2)
    assert [s for s in compiled if s != ref] == ["a+b", "c", "d"]
    monkeypatch.setattr(latex_render, "COMPLETION_CACHE_SIZE", 1)
    reward(None, ["e"], reference=[ref])
    assert list(latex_render._completion_cache) == [("e", "formula", "latex" if tex_available() else "mathtext")]
    # references are cached once each and bounded the same way
    renderer = "latex" if tex_available() else "mathtext"
    assert compiled.count(ref) == 1
    monkeypatch.setattr(latex_render, "REFERENCE_CACHE_SIZE", 1)
    reward(None, ["e", "e"], reference=[ref, r"\frac{1}{2}"])
    assert compiled.count(ref) == 1 and compiled.count(r"\frac{1}{2}") == 1
    assert list(latex_render._reference_cache) == [(r"\frac{1}{2}", "formula", renderer)]


def test_auto_renderer_warns_once_when_tex_is_missing(monkeypatch):
    """Without TeX, `auto` falls back to mathtext and says so (once per process), not silently."""
    from mmrl.rewards import latex_sandbox
    monkeypatch.setattr(latex_sandbox, "tex_available", lambda: False)
    latex_sandbox._warn_no_tex.cache_clear()
    with pytest.warns(UserWarning, match="no TeX installation found") as record:
        assert latex_sandbox.resolve_renderer("auto") == "mathtext"
        assert latex_sandbox.resolve_renderer("auto") == "mathtext"
    assert sum("no TeX" in str(w.message) for w in record) == 1
    assert latex_sandbox.resolve_renderer("mathtext") == "mathtext"
