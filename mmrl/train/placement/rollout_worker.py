"""A rollout worker for `rollout.mode: one_step_off` and `async` (docs/async.md): a process of its
own, with one torch thread, that holds a copy of the policy, receives the trained weights after
updates and generates the rollouts it is asked for. Before step k's update the trainer asks for the
rollouts of the steps up to k + `max_staleness` (mmrl/train/loop/collect.py), and takes each step's when
it collects it: at most max_staleness + 1 steps of prompt groups are asked for and not yet taken.
one_step_off answers in the order asked, with the weights received before each request; async
reads every waiting message before each generation, so it generates from the newest weights it has.

The weights travel over a process group of the two (mmrl/train/placement/weights_broadcast.py); the queues
carry the messages. To the worker: ("weights", version), which announces a broadcast the worker
receives when it reads it, ("rollout", key, pickled rows, group_size, seeds) with key = (step,
attempt, first group), ("stop",). From it: ("rollout", key, Rollout stamped with its weights
version, the policy's counts of that generation: `Policy.pop_metrics`, the worker's scores or None:
`scoring.where`) or ("error", traceback, the message of a user's error or None): `failure_message`.
"""

from __future__ import annotations

import pickle
import queue
import signal
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS
from mmrl.serving.remote_reward import is_served
from mmrl.train.placement.chunk_scoring import place_call, score_with_counts
from mmrl.train.placement.weights_broadcast import Layout, WeightsReceiver, WeightsSender, layout_of, model_device

# the worker's scores of a rollout's kept rows: rewards, the auxiliary rows' rewards, the rewards' counts
WorkerScores = tuple[dict[str, Tensor], dict[str, Tensor], dict[str, float]]

POLL_S = 1.0  # how often a waiting trainer checks that the worker is alive
JOIN_POLL_S = 0.05  # how often, while the worker starts, the trainer checks whether it has joined


class RolloutWorkerDied(UserError):
    """The rollout worker exited or failed; the run stops (after a checkpoint of the last step)."""


class WorkerTraceback(Exception):
    """The traceback of the worker's failure, the cause of `RolloutWorkerDied` (`--debug` prints it)."""


def failure_message(error: BaseException) -> tuple:
    """What a failing worker sends the trainer: its traceback, and where the error is one the user
    can fix (a `UserError`, e.g. a served reward's `RemoteRewardError`) its own message."""
    return "error", traceback.format_exc(), str(error) if isinstance(error, UserError) else None


def worker_failure(message: tuple) -> RolloutWorkerDied:
    """The trainer's error for a worker's `failure_message`: the user's error in one line, as the
    trainer's own would be, or the whole traceback of any other; the traceback is its cause."""
    _, trace, user_message = message
    text = f"the rollout worker stopped: {user_message}" if user_message else f"the rollout worker failed:\n{trace}"
    error = RolloutWorkerDied(text)
    error.__cause__ = WorkerTraceback(trace)
    return error


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
             "lora": (cfg.optim.lora.r == 0, f"optim.lora.r={cfg.optim.lora.r} (the worker takes whole weights)"),
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


def _serve(recipe: dict, newest_weights: bool, requests: mp.Queue, results: mp.Queue,
           weights: tuple[int, Layout, torch.device]) -> None:
    """The worker process: build the policy (and, with `scores_in_worker`, the rewards) from the
    recipe, join the trainer's weights group (`weights`: its port, the trainer's state dict layout
    and device), then answer messages until ("stop",); with `newest_weights`, every waiting message
    is read before each generation."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # the trainer stops the run (a checkpoint first), then the worker
        signal.signal(stop, signal.SIG_IGN)
    scorer = None
    try:
        torch.set_num_threads(1)
        from mmrl.config.parse import parse_config
        from mmrl.registry import import_user_module, load_plugins
        from mmrl.train.loop.parts import bound_rewards, build_policy
        load_plugins()
        cfg = parse_config(recipe, [])
        policy = build_policy(cfg)
        policy.prompt_column = cfg.data.prompt_column
        policy.model.eval()
        if scores_in_worker(cfg):
            for module in cfg.reward_modules:
                import_user_module(module)
            scorer = CallScorer(bound_rewards(cfg)[0], results)
        port, layout, trainer_device = weights
        receiver = WeightsReceiver(port, layout, policy.model, trainer_device)
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
                if scorer is None:
                    results.put(("rollout", key, rollout, policy.pop_metrics(), None))
                else:  # scored in the thread while the next request generates; sent once scored
                    scorer.submit(key, rollout, rows, policy.pop_metrics())
            elif message[0] == "stop":
                return
            elif message[0] == "weights":
                version = message[1]
                receiver.receive()
            else:
                key, rows, group_size, seeds = message[1:]
                pending.append((key, pickle.loads(rows), group_size, seeds))
    except BaseException as error:  # the trainer raises it as RolloutWorkerDied
        results.put(failure_message(error))
    finally:
        if scorer is not None:
            scorer.close()


class CallScorer:
    """The worker's scoring (`scoring.where`): each generation call's rollout placed in its draw and
    scored in one background thread, in the order generated, then sent to the trainer with its
    rewards; a reward's failure is sent as the worker's error."""

    def __init__(self, reward_fns: dict, results: mp.Queue):
        self.reward_fns, self.results = reward_fns, results
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mmrl-worker-reward")

    def submit(self, key, rollout: Rollout, rows: list[dict], counts: dict[str, float]) -> None:
        self.pool.submit(self._score, key, rollout, rows, counts)

    def _score(self, key, rollout: Rollout, rows: list[dict], counts: dict[str, float]) -> None:
        try:
            own = set(rollout.columns)
            kept, rewards, auxiliary, reward_counts = score_with_counts(self.reward_fns, place_call(rollout, rows, key[2]))
            kept.columns = {k: v for k, v in kept.columns.items() if k in own}  # the data columns stay with the trainer
            self.results.put(("rollout", key, kept, counts, (rewards, auxiliary, reward_counts)))
        except BaseException as error:
            self.results.put(failure_message(error))

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class RolloutWorker:
    """The trainer's handle on the worker process: send weights, ask for rollouts, take them."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, version: int):
        context = mp.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        self.mode = cfg.rollout.mode
        self.sender, device = WeightsSender(), model_device(model)
        weights = (self.sender.port, layout_of(model.state_dict()), device)
        # The worker computes on one torch thread. On the CPU the trainer gives it one of its threads'
        # cores back while it runs (restored by `stop`): with the trainer's threads on every core
        # besides, the two processes oversubscribe the cores and both slow down.
        self.trainer_threads = torch.get_num_threads()
        if device.type == "cpu" and self.trainer_threads > 1:
            torch.set_num_threads(self.trainer_threads - 1)
        self.process = context.Process(target=_serve, args=(to_dict(cfg), self.mode == "async", self.requests,
                                                            self.results, weights), daemon=True)
        self.process.start()
        self.ready: dict[Any, tuple[Rollout, dict[str, float], WorkerScores | None]] = {}
        self.counts: dict[str, float] = {}  # the worker's policy's counts of the rollouts taken (`pop_metrics`)
        self.asked: set = set()
        self.transfer_error: str | None = None  # why a weights transfer failed (raised when a rollout is awaited)
        self.sender.connect(device, lambda: self._receive(JOIN_POLL_S))
        self.send_weights(model, version)

    def send_weights(self, model: torch.nn.Module, version: int) -> None:
        """The worker generates from these weights (after `version` optimizer steps) from now on: their
        broadcast starts, and its message follows the requests sent before it. After a failed transfer
        (the worker died: its connection closed) none starts; the next rollout awaited raises."""
        if self.transfer_error is not None:
            return
        try:
            self.sender.send(model)
        except RuntimeError as err:
            self.transfer_error = f"the weights transfer to it failed: {err}"
            return
        self.requests.put(("weights", version))

    def ask(self, key, rows: list[dict], group_size: int, seeds: list[int]) -> None:
        self.requests.put(("rollout", key, self._pickled(key, rows), group_size, seeds))
        self.asked.add(key)

    def _pickled(self, key, rows: list[dict]) -> bytes:
        """The rows as they travel, pickled here: a row that cannot be (a file object, a lambda) would
        otherwise be dropped by the queue's feeder thread, and the trainer would wait for its answer
        forever."""
        try:
            return pickle.dumps(rows)
        except Exception as err:
            raise UserError(f"rollout.mode={self.mode}: the data rows of step {key[0]} (groups from {key[2]}) cannot "
                            f"be sent to the rollout worker: {type(err).__name__}: {err}; its rows must pickle "
                            "(paths, PIL images, arrays, text)") from None

    def asked_for(self, step: int) -> bool:
        """Whether the rollouts of `step` (its first attempt) were asked for and not yet taken."""
        return any(key[0] == step for key in self.asked)

    def take(self, key, rows: list[dict], group_size: int, seeds: list[int]) -> Rollout:
        """The rollouts asked for under `key` (asked for now if they were not), once they arrive."""
        return self.take_scored(key, rows, group_size, seeds)[0]

    def take_scored(self, key, rows: list[dict], group_size: int, seeds: list[int]) -> tuple[Rollout, WorkerScores | None]:
        """`take`, with the worker's scores where it scores (`scores_in_worker`): then the rollout's
        group ids are already counted in its draw and it holds only the kept rows (auxiliary rows
        scored and left out), without the data columns (the trainer has them); else None, and the
        trainer places and scores it."""
        if key not in self.asked:
            self.ask(key, rows, group_size, seeds)
        while key not in self.ready:
            self._receive()
        self.asked.discard(key)
        rollout, counts, scores = self.ready.pop(key)
        for name, value in counts.items():
            self.counts[name] = self.counts.get(name, 0.0) + value
        return rollout, scores

    def pop_metrics(self) -> dict[str, float]:
        """The counts the worker's policy reported about the rollouts taken since the last call, summed
        (an episode policy's episodes, turns and tool calls); reading them resets them."""
        out, self.counts = self.counts, {}
        return out

    def _receive(self, timeout: float = POLL_S) -> None:
        try:
            message = self.results.get(timeout=timeout)
        except queue.Empty:
            if self.process.is_alive() and self.transfer_error is None:
                return
            ended = "is alive" if self.process.is_alive() else f"exited with code {self.process.exitcode}"
            why = f"({self.transfer_error})" if self.transfer_error else "without an answer"
            raise RolloutWorkerDied(f"the rollout worker (pid {self.process.pid}) {ended} {why}; "
                                    f"rollout.mode={self.mode} cannot go on") from None
        if message[0] == "error":
            raise worker_failure(message)
        self.ready[message[1]] = message[2], message[3], message[4]

    def stop(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self.sender.close()
        torch.set_num_threads(self.trainer_threads)
