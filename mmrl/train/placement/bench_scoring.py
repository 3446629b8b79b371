"""Where a benchmark's scorer runs: in this process, bound to each metric's arguments, or by its
server (``--scorer-url``: `mmrl serve-reward SCORER`, or an OpenAI-compatible server for a judge),
through the same transport as a served reward (`mmrl.serving.remote_reward`)."""

from __future__ import annotations

from mmrl.config.remote import ClientSettings
from mmrl.config.sections import RewardSpec
from mmrl.core.benchmark import Benchmark
from mmrl.core.scoring import RewardFn, bind_reward
from mmrl.serving.remote_reward import served_reward


def bench_metric_fns(bench: Benchmark, scorer_url: str | list[str] | None = None,
                     client: ClientSettings | None = None) -> dict[str, RewardFn]:
    """metric -> the benchmark's scorer with that metric's arguments, in process or at `scorer_url`."""
    if not scorer_url:
        return {metric: bind_reward(bench.scorer, dict(args)) for metric, args in bench.metrics.items()}
    return {metric: served_reward(bench.scorer, RewardSpec(args=dict(args), url=scorer_url,
                                                           client=client or ClientSettings()))
            for metric, args in bench.metrics.items()}
