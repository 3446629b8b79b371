"""The Trainer's whole state saved and resumed: a checkpoint written into a temporary directory and
published atomically (safety/checkpoint.py), the data position (the sampler and the steps drawn ahead
for the rollout worker), a warm start's KL reference, and the checkpoint an error leaves."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

from mmrl.errors import UserError
from mmrl.train.safety import checkpoint as ckpt

REFERENCE_FILE = "reference.safetensors"  # a checkpoint's KL reference, where it is a warm start's


class RunCheckpoints:
    """What the Trainer (loop/trainer.py) saves and loads of itself: its strategy, model, optimizer,
    reference, policy, inputs, collector, step, bad_steps and last_eval."""

    def reference_from_policy(self) -> None:
        """The KL's reference becomes a copy of the policy's weights now (after a warm start, the
        warm-started model rather than the one loaded before it); checkpoints keep it from then on. So do
        distribution matching's real and fake scores when they are the student's copies."""
        if self.updater.scores is not None:
            self.updater.scores.start_from(self.unwrapped)
        if self.reference is None:
            return
        mine, theirs = dict(self.reference.named_parameters()), dict(self.unwrapped.named_parameters())
        if mine.keys() != theirs.keys():
            raise RuntimeError("the reference's parameters are not the policy's: cannot copy the warm start into it")
        with torch.no_grad():
            for name, param in mine.items():
                param.copy_(theirs[name])

    def _failure_checkpoint(self) -> str:
        """After an error in the loop: save the state after the last completed step; say where it is."""
        newest = ckpt.latest_checkpoint(self.output_dir)
        if self._phase == "changing":
            return (f"step {self.step + 1} failed after it began changing the weights or the stage, so the state "
                    f"after step {self.step} cannot be saved; the newest checkpoint is {newest}")
        if self.accelerator.num_processes == 1 and newest != ckpt.checkpoint_dir(self.output_dir, self.step):
            try:  # (with several processes, the others may never reach the save)
                newest = self.save_checkpoint(self._position_before_step if self._phase == "collect" else None)
            except Exception as e:
                return f"the run failed after step {self.step}; saving it failed too ({e}); the newest checkpoint is {newest}"
        saved = newest == ckpt.checkpoint_dir(self.output_dir, self.step)
        return (f"the run failed after step {self.step}, which is saved in {newest}; fix the cause, then resume=true"
                if saved else f"the run failed after step {self.step}; the newest checkpoint is {newest}")

    def save_checkpoint(self, data_position: dict | None = None) -> Path:
        """Write the step's checkpoint into a temporary directory, then publish it (atomic, verified);
        `data_position` replaces the run's own (`_data_position` before a step that failed)."""
        acc = self.accelerator
        final = ckpt.checkpoint_dir(self.output_dir, self.step)
        tmp = ckpt.temporary_dir(self.output_dir, self.step)
        if acc.is_main_process and tmp.exists():
            shutil.rmtree(tmp)
        acc.wait_for_everyone()
        with ckpt.removed_if_unfinished(tmp, self.output_dir, final, acc.is_main_process):
            self.strategy.save(self.model, self.optimizer, self.policy, tmp)
            if acc.is_main_process and self.reference is not None and self.cfg.warm_start.steps > 0:
                # the reference is the warm start's, which the run's model source does not rebuild
                save_model(self.reference, str(tmp / REFERENCE_FILE))  # (tied weights stored once)
            if acc.is_main_process and self.updater.scores is not None:
                self.updater.scores.save(tmp)
            if acc.is_main_process:
                position = self._data_position() if data_position is None else data_position
                state = {"step": self.step, **position, "bad_steps": self.bad_steps}
                if self.last_eval is not None and self.last_eval[0] == self.step:
                    state["eval_reward_mean"] = self.last_eval[1]
                ckpt.publish(tmp, final, state)
        if acc.is_main_process and self.cfg.save_total_limit is not None:
            ckpt.prune(self.output_dir, self.cfg.save_total_limit, self.cfg.eval.keep_best)
        acc.wait_for_everyone()
        return final

    def _data_position(self) -> dict:
        """The data sampler's state and the prompts of the steps drawn ahead for the rollout worker
        (a resumed run asks for their rollouts again): what a resumed run needs to draw the same prompts."""
        return {"sampler": self.inputs.sampler.state_dict(),
                "drawn_ahead": {str(step): list(indices) for step, indices in self.collector.prefetched.items()}}

    def load_checkpoint(self, path: Path) -> None:
        try:
            self.strategy.load(self.model, self.optimizer, path)
        except RuntimeError as e:  # a state dict of another model: torch lists every tensor
            if "state_dict" not in str(e):
                raise
            first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), "")
            raise UserError(f"checkpoint {path} does not fit this run's model ({first} ...); resume with the "
                            "settings it was saved with (the run's config.json)") from None
        if (path / REFERENCE_FILE).is_file():
            if self.reference is None:
                raise UserError(f"checkpoint {path} holds a KL reference ({REFERENCE_FILE}, a warm start's) and this "
                                "run has none (algorithm.beta); resume with the settings it was saved with")
            load_model(self.reference, str(path / REFERENCE_FILE))
        if self.updater.scores is not None:
            self.updater.scores.load(path)
        state = ckpt.read_trainer_state(path)
        self.step = int(state["step"])
        self._enter_stage(self.plan.stage_at(self.step))  # the checkpoint's data and settings
        self.bad_steps = int(state.get("bad_steps", 0))
        self.inputs.sampler.load_state_dict(state["sampler"])
        self.collector.prefetched = {int(step): indices for step, indices in state.get("drawn_ahead", {}).items()}
