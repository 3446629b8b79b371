"""A benchmark's figures and their standard errors from per-sample scores.

A scored sample is ``{"id": prompt id, "k": sample index, "categories": {column: value},
"values": {metric: float or None}}`` (None: the metric does not apply to it). The samples of one
prompt are correlated, so every standard error is taken over prompts:

  mean figure   each prompt's mean over its samples m_p; value = mean_p m_p,
                SE = std_p(m_p) / sqrt(P) (std with P - 1)
  ratio figure  sums per prompt y_p = sum metric, x_p = sum per; value R = sum_p y_p / sum_p x_p,
                SE = sqrt(P / (P - 1) * sum_p (y_p - R x_p)^2) / sum_p x_p   (the linearised
                ratio estimator's SE over prompt clusters; corpus WER = total edits / total words)

Both are scaled by the figure's `scale` and moved by its `shift`. A figure with one prompt has SE 0;
one with none is NaN.

  combined figure  value = sum_f w_f v_f / sum_f w_f over its parts (other figures, scaled),
                   SE = sqrt(sum_f (w_f / sum w)^2 se_f^2) (the parts taken as independent: exact
                   for parts over disjoint prompts, as GenEval's tasks; an approximation where
                   parts score the same samples, as VBench's dimensions); n = the prompts scored in
                   any part. NaN when any part is NaN.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from mmrl.core.benchmark import Benchmark, Figure

Scored = Mapping[str, Any]


def _by_prompt(scored: Iterable[Scored], metric: str) -> dict[str, list[float]]:
    """prompt id -> the metric's values of its samples (None left out)."""
    out: dict[str, list[float]] = {}
    for s in scored:
        value = s["values"].get(metric)
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            out.setdefault(str(s["id"]), []).append(float(value))
    return out


def _mean_figure(scored: Sequence[Scored], figure: Figure) -> tuple[float, float, int]:
    means = [sum(v) / len(v) for v in _by_prompt(scored, figure.metric).values()]
    if not means:
        return math.nan, math.nan, 0
    value = sum(means) / len(means)
    if len(means) == 1:
        return value, 0.0, 1
    var = sum((m - value) ** 2 for m in means) / (len(means) - 1)
    return value, math.sqrt(var / len(means)), len(means)


def _ratio_figure(scored: Sequence[Scored], figure: Figure) -> tuple[float, float, int]:
    tops, bottoms = _by_prompt(scored, figure.metric), _by_prompt(scored, figure.per)
    ids = [i for i in tops if i in bottoms]
    y = [sum(tops[i]) for i in ids]
    x = [sum(bottoms[i]) for i in ids]
    total = sum(x)
    if not ids or total == 0:
        return math.nan, math.nan, len(ids)
    ratio = sum(y) / total
    if len(ids) == 1:
        return ratio, 0.0, 1
    spread = sum((yi - ratio * xi) ** 2 for yi, xi in zip(y, x))
    return ratio, math.sqrt(len(ids) / (len(ids) - 1) * spread) / total, len(ids)


def figure_value(scored: Sequence[Scored], figure: Figure) -> dict[str, float]:
    """{"value", "se", "n" (prompts)} of a figure of a metric over the scored samples (module docstring)."""
    value, se, n = (_ratio_figure if figure.per else _mean_figure)(scored, figure)
    return {"value": value * figure.scale + figure.shift, "se": se * abs(figure.scale), "n": n}


def combined_value(scored: Sequence[Scored], figure: Figure, parts: Mapping[str, dict[str, float]],
                   metrics: Mapping[str, str]) -> dict[str, float]:
    """The weighted mean of `parts` (figure name -> `figure_value`) that `figure.combine` names;
    `metrics`: each part's metric, whose prompts count in n (module docstring)."""
    total = sum(w for _, w in figure.combine)
    chosen = [(parts[name], w / total) for name, w in figure.combine]
    ids = {i for name, _ in figure.combine for i in _by_prompt(scored, metrics[name])}
    if any(math.isnan(p["value"]) for p, _ in chosen):
        return {"value": math.nan, "se": math.nan, "n": len(ids)}
    value = sum(p["value"] * w for p, w in chosen)
    return {"value": value, "se": math.sqrt(sum((w * p["se"]) ** 2 for p, w in chosen)), "n": len(ids)}


def figure_table(scored: Sequence[Scored], figures: Mapping[str, Figure]) -> dict[str, dict[str, float]]:
    """figure name -> `figure_value`, then the combined figures from those (in the figures' order)."""
    plain = {name: figure_value(scored, f) for name, f in figures.items() if not f.combine}
    metrics = {name: f.metric for name, f in figures.items() if not f.combine}
    return {name: plain[name] if not f.combine else combined_value(scored, f, plain, metrics)
            for name, f in figures.items()}


def category_tables(scored: Sequence[Scored], figures: Mapping[str, Figure],
                    categories: Sequence[str]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """column -> category value -> `figure_table` of that category's samples (categories sorted)."""
    out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for column in categories:
        groups: dict[str, list[Scored]] = {}
        for s in scored:
            value = s["categories"].get(column)
            if value is not None:
                groups.setdefault(str(value), []).append(s)
        out[column] = {value: figure_table(groups[value], figures) for value in sorted(groups)}
    return out


def bench_figures(bench: Benchmark, scored: Sequence[Scored]) -> dict[str, Any]:
    """{"headline": {"figure", "value", "se", "n"}, "figures": `figure_table`, "categories":
    `category_tables`} of a benchmark's scored samples."""
    figures = figure_table(scored, bench.figures)
    return {"headline": {"figure": bench.headline, **figures[bench.headline]}, "figures": figures,
            "categories": category_tables(scored, bench.figures, bench.categories)}
