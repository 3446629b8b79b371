"""LaTeX render reward (Table2LaTeX-RL style): a visual score between the renderings of the
completion and of the reference, and a structure score on the code, combined with weights.

visual = mean of SSIM (Wang et al. 2004; Gaussian window sigma 1.5, C1 = 0.01^2, C2 = 0.03^2) and
CW-SSIM (Sampat et al. 2009) of the two grayscale renderings, aligned top-left and padded with
white to a common size.
structure = for tables, TEDS (PubTabNet's tree edit distance over the whole table -> tr -> td tree,
spanning cells included; see `rewards.teds`), clipped at 0; for formulas, 1 - normalised token
edit distance.
``preset: table2latex_rl`` replaces all of this with Table2LaTeX-RL's two rules (format: structure
TEDS > 0.9; accuracy: CW-SSIM of 300-dpi pdflatex pages > 0.6 unless TEDS < 0.3; see
`rewards.table2latex_rl`), summed by default as its training sums them.
A snippet that does not compile, or uses a forbidden primitive, scores 0; the reasons are counted
and reported through the per-call `log_metric` (logged by the engine as ``reward/latex_render/...``).
Renders are cached in two least-recently-used caches, references and completions (a data set's
references recur every epoch, a group's samples and successive steps repeat snippets; a TeX
compile costs ~0.18 s of CPU).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, get_args

import numpy as np
from rapidfuzz.distance import Levenshtein

from mmrl.core.scoring import register_reward

from .latex_sandbox import FORBIDDEN, Render, Renderer, compile_latex, failure_reason, resolve_renderer
from .outputs import TEXT
from .table2latex_rl import Component, preset_scores
from .teds import teds
from .text import completion_text

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[^\s]")
_reference_cache: OrderedDict[tuple, Render] = OrderedDict()
_completion_cache: OrderedDict[tuple, Render] = OrderedDict()
REFERENCE_CACHE_SIZE = 4096
COMPLETION_CACHE_SIZE = 4096


def latex_tokens(code: str) -> list[str]:
    """Commands (``\\frac``), escaped symbols and single non-space characters."""
    return _TOKEN.findall(code)


def token_similarity(a: str, b: str) -> float:
    ta, tb = latex_tokens(a), latex_tokens(b)
    if not ta and not tb:
        return 1.0
    return 1.0 - Levenshtein.distance(ta, tb) / max(len(ta), len(tb))


def pad_to_common(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both images aligned top-left and padded with white (1.0) to the larger size, float64."""
    h, w = max(a.shape[0], b.shape[0]), max(a.shape[1], b.shape[1])
    pad = lambda x: np.pad(x, ((0, h - x.shape[0]), (0, w - x.shape[1])), constant_values=1.0)  # noqa: E731
    return pad(a).astype(np.float64), pad(b).astype(np.float64)


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two grayscale images in [0, 1] (Wang et al. 2004), padded to a common size."""
    from scipy.ndimage import gaussian_filter
    x, y = pad_to_common(a, b)
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    mx, my = gaussian_filter(x, 1.5), gaussian_filter(y, 1.5)
    sxx = gaussian_filter(x * x, 1.5) - mx * mx
    syy = gaussian_filter(y * y, 1.5) - my * my
    sxy = gaussian_filter(x * y, 1.5) - mx * my
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return float(np.clip(s.mean(), 0.0, 1.0))


def _gabor_bank(scales=(2.0, 4.0), orientations: int = 4) -> list[np.ndarray]:
    """Complex Gabor kernels (wavelength 4 sigma): the complex sub-bands of CW-SSIM."""
    kernels = []
    for sigma in scales:
        half = int(3 * sigma)
        yy, xx = np.mgrid[-half:half + 1, -half:half + 1].astype(np.float64)
        envelope = np.exp(-(xx ** 2 + yy ** 2) / (2 * sigma ** 2))
        for k in range(orientations):
            theta = np.pi * k / orientations
            phase = 2 * np.pi * (xx * np.cos(theta) + yy * np.sin(theta)) / (4 * sigma)
            kernel = envelope * np.exp(1j * phase)
            kernels.append(kernel - envelope * kernel.sum() / envelope.sum())  # zero mean
    return kernels


def cw_ssim(a: np.ndarray, b: np.ndarray, window: int = 7, k: float = 0.01) -> float:
    """Complex-wavelet SSIM (Sampat et al. 2009): per sub-band and local window,
    (2 |sum c1 conj(c2)| + K) / (sum |c1|^2 + sum |c2|^2 + K), averaged; insensitive to the small
    shifts and scalings two renderings of the same LaTeX show. A complex Gabor bank (2 scales x
    4 orientations) stands in for the steerable pyramid."""
    from scipy.ndimage import uniform_filter
    from scipy.signal import fftconvolve
    x, y = pad_to_common(1.0 - a, 1.0 - b)  # ink as signal, paper as zero
    scores = []
    for kernel in _gabor_bank():
        c1, c2 = fftconvolve(x, kernel, mode="same"), fftconvolve(y, kernel, mode="same")
        cross = c1 * np.conj(c2)
        num = 2 * np.abs(uniform_filter(cross.real, window) + 1j * uniform_filter(cross.imag, window)) + k
        den = uniform_filter(np.abs(c1) ** 2, window) + uniform_filter(np.abs(c2) ** 2, window) + k
        scores.append((num / den).mean())
    return float(np.clip(np.mean(scores), 0.0, 1.0))


def extract_latex(text: str) -> str:
    """The LaTeX of a completion: a fenced block's content, or the text without $ delimiters."""
    fenced = re.findall(r"```(?:latex|tex)?\s*(.*?)```", text, flags=re.DOTALL)
    code = fenced[-1] if fenced else text
    return code.strip().strip("$").strip()


def _kind(reference: str, kind: str) -> str:
    if kind != "auto":
        return kind
    return "table" if "\\begin{tabular}" in reference else "formula"


Kind = Literal["auto", "formula", "table"]
Preset = Literal["table2latex_rl"]
PRESETS = get_args(Preset)


def _remember(cache: OrderedDict, fresh: dict, used: list, size: int) -> None:
    """Add `fresh` renders to a least-recently-used `cache`, mark the `used` keys as recent, and
    keep at most `size` entries."""
    cache.update(fresh)
    for key in used:
        if key in cache:
            cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)


def _renders(codes: list[str], kinds: list[str | None], reference, renderer: str, timeout: float,
             workers: int) -> tuple[list[Render | None], list[Render | None]]:
    """(completion renders, reference renders), None where the reference is None; rendered in a
    thread pool, each distinct snippet once, through the module's caches."""
    def render(key: tuple) -> Render:
        code, code_kind, _ = key
        bad = FORBIDDEN.search(code)
        if bad:
            return Render(None, "latex", f"forbidden command {bad.group(0)}")
        return compile_latex(code, code_kind, timeout=timeout, renderer=renderer)

    def render_reference(key: tuple) -> Render:
        ref, ref_kind, _ = key
        return compile_latex(ref, ref_kind, timeout=timeout, renderer=renderer)

    keys = [None if reference[i] is None else (codes[i], kinds[i], renderer)
            for i in range(len(codes))]
    # a mathtext render never stands in for TeX: the renderer is part of the key
    ref_keys = [None if reference[i] is None else (reference[i], kinds[i], renderer) for i in range(len(codes))]
    missing = list(dict.fromkeys(k for k in keys if k is not None and k not in _completion_cache))
    missing_refs = list(dict.fromkeys(k for k in ref_keys if k is not None and k not in _reference_cache))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        fresh = dict(zip(missing, pool.map(render, missing)))
        fresh_refs = dict(zip(missing_refs, pool.map(render_reference, missing_refs)))
    candidates = [None if k is None else fresh.get(k) or _completion_cache[k] for k in keys]
    references = [None if k is None else fresh_refs.get(k) or _reference_cache[k] for k in ref_keys]
    _remember(_completion_cache, {k: r for k, r in fresh.items() if r.error != "timeout"},  # a timeout may be
              keys, COMPLETION_CACHE_SIZE)                                                  # the load, not the snippet
    _remember(_reference_cache, fresh_refs, ref_keys, REFERENCE_CACHE_SIZE)
    return candidates, references


def _blend(codes: list[str], kinds: list[str | None], reference, candidates: list[Render | None],
           references: list[Render | None], visual_weight: float, structure_weight: float,
           log_metric) -> list[float | None]:
    """Each row's weighted mean of the visual and the structure similarity (None: no reference)."""
    total = visual_weight + structure_weight
    out: list[float | None] = []
    for i, (cand, ref) in enumerate(zip(candidates, references)):
        if cand is None:
            out.append(None)
            continue
        if ref.image is None:
            raise ValueError(f"latex_render: reference {i} does not render ({ref.error}): {reference[i][:80]!r}")
        if log_metric is not None:
            log_metric(f"renderer/{cand.renderer}")
        if cand.image is None:
            if log_metric is not None:
                log_metric(f"fail/{failure_reason(cand.error)}")
            out.append(0.0)
            continue
        if kinds[i] == "table":
            structure = max(0.0, teds(codes[i], reference[i]))
        else:
            structure = token_similarity(codes[i], reference[i])
        visual = 0.5 * (ssim(cand.image, ref.image) + cw_ssim(cand.image, ref.image))
        out.append((visual_weight * visual + structure_weight * structure) / total)
    return out


@register_reward("latex_render", outputs=TEXT)
def latex_render_reward(prompts, completions, reference, kind: Kind = "auto", visual_weight: float = 0.5,
                        structure_weight: float = 0.5, timeout: float = 10.0, workers: int = 4,
                        renderer: Renderer = "auto", preset: Preset | None = None, component: Component = "sum",
                        log_metric=None, **kwargs) -> list[float | None]:
    """w_v * SSIM(render(completion), render(reference)) + w_s * structure, in [0, 1].
    `renderer`: `auto` (sandboxed TeX where installed, else mathtext), `latex` or `mathtext`.
    ``preset: table2latex_rl``: Table2LaTeX-RL's format + accuracy rewards (0, 1 or 2; needs
    pdflatex, multirow.sty and poppler's pdftoppm; `timeout` per compile); `component`: ``sum`` (default), ``format`` or ``accuracy``.
    `log_metric` counts failed compiles by reason (``fail/<reason>``) and the renderer used
    (``renderer/latex``, or ``renderer/mathtext`` on machines without TeX)."""
    if len(reference) != len(completions):
        raise ValueError(f"latex_render: column 'reference' has {len(reference)} values for "
                         f"{len(completions)} completions")
    if preset is not None:
        if preset not in PRESETS:
            raise ValueError(f"latex_render: preset={preset!r} is not one of {', '.join(PRESETS)}")
        if (kind, visual_weight, structure_weight, renderer) != ("auto", 0.5, 0.5, "auto"):
            raise ValueError(f"latex_render: preset={preset!r} follows its authors' rules; kind / visual_weight / "
                             "structure_weight / renderer do not apply")
        return preset_scores(completions, reference, component, timeout, workers,
                             log_metric or (lambda key, value=1.0: None))
    if visual_weight < 0 or structure_weight < 0 or visual_weight + structure_weight <= 0:
        raise ValueError(f"latex_render: weights ({visual_weight}, {structure_weight}) must be >= 0, not both 0")
    codes = [extract_latex(completion_text(c)) for c in completions]
    kinds = [None if r is None else _kind(r, kind) for r in reference]
    renderer = resolve_renderer(renderer)
    candidates, references = _renders(codes, kinds, reference, renderer, timeout, workers)
    return _blend(codes, kinds, reference, candidates, references, visual_weight, structure_weight, log_metric)
