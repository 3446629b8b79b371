"""The trainer's handle on the rollout worker for `rollout.mode: one_step_off` and `async`
(docs/async.md). The worker (placement/worker_process.py) is a process of its own, with one torch
thread, that holds a copy of the policy, receives the trained weights after updates and generates the
rollouts it is asked for. Before step k's update the trainer asks for the rollouts of the steps up to
k + `max_staleness` (mmrl/train/loop/collect.py), and takes each step's when it collects it: at most
max_staleness + 1 steps of prompt groups are asked for and not yet taken. one_step_off answers in the
order asked, with the weights received before each request; async reads every waiting message before
each generation, so it generates from the newest weights it has.

The weights travel over a process group of the two (serving/weights_broadcast.py): the whole
state dict first, then the trained parameters and buffers alone where the model has frozen ones (LoRA: the
adapter's tensors). The queues carry the messages. To the worker: ("weights", version, part), which
announces a broadcast of that part the worker receives when it reads it, ("rollout", key, pickled
rows, group_size, seeds) with key = (step, attempt, first group), ("stop",). From it: ("rollout", key,
Rollout stamped with its weights version, the policy's counts of that generation: `Policy.pop_metrics`,
the worker's scores or None: `scoring.where`) or ("error", traceback, the message of a user's error or
None): `worker_process.failure_message`.

However the worker vanishes (killed while it builds its model, joins the weights group, generates,
receives weights, or with its rollouts in the queue, whose tensors the trainer fetches from its
process), the trainer raises `RolloutWorkerDied`: one line with its exit code, the error that showed
it as the cause (`--debug`).
"""

from __future__ import annotations

import pickle
import queue
import re
import signal
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.serving.weights_broadcast import WHOLE, WeightsSender, model_device, part_after_updates, transfer_layouts
from mmrl.train.placement.worker_process import WorkerTraceback, serve

# the worker's scores of a rollout's kept rows: rewards, the auxiliary rows' rewards, the rewards' counts
WorkerScores = tuple[dict[str, Tensor], dict[str, Tensor], dict[str, float]]

POLL_S = 1.0  # how often a waiting trainer checks that the worker is alive
JOIN_POLL_S = 0.05  # how often, while the worker starts, the trainer checks whether it has joined
EXIT_WAIT_S = 5.0  # how long a trainer that lost the worker waits for its exit code
# what reading the worker's message raises when its process is gone: the connection to it, through
# which a rollout's tensors are fetched (torch's shared memory handles), reset, refused, or cut short
LOST_PROCESS_ERRORS = (OSError, EOFError, pickle.UnpicklingError)


class RolloutWorkerDied(UserError):
    """The rollout worker exited or failed; the run stops (after a checkpoint of the last step)."""


def worker_failure(message: tuple) -> RolloutWorkerDied:
    """The trainer's error for a worker's `failure_message`: the user's error in one line, as the
    trainer's own would be, or the whole traceback of any other; the traceback is its cause."""
    _, trace, user_message = message
    text = f"the rollout worker stopped: {user_message}" if user_message else f"the rollout worker failed:\n{trace}"
    error = RolloutWorkerDied(text)
    error.__cause__ = WorkerTraceback(trace)
    return error


class RolloutWorker:
    """The trainer's handle on the worker process: send weights, ask for rollouts, take them."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, version: int):
        context = mp.get_context("spawn")
        self.requests, self.results = context.Queue(), context.Queue()
        self.mode = cfg.rollout.mode
        layouts, device = transfer_layouts(model), model_device(model)
        self.sender, self.part = WeightsSender(layouts), WHOLE  # the part the next transfer carries
        self.later_part = part_after_updates(model)
        # The worker computes on one torch thread. On the CPU the trainer gives it one of its threads'
        # cores back while it runs (restored by `stop`): with the trainer's threads on every core
        # besides, the two processes oversubscribe the cores and both slow down.
        self.trainer_threads = torch.get_num_threads()
        if device.type == "cpu" and self.trainer_threads > 1:
            torch.set_num_threads(self.trainer_threads - 1)
        self.process = context.Process(target=serve, args=(to_dict(cfg), self.mode == "async", self.requests,
                                                            self.results, (self.sender.port, layouts, device)),
                                       daemon=True)
        self.process.start()
        self.ready: dict[Any, tuple[Rollout, dict[str, float], WorkerScores | None]] = {}
        self.counts: dict[str, float] = {}  # the worker's policy's counts of the rollouts taken (`pop_metrics`)
        self.asked: set = set()
        self.transfer_error: RuntimeError | None = None  # a weights transfer's failure (raised when a rollout is awaited)
        try:
            self._join(device)
        except BaseException:
            self.stop()
            raise
        self.send_weights(model, version)

    def _join(self, device: torch.device) -> None:
        """Wait for the worker to build its model and form the weights group with it."""
        try:
            self.sender.connect(device, lambda: self._receive(JOIN_POLL_S, "while it built its model"))
        except RuntimeError as err:  # the worker died while the group formed
            raise self._died("while joining the weights transfer", err) from err

    def send_weights(self, model: torch.nn.Module, version: int) -> None:
        """The worker generates from these weights (after `version` optimizer steps) from now on: their
        broadcast starts (the whole state dict the first time, then `part_after_updates`), and its
        message follows the requests sent before it. After a failed transfer (the worker died: its
        connection closed) none starts; the next rollout awaited raises."""
        if self.transfer_error is not None:
            return
        try:
            self.sender.send(model, self.part)
        except RuntimeError as err:
            self.transfer_error = err
            return
        self.requests.put(("weights", version, self.part))
        self.part = self.later_part

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

    def has_asked(self, key) -> bool:
        """Whether the rollouts of `key` were asked for and not yet taken."""
        return key in self.asked

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

    def _receive(self, timeout: float = POLL_S, waiting: str = "while the trainer waited for its rollouts") -> None:
        """Take the worker's next message, if one comes within `timeout`; raise if it failed or is gone
        (`waiting`: what the trainer was waiting for, as the error says it)."""
        try:
            message = self.results.get(timeout=timeout)
        except queue.Empty:
            if self.process.is_alive() and self.transfer_error is None:
                return
            if self.transfer_error is not None:
                raise self._died("after its weights transfer failed", self.transfer_error) from self.transfer_error
            raise self._died(waiting) from None
        except LOST_PROCESS_ERRORS as err:
            died = self._died("while the trainer read its rollouts", err)
            if self.process.is_alive():  # not the worker's death: an error of the trainer's own
                raise
            raise died from err
        if message[0] == "error":
            raise worker_failure(message)
        self.ready[message[1]] = message[2], message[3], message[4]

    def _died(self, when: str, error: BaseException | None = None) -> RolloutWorkerDied:
        """The worker's death in one line: its exit code (waited for a moment: a killed process's is
        set once it is reaped), when the trainer saw it, and the error that showed it."""
        self.process.join(timeout=EXIT_WAIT_S)
        why = f" ({type(error).__name__}: {_first_sentence(error)})" if error is not None else ""
        return RolloutWorkerDied(f"the rollout worker (pid {self.process.pid}) {_ending(self.process.exitcode)} "
                                 f"{when}{why}; rollout.mode={self.mode} cannot go on")

    def stop(self) -> None:
        if self.process.is_alive():
            self.requests.put(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self.sender.close()
        torch.set_num_threads(self.trainer_threads)


def _ending(code: int | None) -> str:
    """How a process with exit code `code` (None: still running; -N: killed by signal N) ended."""
    if code is None:
        return "is alive"
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:  # a signal Python has no name for
        return f"was killed by signal {-code}"


def _first_sentence(error: BaseException) -> str:
    """An error's first sentence, without the source location gloo puts before it."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
