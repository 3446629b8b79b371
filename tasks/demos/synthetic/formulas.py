"""Synthetic image-to-LaTeX: small random formulas rendered to images with matplotlib's mathtext
(no TeX needed to build the data); the policy reads the image and writes the LaTeX."""

from __future__ import annotations

import io
import random

from mmrl.registry import DATASETS

SYMBOLS = "abcxyz"


def random_formula(rng: random.Random, depth: int = 2) -> str:
    """A formula from a tiny grammar: sums, fractions, powers, square roots over letters/digits."""
    if depth == 0 or rng.random() < 0.3:
        return rng.choice(SYMBOLS + "123456789")
    a, b = random_formula(rng, depth - 1), random_formula(rng, depth - 1)
    form = rng.choice(["{a}+{b}", "{a}-{b}", "\\frac{{{a}}}{{{b}}}", "{base}^{{{b}}}", "\\sqrt{{{a}}}"])
    return form.format(a=a, b=b, base=a if len(a) == 1 else "{" + a + "}")  # braced: no double superscript


def render_formula(formula: str, dpi: int = 100):
    """A PIL image of the formula (mathtext)."""
    from matplotlib import mathtext
    from PIL import Image
    buf = io.BytesIO()
    mathtext.math_to_image(f"${formula}$", buf, dpi=dpi, format="png")
    buf.seek(0)
    with Image.open(buf) as im:
        return im.convert("RGB")


@DATASETS.register("formulas")
def formulas(n_train: int = 1000, n_eval: int = 64, depth: int = 2, dpi: int = 100, seed: int = 0):
    """Rows: {"prompt", "image", "reference": the formula's LaTeX, "target": the SFT answer};
    images rendered at `dpi` (a symbol is about dpi / 10 pixels high)."""
    rng = random.Random(seed)

    def rows(n: int) -> list[dict]:
        out = []
        for _ in range(n):
            formula = random_formula(rng, depth)
            out.append({"prompt": "Write the LaTeX of this formula.", "image": render_formula(formula, dpi),
                        "reference": formula, "target": formula})
        return out

    return {"train": rows(n_train), "eval": rows(n_eval)}



def draw_predictions(rows: list[dict], before: list[str], after: list[str], out_png) -> None:
    """Each held-out formula image with its LaTeX and the greedy outputs before and after RL."""
    from ..figures import draw_transcripts
    draw_transcripts([r["image"] for r in rows], [r["reference"] for r in rows], before, after, out_png)
