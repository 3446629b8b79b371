"""A rollout worker for `rollout.mode: one_step_off` and `async` (docs/async.md): a process of its
own, with one torch thread, that holds a copy of the policy, receives the trained weights after
updates and generates the rollouts it is asked for. Before step k's update the trainer asks for the
rollouts of the steps up to k + `max_staleness` (mmrl/train/collect.py), and takes each step's when
it collects it: at most max_staleness + 1 steps of prompt groups are asked for and not yet taken.
one_step_off answers in the order asked, with the weights received before each request; async
reads every waiting message before each generation, so it generates from the newest weights it has.

Messages to the worker: ("weights", version, state dict), ("rollout", key, rows, group_size, seeds)
with key = (step, attempt, first group), ("stop",). From it: ("rollout", key, Rollout stamped with
its weights version) or ("error", text).
"""

from __future__ import annotations

import queue
import signal
import traceback
from collections import deque
from typing import Any

import torch
import torch.multiprocessing as mp

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError

POLL_S = 1.0  # how often a waiting trainer checks that the worker is alive


class RolloutWorkerDied(UserError):
    """The rollout worker exited or failed; the run stops (after a checkpoint of the last step)."""


WORKER_TASKS = ("causal_lm", "diffusion")  # adapters the worker builds from the recipe alone


def rollout_mode_problems(cfg: TrainConfig, num_processes: int) -> list[str]:
    """What `rollout.mode` and its settings cannot do with the rest of the recipe."""
    ro = cfg.rollout
    problems = []
    if ro.mode != "async":
        problems += [f"rollout.{name}={value!r} is async's (rollout.mode={ro.mode})"
                     for name, value, default in (("weights_every", ro.weights_every, 1),
                                                  ("stale_rows", ro.stale_rows, "drop")) if value != default]
    if ro.mode == "sync":
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
    needs = {"task": (cfg.task in WORKER_TASKS, f"task={cfg.task!r} (the rollout worker runs "
                                                 f"{' and '.join(WORKER_TASKS)})"),
             "units": (cfg.policy.get("units", "steps") != "forward_process",
                       "policy.units=forward_process (no behaviour log-probs to correct stale rows with)"),
             "processes": (num_processes == 1, f"{num_processes} processes (the rollout worker serves one)"),
             "lora": (cfg.optim.lora.r == 0, f"optim.lora.r={cfg.optim.lora.r} (the worker takes whole weights)"),
             "dynamic": (not cfg.sampling.dynamic, "sampling.dynamic=true (a redraw waits for the rewards)"),
             "stages": (not cfg.stages, "stages (a stage may change what the worker generates)"),
             "engine": (cfg.policy.get("rollout_engine", "hf") == "hf",
                        f"policy.rollout_engine={cfg.policy.get('rollout_engine')!r} (the worker runs hf)")}
    problems += [f"{mode} with {why}" for ok, why in needs.values() if not ok]
    return problems


def _serve(recipe: dict, newest_weights: bool, requests: mp.Queue, results: mp.Queue) -> None:
    """The worker process: build the policy from the recipe, then answer messages until ("stop",);
    with `newest_weights`, every waiting message is read before each generation."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # the trainer stops the run (a checkpoint first), then the worker
        signal.signal(stop, signal.SIG_IGN)
    try:
        torch.set_num_threads(1)
        from mmrl.config.parse import parse_config
        from mmrl.registry import load_plugins
        from mmrl.train.parts import build_policy
        load_plugins()
        cfg = parse_config(recipe, [])
        policy = build_policy(cfg)
        policy.prompt_column = cfg.data.prompt_column
        policy.model.eval()
        version, pending = 0, deque()
        while True:
            read = newest_weights or not pending  # one_step_off: each request generated as it is read
            try:
                message = requests.get(block=not pending) if read else None
            except queue.Empty:
                message = None
            if message is None:
                key, rows, group_size, seeds = pending.popleft()
                policy.set_training_step(key[0])
                rollout = policy.rollout(rows, group_size, seeds)
                rollout.stamp_version(version)
                results.put(("rollout", key, rollout))
            elif message[0] == "stop":
                return
            elif message[0] == "weights":
                _, version, state = message
                policy.model.load_state_dict(state)
            else:
                pending.append(message[1:])
    except BaseException:  # the trainer raises it as RolloutWorkerDied
        results.put(("error", traceback.format_exc()))


class RolloutWorker:
    """The trainer's handle on the worker process: send weights, ask for rollouts, take them."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, version: int):
        context = mp.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        self.mode = cfg.rollout.mode
        self.process = context.Process(target=_serve, args=(to_dict(cfg), self.mode == "async", self.requests,
                                                            self.results), daemon=True)
        self.process.start()
        self.ready: dict[Any, Rollout] = {}
        self.asked: set = set()
        self.send_weights(model, version)

    def send_weights(self, model: torch.nn.Module, version: int) -> None:
        """The worker generates from these weights (after `version` optimizer steps) from now on."""
        state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        self.requests.put(("weights", version, state))

    def ask(self, key, rows: list[dict], group_size: int, seeds: list[int]) -> None:
        self.requests.put(("rollout", key, rows, group_size, seeds))
        self.asked.add(key)

    def asked_for(self, step: int) -> bool:
        """Whether the rollouts of `step` (its first attempt) were asked for and not yet taken."""
        return any(key[0] == step for key in self.asked)

    def take(self, key, rows: list[dict], group_size: int, seeds: list[int]) -> Rollout:
        """The rollouts asked for under `key` (asked for now if they were not), once they arrive."""
        if key not in self.asked:
            self.ask(key, rows, group_size, seeds)
        while key not in self.ready:
            self._receive()
        self.asked.discard(key)
        return self.ready.pop(key)

    def _receive(self) -> None:
        try:
            message = self.results.get(timeout=POLL_S)
        except queue.Empty:
            if not self.process.is_alive():
                raise RolloutWorkerDied(f"the rollout worker (pid {self.process.pid}) exited with code "
                                        f"{self.process.exitcode} without an answer; rollout.mode={self.mode} "
                                        "cannot go on") from None
            return
        if message[0] == "error":
            raise RolloutWorkerDied(f"the rollout worker failed:\n{message[1]}")
        self.ready[message[1]] = message[2]

    def stop(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
