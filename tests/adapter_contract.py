"""The contract every adapter keeps, as one battery of tests (as diffusers' PipelineTesterMixin).

A new adapter opts in with a few lines in `tests/test_adapter_contract.py`:

    class TestMyAdapter(AdapterContract):
        recipe = {"task": "my_family", "policy": {"model": "tiny:..."}, "data": {...},
                  "rewards": {"digit_share": {"weight": 1.0}}, ...}

and gets these checks on a tiny model (override a hook where the family differs):

* each row's log-probs equal the row's scored alone (padding and batching leak nothing);
* micro-batches streamed through `accumulate_gradients` give the gradient of one batch;
* a training step starts exactly on-policy (ratio 1) and moves the weights;
* the log-probs the sampler recorded at rollout time (`Rollout.rollout_logp`) equal the training
  forward's, computed in other batch compositions (rows alone, the batch reversed), within
  `rollout_atol` in fp32, and a training step logs that gap (`rollout/logp_diff_*`);
* the saved weights load with the family's own `from_pretrained` and score the same;
* what it declares before any model loads (`Policy.output_kind`, `Policy.rollout_columns`) is what
  its rollouts are: the kind of their completions, the columns they hand the rewards (checked on
  the rows drawn alone of the first test).
"""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import assert_grads_close, on_policy_step_changes, streamed_grads

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

TEST_REWARDS = str(Path(__file__).parent / "digit_reward.py")
COMMON = {"logging": {"report_to": ["none"], "progress": False}, "max_steps": 1, "seed": 0}


class AdapterContract:
    recipe: dict                     # a tiny recipe of the adapter under test
    stream_sizes: tuple[int, ...] = (2,)  # micro-batch sizes compared with one whole batch
    atol: float = 1e-5               # log-prob tolerance (fp32)
    # rollout-time vs training log-probs (fp32): the sampler's forward runs with a KV cache / other
    # batch shapes than the training forward, so they agree to float rounding, not bit for bit
    rollout_atol: float = 1e-4
    # recipe overrides under which the sampler's log-probs are the training forward's quantity
    comparable: tuple[str, ...] = ()

    # ----- hooks
    def make_trainer(self, tmp_path: Path, *overrides: str) -> Trainer:
        recipe = {**COMMON, **self.recipe}
        recipe.setdefault("reward_modules", [TEST_REWARDS])
        return Trainer(parse_config(recipe, [f"output_dir={tmp_path}", *overrides]))

    def rollout(self, trainer: Trainer, prompts: int = 2):
        rows = trainer.inputs.train_rows[:prompts]
        batch = trainer.policy.rollout(rows, trainer.cfg.algorithm.group_size, seeds=list(range(1, prompts + 1)))
        batch.add_data_columns(rows)
        return batch

    def reload_model(self, model: torch.nn.Module, path: Path) -> torch.nn.Module:
        """The saved model loaded with its own class's `from_pretrained`."""
        return type(model).from_pretrained(path).to(next(model.parameters()).device).eval()

    def assert_same_draw(self, alone, in_batch) -> None:
        """A group drawn alone equals the same group drawn in a batch (its completions)."""
        assert alone.completions == in_batch.completions

    def assert_declared(self, trainer: Trainer, rollout) -> None:
        """`rollout` (drawn by the policy, no data columns added) is what the adapter declares before
        any model loads: its columns, and the kind of its completions."""
        adapter, cfg = type(trainer.policy), trainer.stage.policy
        assert set(rollout.columns) == set(adapter.rollout_columns(cfg))
        kind = adapter.output_kind(cfg)
        shown = trainer.policy.sample_medium(rollout.completions[0], {k: v[0] for k, v in rollout.columns.items()})
        assert shown.kind == ("text" if kind == "episode" else kind)

    # ----- the contract
    def test_each_row_equals_the_row_alone(self, tmp_path):
        """A group drawn alone is the group drawn in a batch (and what the adapter declares before
        loading, `assert_declared`), and every row scores as it does alone."""
        t = self.make_trainer(tmp_path)
        batch = self.rollout(t)
        mask = batch.unit_mask.bool()
        assert mask.any()
        group_size = t.cfg.algorithm.group_size
        with torch.no_grad():
            together = t.policy.logprobs(t.model, batch)[0].float().cpu()
            for g in range(len(batch) // group_size):
                alone = t.policy.rollout([t.inputs.train_rows[g]], group_size, seeds=[g + 1])
                mine = (batch.group_id == g).nonzero().flatten()
                self.assert_same_draw(alone, batch.select(mine))
                self.assert_declared(t, alone)
                single = t.policy.logprobs(t.model, alone)[0].float().cpu()
                width = alone.num_units
                assert torch.equal(alone.unit_mask.bool(), mask[mine, :width]), f"group {g}"
                assert not mask[mine, width:].any(), f"group {g}: units beyond its own width"
                assert torch.allclose(single[alone.unit_mask.bool()], together[mine, :width][alone.unit_mask.bool()],
                                      atol=self.atol), f"group {g}"
            for i in range(len(batch)):
                alone = t.policy.logprobs(t.model, batch.select([i]))[0].float().cpu()
                assert together.shape[1] == alone.shape[1] == batch.num_units
                assert torch.allclose(together[i][mask[i]], alone[0][mask[i]], atol=self.atol), f"row {i}"

    def test_streamed_micro_batches_equal_one_batch(self, tmp_path):
        t = self.make_trainer(tmp_path)
        batch = t.prepare_batch(1)
        assert (batch.advantages != 0).any(), "the recipe's rewards gave no gradient"
        whole, *streamed = streamed_grads(t, batch, (len(batch.rollout), *self.stream_sizes))
        for grads in streamed:
            assert_grads_close(whole, grads)

    def test_a_step_is_on_policy_and_moves_the_weights(self, tmp_path):
        t = self.make_trainer(tmp_path)
        assert on_policy_step_changes(t, rollout_atol=None if self.comparable else self.rollout_atol)

    def test_rollout_logp_is_the_training_forwards_in_any_batch(self, tmp_path):
        t = self.make_trainer(tmp_path, *self.comparable)
        batch = self.rollout(t)
        mask = batch.unit_mask.bool()
        assert batch.rollout_logp is not None and batch.rollout_logp.dtype == torch.float32
        assert batch.rollout_logp.shape == mask.shape and mask.any()
        reverse = torch.arange(len(batch) - 1, -1, -1)
        with torch.no_grad():
            reversed_batch = t.policy.logprobs(t.model, batch.select(reverse))[0].float().cpu()[reverse]
            alone = torch.cat([t.policy.logprobs(t.model, batch.select([i]))[0].float().cpu()
                               for i in range(len(batch))])
        for training in (reversed_batch, alone):
            gap = (training - batch.rollout_logp)[mask].abs().max()
            assert gap <= self.rollout_atol, f"rollout vs training log-probs differ by {gap:.2e}"
        assert t.policy.rollout(t.inputs.train_rows[:1], 2, seeds=[1], greedy=True).rollout_logp is None

    def test_a_step_logs_the_rollout_gap(self, tmp_path):
        t = self.make_trainer(tmp_path, *self.comparable)
        metrics = t.train_step()
        assert metrics["ratio_max_dev"] == 0.0
        assert 0.0 <= metrics["rollout/logp_diff_mean"] <= metrics["rollout/logp_diff_max"] <= self.rollout_atol

    def test_saved_weights_reload_and_score_the_same(self, tmp_path):
        t = self.make_trainer(tmp_path / "run")
        batch = self.rollout(t, prompts=1)
        t.policy.save_pretrained(t.unwrapped, tmp_path / "saved")
        again = self.reload_model(t.unwrapped, tmp_path / "saved")
        assert not any(p is q for p, q in zip(again.parameters(), t.unwrapped.parameters()))
        with torch.no_grad():
            before = t.policy.logprobs(t.model, batch)[0]
            after = t.policy.logprobs(again, batch)[0]
        mask = batch.unit_mask.bool()
        assert torch.allclose(before.float().cpu()[mask], after.float().cpu()[mask], atol=self.atol)
