"""What `rollout.mode` (sync, one_step_off, async) and `scoring.where` can do with the rest of a
recipe, checked with the recipe before anything loads (docs/async.md)."""

from __future__ import annotations

from mmrl.config.sections import TrainConfig
from mmrl.registry import ADAPTERS
from mmrl.serving.remote_reward import is_served


def rollout_mode_problems(cfg: TrainConfig, num_processes: int) -> list[str]:
    """What `rollout.mode` and its settings cannot do with the rest of the recipe."""
    ro = cfg.rollout
    problems = []
    if ro.mode != "async":
        problems += [f"rollout.{name}={value!r} is async's (rollout.mode={ro.mode})"
                     for name, value, default in (("weights_every", ro.weights_every, 1),
                                                  ("stale_rows", ro.stale_rows, "drop")) if value != default]
    if ro.mode == "sync":
        if cfg.scoring.where == "worker":
            problems.append("scoring.where=worker with rollout.mode=sync (there is no rollout worker: the "
                            "trainer scores)")
        return problems
    if ro.mode == "one_step_off" and ro.max_staleness not in (0, 1):
        problems.append(f"rollout.max_staleness={ro.max_staleness}: one_step_off is 0 or 1 steps behind "
                        "(rollout.mode=async takes more)")
    if ro.max_staleness < 0:
        problems.append(f"rollout.max_staleness={ro.max_staleness} must be 0 or more")
    if ro.weights_every < 1:
        problems.append(f"rollout.weights_every={ro.weights_every} must be 1 or more")
    if ro.stale_rows == "keep" and cfg.algorithm.rollout_correction == "none":
        problems.append("rollout.stale_rows=keep with algorithm.rollout_correction=none (kept stale rows are "
                        "weighted by tis or mis)")
    mode = f"rollout.mode={ro.mode}"
    workers = [name for name in ADAPTERS.names() if ADAPTERS.get(name).runs_in_rollout_worker]
    adapter = ADAPTERS.get(cfg.task) if cfg.task in ADAPTERS else None
    policy_problem = adapter.rollout_worker_problem(cfg.policy) if cfg.task in workers else None
    needs = {"task": (cfg.task in workers, f"task={cfg.task!r} (the rollout worker runs {', '.join(workers)})"),
             "policy": (policy_problem is None, policy_problem),
             "processes": (num_processes == 1, f"{num_processes} processes (the rollout worker serves one)"),
             "dynamic": (not cfg.sampling.dynamic, "sampling.dynamic=true (a redraw waits for the rewards)"),
             "stages": (not cfg.stages, "stages (a stage may change what the worker generates)"),
             "eval": (not (cfg.eval.every and cfg.policy.get("rollout_engine") == "vllm"),
                      f"eval.every={cfg.eval.every} and policy.rollout_engine=vllm (an evaluation samples in the "
                      "trainer's process, which builds no vLLM engine; evaluate the checkpoints with mmrl eval)")}
    problems += [f"{mode} with {why}" for ok, why in needs.values() if not ok]
    if scores_in_worker(cfg):
        problems += [f"scoring.where={cfg.scoring.where} with rewards.{name}.record (the trainer's evaluations "
                     "and the worker would both write the record file)" for name, spec in cfg.rewards.items()
                     if spec.record]
    return problems


def scores_in_worker(cfg: TrainConfig) -> bool:
    """Whether the rollout worker scores its rollouts (`scoring.where`; auto: every reward served)."""
    if cfg.rollout.mode == "sync" or cfg.scoring.where == "trainer":
        return False
    return cfg.scoring.where == "worker" or all(is_served(spec) for spec in cfg.rewards.values())
