"""A benchmark's figures and standard errors (mmrl/core/bench_stats.py) against hand-written
references: the mean over prompts with the samples of a prompt averaged first, and the corpus ratio
(total edits / total words) with its linearised standard error over prompt clusters."""

import math

import numpy as np
import pytest

from mmrl.core.bench_stats import category_tables, figure_value
from mmrl.core.benchmark import Benchmark, Figure


def scored(values, metric="m", categories=None):
    """[(prompt id, k, value)] -> scored samples."""
    return [{"id": i, "k": k, "categories": (categories or {}).get(i, {}), "values": {metric: v}} for i, k, v in values]


def test_mean_figure_averages_each_prompts_samples_then_takes_the_se_over_prompts():
    data = [("a", 0, 1.0), ("a", 1, 0.0), ("b", 0, 1.0), ("b", 1, 1.0), ("c", 0, 0.0), ("c", 1, None)]
    per_prompt = np.array([0.5, 1.0, 0.0])  # c's None is left out
    got = figure_value(scored(data), Figure("m", scale=100.0))
    assert got["n"] == 3
    assert got["value"] == pytest.approx(100 * per_prompt.mean())
    assert got["se"] == pytest.approx(100 * per_prompt.std(ddof=1) / math.sqrt(3))


def test_ratio_figure_is_total_over_total_with_the_cluster_linearised_se():
    edits = [("a", 0, 3.0), ("b", 0, 0.0), ("c", 0, 5.0), ("d", 0, 1.0)]
    words = [("a", 0, 10.0), ("b", 0, 4.0), ("c", 0, 20.0), ("d", 0, 6.0)]
    samples = [{"id": e[0], "k": 0, "categories": {}, "values": {"edits": e[2], "words": w[2]}} for e, w in zip(edits, words)]
    y, x = np.array([3.0, 0.0, 5.0, 1.0]), np.array([10.0, 4.0, 20.0, 6.0])
    ratio = y.sum() / x.sum()  # 9 / 40, not the mean of the per-utterance rates
    assert ratio != pytest.approx(np.mean(y / x))
    se = math.sqrt(len(y) / (len(y) - 1) * np.sum((y - ratio * x) ** 2)) / x.sum()
    got = figure_value(samples, Figure("edits", per="words", scale=100.0))
    assert got["value"] == pytest.approx(100 * ratio) and got["se"] == pytest.approx(100 * se) and got["n"] == 4


def test_ratio_se_agrees_with_a_bootstrap_over_prompts():
    """An independent check of the formula: the bootstrap's spread over resampled prompts."""
    rng = np.random.default_rng(0)
    x = rng.integers(5, 30, size=200).astype(float)
    y = rng.binomial(x.astype(int), 0.2).astype(float)
    samples = [{"id": str(i), "k": 0, "categories": {}, "values": {"e": y[i], "w": x[i]}} for i in range(200)]
    got = figure_value(samples, Figure("e", per="w"))
    picks = rng.integers(0, 200, size=(4000, 200))
    boot = y[picks].sum(1) / x[picks].sum(1)
    assert got["se"] == pytest.approx(boot.std(), rel=0.1)


def test_one_prompt_has_se_zero_and_none_is_nan():
    assert figure_value(scored([("a", 0, 1.0)]), Figure("m")) == {"value": 1.0, "se": 0.0, "n": 1}
    empty = figure_value(scored([("a", 0, None)]), Figure("m"))
    assert math.isnan(empty["value"]) and empty["n"] == 0


def test_categories_split_the_samples():
    data = [("a", 0, 1.0), ("b", 0, 0.0), ("c", 0, 1.0)]
    cats = {"a": {"subject": "Art"}, "b": {"subject": "Art"}, "c": {"subject": "Math"}}
    tables = category_tables(scored(data, categories=cats), {"acc": Figure("m")}, ["subject"])
    assert tables["subject"]["Art"]["acc"]["value"] == pytest.approx(0.5)
    assert tables["subject"]["Math"]["acc"] == {"value": 1.0, "se": 0.0, "n": 1}


def test_a_benchmark_refuses_figures_of_unknown_metrics():
    with pytest.raises(ValueError, match="reads metric 'x'"):
        Benchmark(name="b", description="", source="s", split="test", read_rows=list, prompt=str, scorer="accuracy",
                  metrics={"m": {}}, figures={"f": Figure("x")}, headline="f", default_task="causal_lm", official="")


def test_shift_moves_the_value_not_the_se():
    """A published min-max normalisation (x - lo) / (hi - lo) as scale and shift."""
    data = [("a", 0, 0.9), ("b", 0, 0.7)]
    lo, hi = 0.2615, 1.0
    got = figure_value(scored(data), Figure("m", scale=1 / (hi - lo), shift=-lo / (hi - lo)))
    assert got["value"] == pytest.approx((0.8 - lo) / (hi - lo))
    assert got["se"] == pytest.approx(np.std([0.9, 0.7], ddof=1) / math.sqrt(2) / (hi - lo))


def test_a_combined_figure_is_the_weighted_mean_of_its_parts_and_nan_when_one_is_missing():
    from mmrl.core.bench_stats import figure_table
    samples = [{"id": i, "k": 0, "categories": {}, "values": v} for i, v in
               [("a", {"x": 1.0, "y": None}), ("b", {"x": 0.0, "y": None}), ("c", {"x": None, "y": 0.5}),
                ("d", {"x": None, "y": 0.25})]]
    figures = {"x": Figure("x"), "y": Figure("y"), "both": Figure(combine=(("x", 1.0), ("y", 0.5))),
               "with_z": Figure(combine=(("x", 1.0), ("z", 1.0))), "z": Figure("z")}
    got = figure_table(samples, figures)
    se_x, se_y = np.std([1, 0], ddof=1) / math.sqrt(2), np.std([0.5, 0.25], ddof=1) / math.sqrt(2)
    assert got["both"]["value"] == pytest.approx((0.5 * 1.0 + 0.375 * 0.5) / 1.5)
    assert got["both"]["se"] == pytest.approx(math.sqrt((se_x / 1.5) ** 2 + (0.5 * se_y / 1.5) ** 2))
    assert got["both"]["n"] == 4
    assert math.isnan(got["with_z"]["value"])  # z was never scored: no figure, not x's alone


def test_a_combined_figure_names_figures_of_metrics():
    with pytest.raises(ValueError, match="combines"):
        Benchmark(name="b", description="", source="s", split="test", read_rows=list, prompt=str, scorer="accuracy",
                  metrics={"m": {}}, figures={"f": Figure("m"), "g": Figure(combine=(("h", 1.0),))}, headline="f",
                  default_task="causal_lm", official="")
