"""The benchmark contract: a data source, a generation setting and a scorer, as a benchmark's
published protocol has them (docs/bench.md). Benchmarks are registered in `mmrl.registry.BENCHMARKS`
by the plugins (`tasks/bench/`); the engine never names one.

A benchmark's rows are dicts with a unique ``id`` (str) and whatever its prompt and scorer read (the
reference answer, boxes, choices, media). Its scorer is a registered reward, called once per metric
with that metric's arguments, so `mmrl serve-reward SCORER` serves a whole benchmark and a judge is
reached through the served-reward transport. A `Figure` is what a summary reports: the mean of a
per-sample metric, or a ratio of two sums (corpus WER: edits / reference words).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

Row = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """A summary figure: the mean of the per-sample `metric` over prompts (each prompt's samples
    averaged first), or with `per` the ratio sum(metric) / sum(per) over every sample; times
    `scale` (100: a percentage), plus `shift` (a published normalisation (x - lo) / (hi - lo) is
    scale 1 / (hi - lo), shift -lo / (hi - lo)). With `combine` ((figure name, weight), ...) it is
    instead the weighted mean of those other figures, sum w_f value_f / sum w_f (GenEval's mean
    over its six tasks, VBench's quality score): NaN when any of them is (a part never scored is
    not left out of the weights silently); `metric` is then None."""

    metric: str | None = None
    per: str | None = None
    scale: float = 1.0
    higher_is_better: bool = True
    shift: float = 0.0
    combine: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Benchmark:
    """One benchmark as published.

    name: the registry name. description: one line (the benchmark, its split, what it measures).
    source / subset / split: where the rows come from by default (a Hugging Face hub data set read
    through `datasets.load_dataset`); a local copy in the same format replaces it (``--data``).
    read_rows(source_rows, options) -> rows: the source's rows as the benchmark's rows (each with a
    unique ``id``), in source order; a row it cannot use is a ValueError naming the row and field.
    prompt(row, options): what the policy is given for a row (its ``prompt`` column).
    scorer: a registered reward; metrics: metric name -> the scorer's arguments for that metric;
    figures: figure name -> `Figure`; headline: the figure papers report. categories: row columns
    whose values the figures are also reported per (subject, task, difficulty).
    default_task: the adapter (`task:`) a bench of a bare model id uses. policy: task -> the
    protocol's settings of that adapter's ``policy:`` section (generation length, temperature).
    greedy / samples: decoding and samples per prompt. options: the protocol's settings a user may
    change (``--option KEY=VALUE``), with their defaults; resolve_options(options, policy) fills
    the ones that depend on the loaded model (a box frame). official: what of the protocol is the
    maintainers' code or package and what is mmrl's (written in every summary).
    """

    name: str
    description: str
    source: str
    split: str
    read_rows: Callable[[Sequence[Row], Mapping[str, Any]], list[Row]]
    prompt: Callable[[Row, Mapping[str, Any]], Any]
    scorer: str
    metrics: Mapping[str, Mapping[str, Any]]
    figures: Mapping[str, Figure]
    headline: str
    default_task: str
    official: str
    subset: str | None = None
    categories: tuple[str, ...] = ()
    policy: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    greedy: bool = True
    samples: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    resolve_options: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        if self.headline not in self.figures:
            raise ValueError(f"benchmark {self.name!r}: headline {self.headline!r} is not one of its figures")
        for name, figure in self.figures.items():
            if figure.combine:
                parts = [part for part, _ in figure.combine]
                unknown = [p for p in parts if p not in self.figures or self.figures[p].combine]
                if unknown or figure.metric is not None:
                    raise ValueError(f"benchmark {self.name!r}: figure {name!r} combines {unknown or parts}, which "
                                     "must be other figures of metrics (and names no metric itself)")
                continue
            if figure.metric is None:
                raise ValueError(f"benchmark {self.name!r}: figure {name!r} has neither a metric nor parts to combine")
            for metric in (figure.metric, figure.per):
                if metric is not None and metric not in self.metrics:
                    raise ValueError(f"benchmark {self.name!r}: figure {name!r} reads metric {metric!r}, "
                                     f"which is not one of {sorted(self.metrics)}")

    def with_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """The options with `given` over the defaults; an unknown one is a ValueError naming the known."""
        unknown = sorted(set(given) - set(self.options))
        if unknown:
            raise ValueError(f"benchmark {self.name!r} has no option {unknown[0]!r}; its options: "
                             f"{', '.join(sorted(self.options)) or 'none'}")
        return {**self.options, **given}
