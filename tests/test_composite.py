"""The composite policy (`task: composite`, tasks/composite/): a thinker's tokens and a generator's
denoising steps in one episode. Each part's learning rate, clip range, LoRA and freezing, how one
rollout addresses the parts' units, the checks made before anything loads, and 1 against 2
processes. (The adapter contract on its pairings, the character-level Qwen2 thinker with the pixel
flow MMDiT, SD3, Wan 2.1 text-to-video, Janus and Emu3, the Qwen2.5-VL thinker with the pixel flow,
and one Janus thinking and drawing, is in tests/test_adapter_contract.py.)"""

from pathlib import Path

import pytest
import torch
from adapter_contract import COMMON

from mmrl.config.parse import parse_config
from mmrl.errors import UserError
from mmrl.train.loop.trainer import Trainer

THINKER = {"model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2}, "max_new_tokens": 6}
PIXEL_FLOW = {"model": "tiny:pixel-flow", "height": 16, "width": 16, "num_steps": 3, "eval_num_steps": 3,
              "noise_level": 0.7}
SD3 = {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 3, "eval_num_steps": 3, "noise_level": 0.7}


def composite_recipe(generator: dict, size: int = 16, **policy) -> dict:
    return {"task": "composite", "policy": {"thinker": THINKER, "generator": generator, **policy},
            "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": size}},
            "rewards": {"colour_shape": {"weight": 1.0}}, "reward_modules": [],
            "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
            "optim": {"lr": 1e-3, "prompts_per_step": 2}}


def trainer(tmp_path: Path, recipe: dict, *overrides: str) -> Trainer:
    return Trainer(parse_config({**COMMON, **recipe}, [f"output_dir={tmp_path}", *overrides]))


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _moved(before: dict, module: torch.nn.Module) -> bool:
    return any(not torch.equal(before[k], v) for k, v in module.state_dict().items())


def test_one_rollout_holds_each_part_in_its_columns(tmp_path):
    """The thinker's tokens in columns [0, 6), the generator's steps in [6, 9): each part's units are
    those its own adapter draws alone (same seeds), and a slice across both parts scores each part's
    units as its own adapter scores its own rollout."""
    from mmrl.core.seeding import derive_seed
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW))
    rows = t.inputs.train_rows[:2]
    batch = t.policy.rollout(rows, 3, seeds=[1, 2])
    thinker, generator = t.policy.parts["thinker"], t.policy.parts["generator"]
    thought = thinker.rollout(rows, 3, seeds=[1, 2])
    drawn = generator.rollout(list(thought.completions), 1, [derive_seed(s, k) for s in (1, 2) for k in range(3)])
    width = thought.num_units
    assert batch.num_units == 6 + 3 and width <= 6
    assert torch.equal(batch.unit_mask[:, :width], thought.unit_mask.float())
    assert not batch.unit_mask[:, width:6].any()
    assert torch.equal(batch.unit_mask[:, 6:], drawn.unit_mask.float())
    assert batch.columns["thought"] == thought.completions
    assert torch.equal(batch.extras["generator/latents"], drawn.extras["latents"])
    with torch.no_grad():
        across = t.policy.logprobs(t.model, batch, slice(2, 8))[0]
        own_tokens = thinker.logprobs(thinker.model, thought)[0]
        own_steps = generator.logprobs(generator.model, drawn, slice(0, 2))[0]
    mask = batch.unit_mask[:, 2:8].bool()
    expected = torch.cat([torch.nn.functional.pad(own_tokens[:, 2:], (0, 6 - width)), own_steps], dim=1)
    assert torch.allclose(across[mask], expected[mask], atol=1e-5)


@pytest.mark.parametrize("frozen", ["none", "thinker", "generator"])
def test_a_frozen_part_samples_and_does_not_train(tmp_path, frozen):
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW, freeze=frozen), "optim.lr=1e-2")
    parts = {name: t.policy.parts[name].model for name in ("thinker", "generator")}
    before = {name: _weights(m) for name, m in parts.items()}
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[1, 2])
    assert bool(batch.unit_mask[:, :6].any()) is (frozen != "thinker")
    assert bool(batch.unit_mask[:, 6:].any()) is (frozen != "generator")
    assert len(t.optimizer.param_groups) == (1 if frozen != "none" else 2)
    t.train_step()
    for name, module in parts.items():
        assert _moved(before[name], module) is (name != frozen), name


def test_each_part_has_its_own_learning_rate(tmp_path):
    """thinker_lr 0 leaves the thinker where it was while the generator trains at optim.lr; a new base
    rate (a stage's) keeps each part's ratio to it."""
    from mmrl.train.loop.parts import set_base_lr
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW, thinker_lr=0.0, generator_lr=5e-3), "optim.lr=1e-2")
    assert [g["lr"] for g in t.optimizer.param_groups] == [0.0, 5e-3]
    thinker = _weights(t.policy.parts["thinker"].model)
    generator = _weights(t.policy.parts["generator"].model)
    t.train_step()
    assert not _moved(thinker, t.policy.parts["thinker"].model)
    assert _moved(generator, t.policy.parts["generator"].model)
    set_base_lr(t.optimizer, t.scheduler, 2e-2)
    assert t.scheduler.base_lrs == pytest.approx([0.0, 1e-2])


def test_each_part_takes_its_own_lora_which_loads_on_the_stock_class(tmp_path):
    from peft import PeftModel

    from mmrl.tasks.composite.model import CompositeModel
    from mmrl.tasks.demos.tiny_pipelines import tiny_sd3
    from mmrl.tasks.model_loading import load_tiny
    t = trainer(tmp_path / "run", composite_recipe(SD3, size=32, thinker_lora={"r": 4, "alpha": 8},
                                                   generator_lora={"r": 2, "alpha": 4}), "optim.lr=1e-2")
    trained = [n for n, p in t.unwrapped.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert any(n.startswith("parts.thinker.") for n in trained) and any(n.startswith("parts.generator.") for n in trained)
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "saved")
    assert (tmp_path / "saved" / "generator" / "pytorch_lora_weights.safetensors").exists()  # diffusers' LoRA
    base = load_tiny("tiny:qwen2-char", THINKER["tiny_args"], "float32")[0]
    thinker = PeftModel.from_pretrained(base, tmp_path / "saved" / "thinker")
    pipe = tiny_sd3()  # the stock StableDiffusion3Pipeline, untrained, loads the generator's LoRA itself
    pipe.load_lora_weights(tmp_path / "saved" / "generator")
    generator = pipe.transformer
    batch = t.policy.rollout(t.inputs.train_rows[:1], 3, seeds=[1])
    again = CompositeModel({"thinker": thinker, "generator": generator}).eval()
    with torch.no_grad():
        before, after = t.policy.logprobs(t.model, batch)[0], t.policy.logprobs(again, batch)[0]
    mask = batch.unit_mask.bool()
    assert torch.allclose(before[mask], after[mask], atol=1e-5)


def test_problems_are_named_before_anything_loads(tmp_path):
    with pytest.raises(Exception, match=r"policy\.thinker\.temperature"):
        trainer(tmp_path, composite_recipe(PIXEL_FLOW, thinker={**THINKER, "temperature": 0}))
    with pytest.raises(Exception, match=r"policy\.generator_lora\.r=4: the generator is frozen"):
        trainer(tmp_path, composite_recipe(PIXEL_FLOW, freeze="generator", generator_lora={"r": 4}))
    with pytest.raises(Exception, match=r"policy\.thinker_task=diffusion: its completions are 'image'"):
        trainer(tmp_path, composite_recipe(PIXEL_FLOW, thinker_task="diffusion", thinker=PIXEL_FLOW))
    with pytest.raises(UserError, match=r"optim\.lora\.r=4: task composite gives each part its own LoRA"):
        trainer(tmp_path, composite_recipe(PIXEL_FLOW), "optim.lora.r=4")


@pytest.mark.parametrize("name", ["think_draw", "think_draw_unigrpo"])
def test_the_shipped_recipe_trains_two_steps(tmp_path, name):
    import math

    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    t = Trainer(load_recipe(RECIPES.get(name), [
        f"output_dir={tmp_path}", "algorithm.group_size=2", "optim.prompts_per_step=2", "max_steps=2",
        "logging.progress=false", "logging.report_to=[none]"]))
    for _ in range(2):
        metrics = t.train_step()
        assert math.isfinite(metrics["loss"]) and metrics["ratio_max_dev"] == 0.0
    scores = t.evaluate(keep_samples=True, kept_rows=1)  # greedy episodes: the thinker's argmax, the ODE drawing
    assert all(math.isfinite(v) for k, v in scores.items() if isinstance(v, float))


@pytest.mark.slow  # 51 s on the loaded 2-core machine (2026-11-29): two launches of two steps
def test_one_and_two_processes_give_the_same_weights(tmp_path):
    """1 process and 2 (gloo on CPU, the default data-parallel strategy): the same rewards, loss and
    weights of both parts after two steps with a KL to the frozen reference, with the harness and
    tolerances of tests/test_sharding.py."""
    from test_sharding import one_and_two_processes, write
    recipe = write(tmp_path, {**composite_recipe(PIXEL_FLOW), **COMMON, "max_steps": 2,
                              "algorithm": {"group_size": 3, "beta": 0.04},
                              "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
                              "logging": {"report_to": ["none"], "progress": False}})
    one, weights = one_and_two_processes(recipe, tmp_path, 2)
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one)  # real updates happened
    assert any(k.startswith("thinker/") for k in weights) and any(k.startswith("generator/") for k in weights)


def test_each_unit_clipped_at_its_own_range_is_the_hand_computation():
    """policy_loss with a clip range per unit (`Policy.unit_clip`) against a loop over the units:
    max(-A r, -A clip(r, 1 - eps_low_u, 1 + eps_high_u)), summed with the weights; and the recipe's
    range given per unit is the loss without one."""
    from mmrl.config.algorithm import AlgorithmConfig
    from mmrl.core.objectives import policy_loss
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5) * 0.3, torch.randn(3, 5) * 0.3
    adv, mask, weights = torch.tensor([1.0, -0.5, 2.0]), torch.ones(3, 5), torch.full((3, 5), 0.1)
    low = torch.tensor([[0.2] * 2 + [0.01] * 3] * 3)
    high = torch.tensor([[0.28] * 2 + [0.02] * 3] * 3)
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.28)
    got = policy_loss(logp, old, adv, mask, weights, cfg, clip_range=(low, high)).loss
    expected = 0.0
    for i in range(3):
        for u in range(5):
            r = float(torch.exp(logp[i, u] - old[i, u]))
            clipped = min(max(r, 1 - float(low[i, u])), 1 + float(high[i, u]))
            expected += 0.1 * max(-float(adv[i]) * r, -float(adv[i]) * clipped)
    assert float(got) == pytest.approx(expected, abs=1e-6)
    recipe_range = (torch.full((3, 5), 0.2), torch.full((3, 5), 0.28))
    assert torch.allclose(policy_loss(logp, old, adv, mask, weights, cfg, clip_range=recipe_range).loss,
                          policy_loss(logp, old, adv, mask, weights, cfg).loss)
    assert float(got) != pytest.approx(float(policy_loss(logp, old, adv, mask, weights, cfg).loss), abs=1e-4)


def test_each_part_clips_at_its_own_range(tmp_path):
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW, generator_clip=[1e-4, 2e-4]),
                "algorithm.eps_low=0.2", "algorithm.eps_high=0.28", "algorithm.mu=2")
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[1, 2])
    low, high = t.policy.unit_clip(batch, slice(4, 8), (0.2, 0.28))
    assert torch.equal(low[0], torch.tensor([0.2, 0.2, 1e-4, 1e-4])) and torch.equal(high[0], torch.tensor([0.28, 0.28, 2e-4, 2e-4]))
    plain = trainer(tmp_path / "plain", composite_recipe(PIXEL_FLOW), "algorithm.eps_low=0.2",
                    "algorithm.eps_high=0.28", "algorithm.mu=2")
    assert plain.policy.unit_clip(batch, slice(None), (0.2, 0.28)) is None
    # two update passes: the second clips the generator's steps at its own range only, so the same step
    # leaves the thinker where the recipe's range leaves it and the generator elsewhere
    for run in (t, plain):
        run.train_step()
    own = {n: _weights(t.policy.parts[n].model) for n in ("thinker", "generator")}
    assert not _moved(own["thinker"], plain.policy.parts["thinker"].model)
    assert _moved(own["generator"], plain.policy.parts["generator"].model)


UNIGRPO = ["algorithm.beta=1.0", "algorithm.kl_estimator=closed_form", "policy.generator.kl_form=velocity_mse",
           "policy.generator.classifier_free_guidance=false", "policy.generator.guidance_scale=1.0"]


def test_velocity_mse_is_the_hand_computation_on_the_generator_and_zero_on_the_thinker(tmp_path):
    """UniGRPO's regulariser (`policy.generator.kl_form: velocity_mse`, closed_form): each generator step's
    mean_d (v_theta - v_ref)^2 from the two models' velocity predictions at the step's latents, against
    the reference before the generator moved; the thinker's tokens carry none."""
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW), *UNIGRPO)
    generator = t.policy.parts["generator"]
    with torch.no_grad():  # the trained generator moves away from its frozen reference
        for p in generator.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch = t.policy.rollout(t.inputs.train_rows[:2], 3, seeds=[1, 2])
    with torch.no_grad():
        logp, _, kl = t.policy.logprobs_and_kl(t.model, t.updater.reference_model, batch, slice(None))
        plain = t.policy.logprobs(t.model, batch)[0]
    mask = batch.unit_mask.bool()
    assert torch.allclose(logp[mask], plain[mask], atol=1e-5)
    assert not kl[:, :6].any()
    sub = batch.extras
    rows = torch.arange(len(batch))
    reference = t.reference.parts["generator"]
    for k in range(3):
        if not batch.unit_mask[:, 6 + k].any():
            continue
        x, step_t = sub["generator/latents"][:, k], sub["generator/timesteps"][0, k]
        cond = {key[len("generator/"):]: v for key, v in sub.items() if key.startswith("generator/pos/")}
        with torch.no_grad():
            v = generator.family.predict(generator.model, x, step_t, cond, 1.0, False)
            v_ref = generator.family.predict(reference, x, step_t, cond, 1.0, False)
        expected = ((v - v_ref) ** 2).flatten(1).mean(1)
        assert expected.min() > 0
        assert torch.allclose(kl[rows, 6 + k], expected, rtol=1e-4, atol=1e-7), k


def test_the_unigrpo_settings_train_and_are_checked(tmp_path):
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW), *UNIGRPO)
    metrics = t.train_step()
    assert metrics["ratio_max_dev"] == 0.0 and metrics["kl"] == 0.0  # the first step: the reference itself
    with pytest.raises(Exception, match=r"kl_form=velocity_mse.*classifier_free_guidance=true"):
        trainer(tmp_path / "cfg", composite_recipe(PIXEL_FLOW), *UNIGRPO[:3],
                "policy.generator.classifier_free_guidance=true")


HERE = Path(__file__).parent
PAIRINGS = {
    # a vision-language thinker reads the row's image and writes; the pixel flow MMDiT draws its text
    "vlm+pixel-flow": {"thinker_task": "vlm", "thinker": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 5},
                       "generator": PIXEL_FLOW, "data": {"name": "shapes", "args": {"n_train": 8, "n_eval": 2, "size": 56}},
                       "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(HERE / "image_reward.py")]},
    # the text thinker, then Wan 2.1 text-to-video drawing a clip of its text
    "causal_lm+wan-t2v": {"generator": {"model": "tiny:wan-t2v", "height": 32, "width": 32, "num_frames": 5,
                                        "num_steps": 2, "eval_num_steps": 2, "noise_level": 0.7},
                          "rewards": {"mean_red_video": {"weight": 1.0}},
                          "reward_modules": [str(HERE / "video_reward.py")]},
}


@pytest.mark.parametrize("pairing", list(PAIRINGS))
def test_other_pairings_train_on_policy_and_move_both_parts(tmp_path, pairing):
    """A vision-language thinker, and a video generator: a step starts exactly on-policy, the sampler's
    log-probs are the training forward's, and both parts move."""
    from helpers import on_policy_step_changes
    spec = dict(PAIRINGS[pairing])
    policy = {"thinker": spec.pop("thinker", THINKER), "generator": spec.pop("generator"),
              **({"thinker_task": spec.pop("thinker_task")} if "thinker_task" in spec else {})}
    recipe = {**composite_recipe(PIXEL_FLOW), "policy": policy, **spec}
    t = trainer(tmp_path, recipe, "optim.lr=1e-2")
    changed = on_policy_step_changes(t)
    assert any(n.startswith("parts.thinker.") for n in changed) and any(n.startswith("parts.generator.") for n in changed)


def test_rollouts_drawn_apart_join_as_one(tmp_path):
    """`concat` (dynamic sampling's draws joined): each part's rollouts joined by its own adapter, and every
    row scores in the joined batch as it did in its own draw."""
    t = trainer(tmp_path, composite_recipe(PIXEL_FLOW, thinker={**THINKER, "max_new_tokens": 6}))
    rows = t.inputs.train_rows
    first, second = (t.policy.rollout(rows[i:i + 1], 3, seeds=[i + 1]) for i in (0, 1))
    joined = t.policy.concat([first, second])
    assert len(joined) == 6 and joined.num_units == first.num_units == 9
    assert joined.columns["thought"] == first.columns["thought"] + second.columns["thought"]
    with torch.no_grad():
        together = t.policy.logprobs(t.model, joined)[0]
        apart = torch.cat([t.policy.logprobs(t.model, r)[0] for r in (first, second)])
    mask = joined.unit_mask.bool()
    assert torch.equal(mask, torch.cat([first.unit_mask, second.unit_mask]).bool())
    assert torch.allclose(together[mask], apart[mask], atol=1e-5)
    assert torch.equal(joined.rollout_logp, torch.cat([first.rollout_logp, second.rollout_logp]))


@pytest.mark.slow  # two launches of two steps, as the data-parallel test above
@pytest.mark.parametrize("strategy", ["fsdp"])
def test_one_process_and_two_sharded_give_the_same_weights(tmp_path, strategy):
    """The composite under a sharding strategy on 2 processes against 1 process: the same rewards,
    loss and weights of both parts after two steps with a KL to the frozen reference."""
    from test_sharding import assert_same, exported, launch, write
    recipe = write(tmp_path, {**composite_recipe(PIXEL_FLOW), **COMMON, "max_steps": 2,
                              "algorithm": {"group_size": 3, "beta": 0.04},
                              "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 2},
                              "logging": {"report_to": ["none"], "progress": False}})
    one = launch(recipe, tmp_path / "one", processes=1)
    two = launch(recipe, tmp_path / "two", f"distributed.strategy={strategy}")
    weights = exported(tmp_path / "one", 2)
    assert_same(one, two, weights, exported(tmp_path / "two", 2))
    assert any(r["loss"] != 0 for r in one) and any(r["kl"] > 0 for r in one)
    assert any(k.startswith("thinker/") for k in weights) and any(k.startswith("generator/") for k in weights)


def test_a_strategy_that_gathers_in_module_calls_is_refused_by_its_description(tmp_path):
    """Under a view whose parameters are whole only inside each module's call (the ZeRO-3 kind), the
    composite is refused naming the view's description (2 processes there left the generator 7e-4 off)."""
    from mmrl.core.parallel import ParallelView
    from mmrl.errors import UserError

    class GatheringView(ParallelView):
        gathers_in_module_calls = True
        description = "the gathering view of this test"

    policy = trainer(tmp_path, composite_recipe(PIXEL_FLOW)).policy
    with pytest.raises(UserError, match="task composite under the gathering view of this test: not equal"):
        policy.use_parallel(GatheringView())
