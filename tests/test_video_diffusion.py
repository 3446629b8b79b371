"""The diffusion adapter's video families on tiny random Wan T2V / Wan I2V / HunyuanVideo pipelines:
the ODE path equals the stock pipeline's call, every sampler's log-probs are on-policy on 5-D
latents, the video settings' errors, a Wan LoRA in the stock pipeline, the video recipes."""

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from PIL import Image

from mmrl.config.parse import load_recipe
from mmrl.registry import RECIPES
from mmrl.train.loop.trainer import Trainer

SIZE, FRAMES = 32, 5
IMAGE = Image.new("RGB", (40, 24), (200, 30, 30))
ROW = {"prompt": "red circle", "image": IMAGE}
# name: (model, classifier-free guidance, extra settings)
FAMILIES = {"wan-t2v": ("tiny:wan-t2v", True, {}),
            "wan-i2v": ("tiny:wan-i2v", True, {"image_column": "image"}),
            "hunyuan-video": ("tiny:hunyuan-video", False, {})}


def make(name, **kw):
    model, guided, extra = FAMILIES[name]
    args = dict(model=model, height=SIZE, width=SIZE, num_frames=FRAMES, num_steps=3, eval_num_steps=3,
                sampler="flow_sde", noise_level=0.7, classifier_free_guidance=guided, **extra)
    args.update(kw)
    return DiffusionPolicy(DiffusionConfig(**args))


@pytest.fixture(scope="module")
def policies():
    return {name: make(name) for name in FAMILIES}


def stock_call(policy, name, **kw):
    args = dict(num_inference_steps=3, height=SIZE, width=SIZE, num_frames=FRAMES, guidance_scale=4.5,
                generator=torch.Generator().manual_seed(7), output_type="latent")
    if name == "wan-i2v":
        args["image"] = IMAGE
    args.update(kw)
    return policy.pipe(prompt=["red circle"], **args).frames


@pytest.mark.parametrize("name", list(FAMILIES))
def test_zero_noise_reproduces_the_stock_pipeline(policies, name):
    policy = policies[name]
    policy.cfg.noise_level = 0.0
    try:
        ours = policy.rollout([ROW], 2, seeds=[7])
    finally:
        policy.cfg.noise_level = 0.7
    stock = stock_call(policy, name)
    assert ours.extras["latents"].dim() == 6  # [N, U + 1, C, F, H, W]
    assert ours.unit_mask.sum() == 0
    for row in range(2):
        assert torch.allclose(ours.extras["latents"][row, -1], stock[0].float(), atol=1e-5)
    # decoded like the stock pipeline: a list of PIL frames per video
    frames = stock_call(policy, name, output_type="pil")[0]
    assert len(ours.completions[0]) == len(frames)
    assert np.abs(np.asarray(ours.completions[0][2], dtype=float) - np.asarray(frames[2], dtype=float)).max() <= 1


@pytest.mark.parametrize("sampler", ["flow_sde", "dance", "cps"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_sampler_is_on_policy_on_video_latents(policies, name, sampler):
    policy = policies[name]
    policy.cfg.sampler = sampler
    try:
        rows = [ROW, {"prompt": "blue square", "image": Image.new("RGB", (32, 32), (10, 10, 200))}]
        batch = policy.rollout(rows, 2, seeds=[5, 6])
        mask = batch.unit_mask.bool()
        assert mask[:, :-1].all() and not mask[:, -1].any()
        logp, _ = policy.logprobs(policy.model, batch)
        assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-5)
        _, _, kl = policy.logprobs_and_kl(policy.model, lambda: contextlib.nullcontext(policy.model),
                                          batch)
        assert torch.equal(kl[mask], torch.zeros_like(kl[mask]))  # the closed-form KL to itself
        alone = policy.rollout(rows[1:], 2, seeds=[6])  # a group depends on its row and seed only
        assert torch.allclose(alone.extras["latents"], batch.extras["latents"][2:], atol=1e-5)
    finally:
        policy.cfg.sampler = "flow_sde"


def test_image_to_video_is_conditioned_on_the_rows_image(policies):
    policy = policies["wan-i2v"]
    red = policy.rollout([ROW], 1, seeds=[1], greedy=True)
    blue = policy.rollout([{"prompt": "red circle", "image": Image.new("RGB", (32, 32), (0, 0, 255))}], 1,
                          seeds=[1], greedy=True)
    first = [np.asarray(v[0][0], dtype=np.float32) for v in (red.completions, blue.completions)]
    assert not np.array_equal(*first)
    with pytest.raises(ValueError, match="policy.image_column='image': prompt row 0"):
        policy.rollout(["red circle"], 1, seeds=[1])


def test_video_settings_errors_name_the_field():
    with pytest.raises(ValueError, match="policy.image_column is not set"):
        make("wan-i2v", image_column=None)
    with pytest.raises(ValueError, match="policy.num_frames=4"):
        make("wan-t2v", num_frames=4)
    with pytest.raises(ValueError, match="policy.embedded_guidance_scale is not set"):  # true CFG: test_hunyuan_true_cfg.py
        make("hunyuan-video", classifier_free_guidance=True)


def test_vae_tiling_uses_the_vaes_own_tiling():
    policy = make("wan-t2v", vae_tiling=True)
    assert policy.pipe.vae.use_tiling


def test_gradient_checkpointing_of_the_video_transformer_gives_the_same_gradients():
    grads = []
    for checkpointing in (False, True):
        policy = make("wan-t2v", gradient_checkpointing=checkpointing)
        assert policy.model.gradient_checkpointing is checkpointing
        batch = policy.rollout(["red circle"], 2, seeds=[4])
        logp, _ = policy.logprobs(policy.model, batch, slice(0, 2))
        logp.sum().backward()
        grads.append({n: p.grad for n, p in policy.model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


WAN_RECIPE = {"task": "diffusion",
              "policy": {"model": "tiny:wan-t2v", "height": SIZE, "width": SIZE, "num_frames": FRAMES, "num_steps": 3,
                         "eval_num_steps": 3, "noise_level": 0.7},
              "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": SIZE}},
              "rewards": {"mean_red_video": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "video_reward.py")],
              "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
              "optim": {"lr": 1e-3, "prompts_per_step": 2}, "logging": {"report_to": ["none"], "progress": False},
              "max_steps": 1}


def train_wan(tmp_path, *overrides):
    from mmrl.config.parse import parse_config
    from mmrl.train.safety.checkpoint import latest_checkpoint
    t = Trainer(parse_config(WAN_RECIPE, [f"output_dir={tmp_path}", *overrides]))
    t.train()
    t.policy.cfg.noise_level = 0.0  # the trained policy's ODE sample
    ours = t.policy.rollout([ROW], 1, seeds=[7]).extras["latents"][0, -1]
    return t, latest_checkpoint(tmp_path), ours


def test_wan_lora_loads_into_the_stock_pipeline_and_merges_with_export(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline

    from mmrl.cli.main import main
    from mmrl.tasks.demos.tiny_pipelines import tiny_wan_t2v
    _, checkpoint, ours = train_wan(tmp_path, "optim.lora.r=4", "optim.lr=0.05")
    pipe = tiny_wan_t2v()  # the stock pipeline, as users build it
    assert isinstance(pipe, WanPipeline)
    call = dict(prompt=["red circle"], num_inference_steps=3, height=SIZE, width=SIZE, num_frames=FRAMES,
                guidance_scale=4.5, output_type="latent")
    base = pipe(**call, generator=torch.Generator().manual_seed(7)).frames
    pipe.load_lora_weights(checkpoint / "model")
    tuned = pipe(**call, generator=torch.Generator().manual_seed(7)).frames
    assert (tuned - base).abs().max() > 1e-3  # the LoRA changes the stock pipeline's output
    assert torch.allclose(tuned[0].float(), ours, atol=1e-5)  # to the trained policy's
    assert main(["export", str(checkpoint), "--merge", str(tmp_path / "merged")]) == 0
    merged = DiffusionPipeline.from_pretrained(tmp_path / "merged")
    assert isinstance(merged, WanPipeline)
    assert torch.allclose(merged(**call, generator=torch.Generator().manual_seed(7)).frames[0].float(), ours, atol=1e-5)


def test_full_wan_fine_tune_is_a_pipeline_directory(tmp_path):
    from diffusers import DiffusionPipeline, WanPipeline
    t, checkpoint, ours = train_wan(tmp_path, "optim.lr=0.01")
    pipe = DiffusionPipeline.from_pretrained(checkpoint / "model")
    assert isinstance(pipe, WanPipeline)
    for (name, p), (_, q) in zip(pipe.transformer.named_parameters(), t.unwrapped.named_parameters()):
        assert torch.equal(p, q), name
    from mmrl.tasks.demos.tiny_pipelines import tiny_wan_t2v
    assert not all(torch.equal(p, q) for p, q in zip(tiny_wan_t2v().transformer.parameters(),
                                                      pipe.transformer.parameters()))  # training moved it
    stock = pipe(prompt=["red circle"], num_inference_steps=3, height=SIZE, width=SIZE, num_frames=FRAMES,
                 guidance_scale=4.5, generator=torch.Generator().manual_seed(7), output_type="latent").frames
    assert torch.allclose(stock[0].float(), ours, atol=1e-5)


@pytest.mark.parametrize("recipe", ["t2v_wan", "i2v_wan", "t2v_hunyuan"])
def test_video_recipes_run_a_step(recipe, tmp_path):
    # group 4: t2v_hunyuan trains the best and worst train_extremes=2 rows, which a smaller group would not allow
    cfg = load_recipe(RECIPES.get(recipe), [f"output_dir={tmp_path}", "algorithm.group_size=4",
                                           "optim.prompts_per_step=1", "max_steps=2", "logging.progress=false",
                                           "logging.report_to=[none]"])
    trainer = Trainer(cfg)
    for step in range(2):
        metrics = trainer.train_step()
        assert math.isfinite(metrics["loss"])
        if step == 0:
            assert metrics["ratio_max_dev"] == 0.0  # on-policy: the rollout's log-probs are the training forward's


@pytest.mark.parametrize("name,fps", [("wan-t2v", 16), ("hunyuan-video", 15)])
def test_a_video_rollout_gives_its_rows_the_fps_column(policies, name, fps):
    rollout = policies[name].rollout([ROW], 2, seeds=[3], greedy=True)
    assert rollout.columns["fps"] == [fps, fps]
    assert len(rollout.completions[0]) == FRAMES  # the completion is the video's frames
    policies[name].cfg.fps = 24
    try:
        assert policies[name].rollout([ROW], 1, seeds=[3], greedy=True).columns["fps"] == [24]
    finally:
        policies[name].cfg.fps = None


def test_wan_unipc_scheduler_becomes_the_euler_flow_scheduler_with_its_shift():
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    from mmrl.tasks.demos.tiny_pipelines import tiny_wan_t2v
    pipe = tiny_wan_t2v()
    pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0)
    policy = DiffusionPolicy(DiffusionConfig(model="tiny:wan-t2v", height=SIZE, width=SIZE, num_frames=FRAMES,
                                             num_steps=3), pipe=pipe)
    assert isinstance(policy.pipe.scheduler, FlowMatchEulerDiscreteScheduler)
    levels, _ = policy.family.levels(4, ())
    # the Euler scheduler's sigmas: s evenly from 1 to its smallest training sigma (1/1000 shifted),
    # then shifted, s' = shift s / (1 + (shift - 1) s), and a final 0
    smallest = 5 * 1e-3 / (1 + 4 * 1e-3)
    want = [5 * s / (1 + 4 * s) for s in (1 - i * (1 - smallest) / 3 for i in range(4))] + [0.0]
    assert levels == pytest.approx(want, abs=1e-6)
    shifted = make("hunyuan-video", flow_shift=2.0)
    assert shifted.family.levels(2, ())[0] == pytest.approx([1.0, 2 * 0.5 / 1.5, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="policy.flow_shift=2.0"):
        DiffusionPolicy(DiffusionConfig(model="tiny:sd15", height=SIZE, width=SIZE, sampler="ddim", flow_shift=2.0))
    with pytest.raises(ValueError, match="policy.flow_shift=2.0: the scheduler of FluxPipeline shifts by resolution"):
        DiffusionPolicy(DiffusionConfig(model="tiny:flux", height=SIZE, width=SIZE, classifier_free_guidance=False,
                                        flow_shift=2.0))


def test_image_to_video_rows_are_checked_and_resolved_before_the_model_loads(tmp_path):
    import json

    from mmrl.config.sections import DataConfig
    from mmrl.data import DataError, load_data
    (tmp_path / "img").mkdir()
    IMAGE.save(tmp_path / "img" / "red.png")
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ({"prompt": "a", "image": "img/red.png"},
                                                       {"prompt": "b", "image": "img/missing.png"})))
    media = DiffusionPolicy.media_columns(DiffusionConfig(image_column="image"))
    with pytest.raises(DataError, match=r"column 'image': image file does not exist: 1 row\(s\): row 1"):
        load_data(DataConfig(path=str(path)), media)
    path.write_text(json.dumps({"prompt": "a", "image": "img/red.png"}))
    train, _ = load_data(DataConfig(path=str(path)), media)
    assert train[0]["image"] == str(tmp_path / "img" / "red.png")  # relative to the data file
    assert DiffusionPolicy.media_columns(DiffusionConfig()) == {}  # text-to-video / image: no media column


def test_step_schedules_and_chunks_on_video_latents(policies):
    from mmrl.tasks.diffusion.chunks import calibrate_chunks
    from mmrl.tasks.diffusion.schedule import StepSchedule
    policy = policies["wan-t2v"]
    default = policy.cfg.schedule
    try:
        for schedule, trained in ((StepSchedule("window", start=1, size=1), [1]),
                                  (StepSchedule("sliding_window", size=1, stride=1, shift_every=1), [0]),
                                  (StepSchedule("chunks", sizes=[1, 2]), [0, 1])):
            policy.cfg.schedule = schedule
            policy.set_training_step(1)
            batch = policy.rollout([ROW], 2, seeds=[2])
            assert batch.unit_mask.bool().any(0).nonzero().flatten().tolist() == trained
            assert [s.start for s in policy.unit_slices(batch)] == trained
            logp, _ = policy.logprobs(policy.model, batch)
            mask = batch.unit_mask.bool()
            assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-5)
    finally:
        policy.cfg.schedule = default
        policy.set_training_step(0)
    assert sum(calibrate_chunks(policy, ["red circle"], 2, group_size=2)) == 3


def test_wan22_ti2v_text_to_video_equals_the_stock_call():
    from diffusers import WanPipeline

    from mmrl.tasks.demos.tiny_pipelines import tiny_wan_t2v
    base = tiny_wan_t2v()
    # Wan 2.2 TI2V-5B's text-to-video: the stock call gives every latent token the step's timestep
    # (expand_timesteps), the same values as the one timestep per video the family passes
    pipe = WanPipeline(**base.components, expand_timesteps=True)
    policy = DiffusionPolicy(DiffusionConfig(model="tiny:wan-t2v", height=SIZE, width=SIZE, num_frames=FRAMES,
                                             num_steps=3, noise_level=0.0), pipe=pipe)
    ours = policy.rollout([ROW], 1, seeds=[7])
    stock = stock_call(policy, "wan-t2v")
    assert torch.allclose(ours.extras["latents"][0, -1], stock[0].float(), atol=1e-5)  # (two experts: test_wan22_experts.py)
