"""The loop, the same for every family, under `accelerate` and the run's distribution `Strategy`.

A step (`train_step`):
  1. enter the stage of the step (its settings, rewards, data; the model and optimizer carry on);
  2. collect: draw prompt groups, roll out this process's share, score, gather the rewards
     (mmrl/train/loop/collect.py; DAPO dynamic sampling draws again);
  3. batch: advantages over the whole batch, this process's rows and the aggregation weights
     (mmrl/train/loop/batching.py);
  4. update: `mu` optimizer steps over streamed micro-batches (mmrl/train/loop/update.py).
The run (`train`): steps, held-out evaluation every `eval.every`, metrics and plots, checkpoints
every `save_every`, a checkpoint and a clear stop on signals, on too many non-finite steps or steps
without a reward, and on an error (the state after the last completed step); a run none of whose
steps had a reward ends in an error. The run holds its output directory's lock throughout.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.objectives import OBJECTIVES
from mmrl.distributed import build_strategy
from mmrl.distributed.gather import gather_objects
from mmrl.distributed.launcher import check_world_size, with_launcher_settings
from mmrl.errors import reading_user_input
from mmrl.registry import load_plugins
from mmrl.serving.health import check_reward_servers
from mmrl.train.loop.batching import step_batch
from mmrl.train.loop.collect import RolloutCollector
from mmrl.train.loop.evaluation import Evaluator, evaluate
from mmrl.train.loop.parts import build_parts, set_base_lr, stage_inputs, take_optimizer_settings
from mmrl.train.loop.records import StepBatch
from mmrl.train.loop.run_checkpoints import RunCheckpoints
from mmrl.train.loop.step_clock import StepClock
from mmrl.train.loop.update import PolicyUpdate
from mmrl.train.loop.warm_start import warm_start
from mmrl.train.placement.generators import start_generator
from mmrl.train.placement.local_servers import RunServers
from mmrl.train.placement.reward_binding import bound_rewards
from mmrl.train.plan.stages import Stage
from mmrl.train.plan.validate import validate
from mmrl.train.reporting.eval_samples import log_eval_samples
from mmrl.train.reporting.tracking import Progress, Tracker, end_line, start_summary
from mmrl.train.safety import checkpoint as ckpt
from mmrl.train.safety import run_dir
from mmrl.train.safety.health import NonFiniteError, RunHealth
from mmrl.train.safety.signals import RunInterrupted, StopSignals


logger = logging.getLogger(__name__)
_UNSET = object()  # a policy field a stage's recipe does not give


class Trainer(RunCheckpoints):
    @reading_user_input()  # what goes wrong while reading the recipe, data and model paths is the user's to fix
    def __init__(self, cfg: TrainConfig, accelerator=None, for_training: bool = True,
                 held_out_evaluator: Evaluator | None = None, needs_held_out: bool = False):
        """Validate the recipe once, claim the output directory, build the run's parts, resume. `for_training=False` (scoring a
        checkpoint) neither claims `cfg.output_dir` nor resumes. `held_out_evaluator`: a judge that is never a reward (a demo's,
        `evaluate`'s), scored beside the reward at every `eval.every`; `needs_held_out`: refuse data without held-out rows."""
        self.held_out_evaluator = held_out_evaluator
        load_plugins()  # the recipe's reward_modules are imported by `validate`, which names a missing one
        if not cfg.rewards:
            raise ValueError("rewards: name at least one reward (see `mmrl --help` for the registered ones)")
        cfg = with_launcher_settings(cfg)  # `accelerate launch` with a config that names a strategy
        self.strategy = build_strategy(cfg)  # an unknown name: the registry's error, with the registered ones
        acc = self.accelerator = self.strategy.accelerator(accelerator)
        check_world_size(acc.num_processes)
        self.plan = validate(cfg, acc.num_processes,  # the whole recipe, before any model, data set or reward model loads
                             warn=logger.warning if acc.is_main_process else lambda message: None)
        self.output_dir = Path(cfg.output_dir)
        claimed, self._lock = (run_dir.claim_for_run(acc, cfg, to_dict(self.plan.recipe)) if for_training
                               else (run_dir.Claim(), None))
        try:
            self._build(cfg, claimed.resume_from, for_training, needs_held_out or not for_training)
            if for_training and acc.is_main_process:  # clear the previous run's files, record a resume's changes
                run_dir.settle(self.output_dir, claimed)
            acc.wait_for_everyone()
        except BaseException:
            self.release_output_dir()
            raise

    def _build(self, cfg: TrainConfig, resume_from: Path | None, for_training: bool, held_out: bool) -> None:
        """The run's data (with the warm start's targets when a fresh run trains; refused without
        held-out rows when `held_out`), its reward servers (started, and answering at every url),
        then its model, optimizer and update, at the checkpoint `resume_from` if given."""
        acc = self.accelerator
        self.stage = self.plan.stage_at(int(ckpt.read_trainer_state(resume_from)["step"]) if resume_from else 0)
        if self.plan.staged and cfg.max_steps < self.plan.planned_steps and acc.is_main_process:
            logger.warning("max_steps=%d ends the run in stage %d of the stages' %d planned steps", cfg.max_steps,
                           self.plan.stage_at(cfg.max_steps).index, self.plan.planned_steps)
        self.cfg = self.stage.config
        self.inputs = stage_inputs(self.stage, self.plan, warm_start=for_training and resume_from is None,
                                   held_out=held_out)
        self.servers = RunServers(cfg, acc.is_main_process)  # rewards.NAME.server, placement.rollout / reward
        if acc.is_main_process:  # the servers the run did not start too
            check_reward_servers(cfg.rewards)
        parts = build_parts(self.stage, self.plan, self.strategy)
        self.policy, self.model, self.optimizer, self.reference = parts.policy, parts.model, parts.optimizer, parts.reference
        self.scheduler = parts.scheduler
        self.clock = StepClock(torch.cuda.synchronize if acc.device.type == "cuda" else None)
        self.collector = RolloutCollector(self.strategy, self.policy, self.model, self.clock)
        self.updater = PolicyUpdate(self.cfg, self.strategy, self.policy, self.model, self.optimizer, self.scheduler,
                                    self.reference, OBJECTIVES.get(self.cfg.algorithm.objective), self.clock, parts.teachers, parts.scores)
        self.step = 0
        self.bad_steps = 0  # optimizer steps skipped in a row for a non-finite loss or gradient
        self.last_eval: tuple[int, float] | None = None  # (step, eval reward_mean) of the latest eval
        self._phase: str | None = None  # in a step: "collect" until it changes the run's state, then "changing"
        self._position_before_step: dict | None = None  # the data position before the current step
        if resume_from is not None:
            self.load_checkpoint(resume_from)
            take_optimizer_settings(self.optimizer, self.scheduler, self.cfg)
        self.resumed = resume_from is not None

    def release_output_dir(self) -> None:
        """Stop the servers the run launched; let another run use the output directory (at the end of
        `train`, or when building this run failed)."""
        if getattr(self, "servers", None) is not None:
            self.servers.stop()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def unwrapped(self):
        """The adapter's model inside the strategy's wrapper."""
        return self.strategy.unwrap(self.model)

    # ----- one step ---------------------------------------------------------------------------
    def prepare_batch(self, step: int) -> StepBatch:
        """Step `step`'s rollouts, rewards, advantages and aggregation weights: this process's share
        of the batch, ready for `updater.update` (phases 2 and 3 of a step)."""
        collected = self.collector.collect(self.inputs, step)
        return step_batch(collected, self.inputs.reward_weights, self.cfg, self.updater.objective, self.policy,
                          self.accelerator, self.collector.idle_row)

    def _enter_stage(self, stage: Stage) -> None:
        """Take `stage`'s settings before its first step (mmrl/train/plan/stages.py); the model, the optimizer
        state and, when the stage keeps the data and sampling settings, the data position carry on."""
        if stage.index == self.stage.index:
            return
        old, new = self.cfg, stage.config
        if new.policy != old.policy:
            changed = {k for k in {*old.policy, *new.policy} if old.policy.get(k, _UNSET) != new.policy.get(k, _UNSET)}
            self.policy.apply_stage_settings({k: getattr(stage.policy, k) for k in changed})
        fns, weights = (self.inputs.reward_fns, self.inputs.reward_weights) if new.rewards == old.rewards \
            else bound_rewards(new)
        if not self.plan.same_data(self.stage, stage):
            self.inputs = stage_inputs(stage, self.plan, fns, weights)
            self.policy.prompt_column = new.data.prompt_column
        else:
            self.inputs.cfg, self.inputs.reward_fns, self.inputs.reward_weights = new, fns, weights
        if new.optim.lr != old.optim.lr:
            set_base_lr(self.optimizer, self.scheduler, new.optim.lr)
        self.cfg = self.updater.cfg = new
        self.stage = stage

    def train_step(self) -> dict[str, float]:
        """One optimizer step's phases (the module's docstring numbers them); returns its metrics."""
        step = self.step + 1
        self._position_before_step = self._data_position()
        self._phase = "collect" if self.plan.stage_at(step).index == self.stage.index else "changing"
        self._enter_stage(self.plan.stage_at(step))
        self.clock.start()
        self.policy.set_training_step(step)
        batch = self.prepare_batch(step)
        worker, ro = self.collector.worker, self.cfg.rollout
        if worker is not None and ro.mode != "sync":  # the next max_staleness steps' rollouts, generated while this step trains
            self.collector.prefetch_after(self.inputs, step, min(step + ro.max_staleness, self.cfg.max_steps))
        self._phase = "changing"
        update = self.updater.update(batch)  # adds skipped_frac to batch.metrics
        if worker is not None and step % ro.weights_every == 0:
            worker.send_weights(self.unwrapped, step)
        self._phase = None
        metrics = {**batch.metrics, **update}
        if self.plan.staged:
            metrics["stage"] = self.stage.index
        metrics.update(self.clock.stop())  # time_step_s and its phases (mmrl/train/loop/step_clock.py)
        self.step = step
        return metrics

    # ----- the run ----------------------------------------------------------------------------
    def train(self) -> None:
        """Steps until `max_steps`, evaluating, logging and saving as the recipe says."""
        cfg, acc = self.cfg, self.accelerator
        started, first_step = time.perf_counter(), self.step
        metrics_file = self.output_dir / "metrics.jsonl"
        if not self.resumed and acc.is_main_process and metrics_file.exists():
            metrics_file.unlink()  # a fresh run in a used directory starts a fresh record
        self.tracker = Tracker(self.output_dir, cfg.logging.report_to, cfg.logging.plot_every,
                               config=to_dict(self.plan.recipe), resume_step=self.step if self.resumed else None,
                               enabled=acc.is_main_process, wandb_project=cfg.logging.wandb_project,
                               run_name=cfg.logging.run_name)
        self._say(self._start_summary())
        progress = Progress(cfg.max_steps, initial=self.step, enabled=cfg.logging.progress and acc.is_main_process,
                            print_every=cfg.logging.print_every if acc.is_main_process else 0)
        health = RunHealth(cfg.max_bad_steps, warn=acc.is_main_process)
        try:
            with StopSignals() as stop, self._checkpoint_on_failure():
                # the rollout worker or servers, with the run's (or the checkpoint's) weights; None: the trainer generates
                self.collector.worker = start_generator(cfg, self.unwrapped, self.step, acc.is_main_process)
                while self.step < cfg.max_steps:
                    metrics = self.train_step()
                    self._evaluate_every(metrics)
                    self.bad_steps = self.bad_steps + 1 if self.updater.nonfinite_term else 0
                    self.tracker.log(self.step, metrics)
                    progress.update(self.step, metrics)
                    health.check(self.step, metrics)
                    self._save_or_stop(stop)
            if not cfg.save_every or self.step % cfg.save_every:
                self.save_checkpoint()
            health.finish()  # a run none of whose steps had a reward is an error
        finally:
            if self.collector.worker is not None:
                self.collector.worker.stop()
            progress.close()
            self.tracker.close()
            self.release_output_dir()
        self._say(end_line(self.step, first_step, time.perf_counter() - started, metrics_file,
                           ckpt.checkpoint_dir(self.output_dir, self.step)))

    def _say(self, text: str) -> None:
        """Print `text` on the main process."""
        if self.accelerator.is_main_process:
            print(text, flush=True)

    def _start_summary(self) -> str:
        """What the run trains, on what, where (`tracking.start_summary`)."""
        return start_summary(self.cfg.task, self.cfg.policy.get("model", "?"), *self.strategy.parameter_counts(self.model),
                             len(self.inputs.train_rows), len(self.inputs.eval_rows), self.output_dir,
                             self.accelerator.num_processes, self.step if self.resumed else None)

    @contextmanager
    def _checkpoint_on_failure(self):
        """A step, reward, evaluation or log that raises: save the last completed step's state (unless the
        weights were mid-update, or the error is a stop that saved already), then re-raise, naming it."""
        try:
            yield
        except (RunInterrupted, NonFiniteError, ckpt.DiskFull):
            raise
        except Exception as e:
            e.add_note(f"mmrl: {self._failure_checkpoint()}")
            raise

    def _evaluate_every(self, metrics: dict[str, float]) -> None:
        every = self.cfg.eval.every  # the stage's
        if every and self.step % every == 0 and self.inputs.eval_rows:
            scores = self.evaluate(evaluator=self.held_out_evaluator, keep_samples=self.cfg.eval.log_samples > 0,
                                   kept_rows=self.cfg.eval.log_samples)
            log_eval_samples(self.tracker, self.step, scores.pop("samples", []), self.cfg.eval.log_samples,
                             self.policy.sample_medium)
            self.last_eval = (self.step, scores["reward_mean"])
            metrics.update({f"eval/{k}": v for k, v in scores.items()})

    def _save_or_stop(self, stop: StopSignals) -> None:
        """A checkpoint every `save_every`; a checkpoint and a stop after too many non-finite steps or
        a signal received by any process."""
        cfg = self.cfg
        saved = cfg.save_every and self.step % cfg.save_every == 0
        if saved:
            self.save_checkpoint()
        if self.bad_steps >= cfg.max_bad_steps:
            path = self.save_checkpoint()
            raise NonFiniteError(
                f"step {self.step}: the {self.updater.nonfinite_term} was not finite for {self.bad_steps} "
                f"steps in a row (max_bad_steps={cfg.max_bad_steps}), so the run stopped; checkpoint "
                f"{path}. Lower optim.lr or set optim.max_grad_norm, then resume=true")
        if any(gather_objects(self.accelerator, stop.received is not None)):
            path = ckpt.checkpoint_dir(self.output_dir, self.step) if saved else self.save_checkpoint()
            raise RunInterrupted(f"stopped by {stop.name} after step {self.step}; checkpoint {path}; "
                                 "continue with the same command and resume=true", stop.received or 15)

    def evaluate(self, rows: list[dict] | None = None, evaluator=None, keep_samples: bool = False,
                 kept_rows: int | None = None) -> dict:
        """Held-out scores (`mmrl.train.loop.evaluation.evaluate`), with `evaluator`'s beside the reward's
        (and the samples of the first `kept_rows` rows with `keep_samples`), and eval.bench's figures."""
        cfg = self.cfg
        rows = (rows if rows is not None else self.inputs.eval_rows)[: cfg.eval.max_prompts]
        with self.collector.rollout_params():
            scores = evaluate(self.policy, rows, self.inputs.reward_fns, self.inputs.reward_weights, cfg.eval.group_size, cfg.seed,
                              combine=cfg.algorithm.reward_combine, gates=cfg.algorithm.gates, evaluator=evaluator, keep_samples=keep_samples,
                              kept_rows=kept_rows, show_progress=cfg.logging.progress and self.accelerator.is_main_process)
            return {**scores, **(self.inputs.bench.scores(self.policy, cfg.seed) if self.inputs.bench else {})}

    def warm_start(self) -> float:
        """Supervised warm start (`warm_start.*`) of the policy on the data set's targets (none when
        `warm_start.steps` is 0); returns its last loss."""
        loss = warm_start(self.cfg, self.policy, self.unwrapped, self.inputs.train_rows,
                          self.accelerator.is_main_process)
        if self.cfg.warm_start.steps > 0:
            self.reference_from_policy()
            if self.accelerator.is_main_process:
                print(f"warm start: {self.cfg.warm_start.steps} supervised steps, last loss {loss:.4g}")
        return loss
