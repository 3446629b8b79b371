"""The diffusion update forwards each step (unit) on the rows of a micro-batch that train it only:
one update pass over a whole-batch micro-batch gives the loss, the logged sums and every
parameter's gradient of micro-batches of one row (where a row is forwarded on its own trained
steps only, the old computation and the new alike), and calls the denoiser on as many rows as
there are trained (row, step) pairs, per forward of the policy and of the reference."""

import math
from pathlib import Path

import pytest
import torch
from helpers import assert_grads_close

from mmrl.config.parse import load_recipe
from mmrl.core.parallel import ParallelView
from mmrl.core.regularisers import closed_form_kl
from mmrl.registry import RECIPES
from mmrl.train.loop.trainer import Trainer

COMMON = ["optim.prompts_per_step=2", "max_steps=1", "logging.progress=false", "logging.report_to=[none]",
          "algorithm.eps_low=0.2", "algorithm.eps_high=0.2"]
RANDOM_STEPS = ["policy.schedule.kind=random_fraction", "policy.schedule.fraction=0.5"]
METHODS = {  # recipe, overrides
    "dancegrpo": ("t2i_dancegrpo", ["policy.num_steps=6", "algorithm.group_size=4", "algorithm.mu=2",
                                    "algorithm.rollout_correction=tis", "algorithm.beta=0.01"]),
    "flowgrpo": ("t2i_flowgrpo", ["policy.num_steps=4", "algorithm.group_size=4"]),
    "branchgrpo": ("t2i_branchgrpo", ["algorithm.group_size=4"]),
    "chunk": ("t2i_chunk", ["policy.num_steps=8", "policy.schedule.sizes=[2,2,2,2]", "policy.schedule.sample=1",
                            "algorithm.chunks=[2,2,2,2]", "algorithm.group_size=4"]),
    "nft": ("t2i_nft", ["policy.num_steps=6", "policy.forward_fraction=0.5", "algorithm.group_size=4"]),
    "flowdppo": ("t2i_flowdppo", ["policy.num_steps=5", "algorithm.group_size=4", *RANDOM_STEPS]),
    "grpo_guard": ("t2i_grpo_guard", ["policy.num_steps=5", "algorithm.group_size=4", *RANDOM_STEPS]),
}


def count_rows(modules, rows):
    """Forward hooks adding the batch size of each denoiser call to `rows[0]`."""
    def hook(module, args, kwargs, out):
        rows[0] += (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).shape[0]
    return [m.register_forward_hook(hook, with_kwargs=True) for m in {id(m): m for m in modules}.values()]


def update_pass(t, batch, size):
    """Old and reference log-probs (and old means) at the trained weights, then one accumulation pass
    at weights moved off them (so that ratios, clips and the KL are not trivial): (sums, gradients,
    rows the denoiser took in that pass)."""
    updater, algo = t.updater, t.cfg.algorithm
    t.cfg.optim.micro_batch_size = size
    chunks = updater.micro_batches(batch)
    old_logp, ref_logp, old_means = updater._old_and_reference(batch, chunks, [batch] * algo.mu, False)
    params = [p for p in t.model.parameters() if p.requires_grad]
    kept = [p.detach().clone() for p in params]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen) * 1e-2)
    t.optimizer.zero_grad(set_to_none=True)
    rows = [0]
    handles = count_rows([m for m in (t.policy.family.denoiser, t.reference) if m is not None], rows)
    try:
        sums = updater.accumulate_gradients(batch, chunks, old_logp[0], ref_logp[0], with_entropy=True,
                                            old_means=old_means[0])
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for p, k in zip(params, kept):
                p.copy_(k)
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    return sums, grads, rows[0]


@pytest.mark.parametrize("method", list(METHODS))
def test_each_step_is_forwarded_on_the_rows_that_train_it(method, tmp_path):
    recipe, overrides = METHODS[method]
    t = Trainer(load_recipe(RECIPES.get(recipe), [f"output_dir={tmp_path}", *COMMON, *overrides]))
    batch = t.prepare_batch(1)
    t.cfg.optim.micro_batch_size = len(batch.rollout)
    active = torch.cat(t.updater.micro_batches(batch))
    mask = batch.rollout.unit_mask[active].bool()
    assert len(active) > 1 and mask.any()
    whole, whole_grads, whole_rows = update_pass(t, batch, len(batch.rollout))
    alone, alone_grads, _ = update_pass(t, batch, 1)
    assert whole.keys() == alone.keys()
    for key in whole:
        if key != "ratio_max_dev":  # a max over the units, not a sum
            assert math.isclose(whole[key], alone[key], rel_tol=1e-5, abs_tol=1e-6), (key, whole[key], alone[key])
    assert math.isclose(whole["ratio_max_dev"], alone["ratio_max_dev"], rel_tol=1e-4, abs_tol=1e-6)
    assert whole["units"] == mask.sum() and whole["loss"] != 0.0
    assert_grads_close(whole_grads, alone_grads)
    # a denoiser row per (row, trained step), twice under CFG, and as many again for the reference's KL
    per_unit = (2 if t.policy.cfg.classifier_free_guidance else 1) * (2 if closed_form_kl(t.cfg.algorithm) else 1)
    assert whole_rows == int(mask.sum()) * per_unit


class ShardedEverywhere(ParallelView):
    """A view whose every model is split over the processes (every forward is a collective)."""

    def is_sharded(self, model):
        return True


def test_a_sharded_model_forwards_every_unit_of_a_slice(tmp_path):
    """Where the denoiser is sharded every process must run as many forwards: a unit of a chunk that
    no row of the micro-batch trains is forwarded on one row (its value masked), not skipped."""
    recipe, overrides = METHODS["chunk"]
    t = Trainer(load_recipe(RECIPES.get(recipe), [f"output_dir={tmp_path}", *COMMON, *overrides]))
    batch = t.prepare_batch(1)
    t.cfg.optim.micro_batch_size = len(batch.rollout)
    mb = batch.rollout.select(torch.cat(t.updater.micro_batches(batch)))
    chunks = [units for units, _ in t.updater.unit_slices(mb)]
    mask = torch.cat([mb.unit_mask[:, units] for units in chunks], 1).bool()
    untrained = int((~mask.any(0)).sum())
    assert untrained > 0
    rows, logps = {}, {}
    for view in (ParallelView(), ShardedEverywhere()):
        t.policy.use_parallel(view)
        count = [0]
        handles = count_rows([t.policy.family.denoiser], count)
        with torch.no_grad():
            logps[view] = torch.cat([t.policy.logprobs(t.model, mb, units)[0] for units in chunks], 1)
        for h in handles:
            h.remove()
        rows[type(view)] = count[0]
    whole, sharded = logps.values()
    assert torch.equal(whole[mask], sharded[mask])
    assert rows[ParallelView] == int(mask.sum())
    assert rows[ShardedEverywhere] == int(mask.sum()) + untrained


@pytest.mark.slow  # two training runs, one on 2 processes (the sharded forward's rule stays in the default run, above)
@pytest.mark.parametrize("method", ["chunk", "random_steps"])
def test_rows_training_different_steps_train_sharded_on_two_processes_as_on_one(tmp_path, method):
    """FSDP (lockstep: every forward a collective) with chunks (Chunk-GRPO) or steps (DanceGRPO's
    random fraction) drawn per row, so that the processes' micro-batches train different steps:
    every process runs as many forwards, and the run equals one process's (both hung before)."""
    from test_sharding import assert_same, exported, launch, write
    schedule, algorithm = {
        "chunk": ({"kind": "chunks", "sizes": [2, 2], "sample": 1}, {"ratio_level": "chunk", "chunks": [2, 2]}),
        "random_steps": ({"kind": "random_fraction", "fraction": 0.34}, {}),
    }[method]
    recipe = write(tmp_path, {
        "task": "diffusion",
        "policy": {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4, "eval_num_steps": 4,
                   "noise_level": 0.7, "schedule": schedule},
        "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
        "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
        "algorithm": {"group_size": 3, **algorithm},
        "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
        "logging": {"report_to": ["none"], "progress": False}, "max_steps": 2})
    one = launch(recipe, tmp_path / "one", processes=1)
    two = launch(recipe, tmp_path / "two", "distributed.strategy=fsdp")
    assert any(r["loss"] != 0 for r in one)
    assert_same(one, two, exported(tmp_path / "one", 2), exported(tmp_path / "two", 2))
