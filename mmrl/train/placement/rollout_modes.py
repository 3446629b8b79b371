"""What `rollout.mode` (sync, one_step_off, async), a served rollout engine (`policy.rollout_engine:
hf_server`), `placement:` and `scoring.where` can do with the rest of a recipe, checked with the recipe
before anything loads (docs/async.md, docs/distributed.md)."""

from __future__ import annotations

from mmrl.config.placement import placement_problems
from mmrl.config.rollouts import served_engine
from mmrl.config.sections import TrainConfig
from mmrl.registry import ADAPTERS
from mmrl.serving.remote_reward import is_served


def rollout_mode_problems(cfg: TrainConfig, num_processes: int) -> list[str]:
    """What `rollout.mode`, the served engine and their settings cannot do with the rest of the recipe."""
    ro = cfg.rollout
    served = served_engine(cfg.policy)
    problems = placement_problems(cfg.placement, served is not None, bool(ro.servers), cfg.rewards)
    if ro.mode != "async":
        problems += [f"rollout.{name}={value!r} is async's (rollout.mode={ro.mode})"
                     for name, value, default in (("weights_every", ro.weights_every, 1),
                                                  ("stale_rows", ro.stale_rows, "drop")) if value != default]
    if served:
        problems += served_problems(cfg, served)
    if ro.mode == "sync":
        if cfg.scoring.where == "worker" and not served:
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
    if served:
        return problems
    return problems + worker_problems(cfg, num_processes)


def generating_adapter_problem(cfg: TrainConfig, who_runs: str) -> str | None:
    """Why `cfg.task`'s adapter cannot be built in another process to generate (`who_runs`: 'the rollout
    worker runs', 'the rollout servers run'), from the recipe, with rows drawn as the trainer's own would be."""
    workers = [name for name in ADAPTERS.names() if ADAPTERS.get(name).runs_in_rollout_worker]
    if cfg.task not in workers:
        return f"task={cfg.task!r} ({who_runs} {', '.join(workers)})"
    if cfg.rollout.mode != "sync":  # stale rows need behaviour log-probs
        return ADAPTERS.get(cfg.task).rollout_worker_problem(cfg.policy)
    return None


def served_problems(cfg: TrainConfig, engine: str) -> list[str]:
    """What the served engine `engine` cannot do with the recipe."""
    what = f"policy.rollout_engine={engine}"
    adapter = generating_adapter_problem(cfg, "the rollout servers run") if cfg.task in ADAPTERS else None
    needs = {"policy": (adapter is None, adapter),
             "lora": (cfg.optim.lora.r == 0, f"optim.lora.r={cfg.optim.lora.r} (the servers take whole weights)"),
             "dynamic": (cfg.rollout.mode == "sync" or not cfg.sampling.dynamic,
                         f"sampling.dynamic=true and rollout.mode={cfg.rollout.mode} (a redraw waits for the rewards)"),
             "stages": (not cfg.stages, "stages (a stage may change what the servers generate)"),
             "where": (cfg.scoring.where != "worker",
                       "scoring.where=worker (the rollout servers do not score: the trainer does, or its reward servers)")}
    return [f"{what} with {why}" for ok, why in needs.values() if not ok]


def worker_problems(cfg: TrainConfig, num_processes: int) -> list[str]:
    """What the rollout worker (rollout.mode one_step_off / async, no served engine) cannot do with the recipe."""
    mode = f"rollout.mode={cfg.rollout.mode}"
    adapter = generating_adapter_problem(cfg, "the rollout worker runs") if cfg.task in ADAPTERS else None
    needs = {"policy": (adapter is None, adapter),
             "processes": (num_processes == 1, f"{num_processes} processes (the rollout worker serves one)"),
             "dynamic": (not cfg.sampling.dynamic, "sampling.dynamic=true (a redraw waits for the rewards)"),
             "stages": (not cfg.stages, "stages (a stage may change what the worker generates)"),
             "eval": (not (cfg.eval.every and cfg.policy.get("rollout_engine") == "vllm"),
                      f"eval.every={cfg.eval.every} and policy.rollout_engine=vllm (an evaluation samples in the "
                      "trainer's process, which builds no vLLM engine; evaluate the checkpoints with mmrl eval)")}
    problems = [f"{mode} with {why}" for ok, why in needs.values() if not ok]
    if scores_in_worker(cfg):
        problems += [f"scoring.where={cfg.scoring.where} with rewards.{name}.record (the trainer's evaluations "
                     "and the worker would both write the record file)" for name, spec in cfg.rewards.items()
                     if spec.record]
    return problems


def scores_in_worker(cfg: TrainConfig) -> bool:
    """Whether the rollout worker scores its rollouts (`scoring.where`; auto: every reward served)."""
    if cfg.rollout.mode == "sync" or cfg.scoring.where == "trainer" or served_engine(cfg.policy):
        return False
    return cfg.scoring.where == "worker" or all(is_served(spec) for spec in cfg.rewards.values())
