"""The rollout worker's process (`rollout.mode: one_step_off` and `async`, docs/async.md): it builds
the policy as the trainer does (the adapter from the recipe, with the engine's LoRA: `core.lora`)
and, where it scores, the rewards, receives the trained weights, and
answers the trainer's requests for rollouts (the messages: placement/rollout_worker.py). A failure
is sent to the trainer as `failure_message`, which raises it as the worker's death."""

from __future__ import annotations

import pickle
import queue
import signal
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.multiprocessing as mp

from mmrl.config.parse import parse_config
from mmrl.core.lora import with_lora
from mmrl.core.policy import build_policy
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.registry import import_user_module, load_plugins
from mmrl.train.placement.chunk_scoring import place_call, score_with_counts
from mmrl.train.placement.reward_binding import bound_rewards
from mmrl.train.placement.rollout_modes import scores_in_worker
from mmrl.serving.weights_broadcast import Layout, WeightsReceiver


class WorkerTraceback(Exception):
    """The traceback of the worker's failure, the cause of the trainer's `RolloutWorkerDied` (`--debug` prints it)."""


def failure_message(error: BaseException) -> tuple:
    """What a failing worker sends the trainer: its traceback, and where the error is one the user
    can fix (a `UserError`, e.g. a served reward's `RemoteRewardError`) its own message."""
    return "error", traceback.format_exc(), str(error) if isinstance(error, UserError) else None


def serve(recipe: dict, newest_weights: bool, requests: mp.Queue, results: mp.Queue,
          weights: tuple[int, dict[str, Layout], torch.device]) -> None:
    """The worker process: build the policy (and, with `scores_in_worker`, the rewards) from the
    recipe, join the trainer's weights group (`weights`: its port, the layouts of the parts of the
    trainer's state dict a transfer carries, its device), then answer messages until ("stop",); with
    `newest_weights`, every waiting message is read before each generation."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # the trainer stops the run (a checkpoint first), then the worker
        signal.signal(stop, signal.SIG_IGN)
    scorer = None
    try:
        torch.set_num_threads(1)
        load_plugins()
        cfg = parse_config(recipe, [])
        policy = build_policy(cfg)
        policy.prompt_column = cfg.data.prompt_column
        policy.model = with_lora(policy.model, cfg.optim.lora)  # the trainer's modules and names, to take its weights
        policy.model.eval()
        if scores_in_worker(cfg):
            for module in cfg.reward_modules:
                import_user_module(module, "reward_modules")
            scorer = CallScorer(bound_rewards(cfg)[0], results)
        port, layouts, trainer_device = weights
        receiver = WeightsReceiver(port, layouts, policy.model, trainer_device)
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
                receiver.receive(message[2])
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
