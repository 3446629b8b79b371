"""`mmrl plan` of a diffusion recipe (tasks/diffusion/memory_formula.py, tasks/diffusion/meta_trace.py):
the meta trace against the allocation probe on the same work, the plan's parts against
hand-worked references, the plan of a saved pipeline from its files, the plan of a whole step
against the probe's measure, and what it refuses by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from mmrl.cli.main import main
from mmrl.config.parse import load_recipe, parse_config
from mmrl.config.recipes import resolve_recipe
from mmrl.errors import UserError
from mmrl.experiments.memory_plan import plan_memory, plan_table
from mmrl.tasks.diffusion.meta_trace import traced_peak
from test_memory_plan import measured_peak

PROMPTS = ["01+20=", "11+21="]


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from memory_probe import MemoryProbe, peak_bytes
    return MemoryProbe, peak_bytes


def attention_block(device: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    with torch.device(device):
        block = nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)
        return block, torch.randn(3, 512, 32)


def test_the_trace_on_meta_tensors_is_the_probes_measure_on_a_cpu(probe):
    """A transformer layer's forward and backward (512 tokens): the meta trace's peak and the
    CPU probe's peak of the same work within 2%; the fused attention keeps no [512, 512] scores."""
    def step_peak(device: str, measure) -> int:
        block, x = attention_block(device)
        for p in block.parameters():
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        return measure(lambda: block(x).sum().backward())

    traced, measured = step_peak("meta", traced_peak), step_peak("cpu", probe[1])
    assert traced == pytest.approx(measured, rel=0.02)
    scores = 3 * 2 * 512 * 512 * 4  # one softmax of the scores, were they materialised
    assert traced < scores


def test_the_trace_frees_what_no_one_holds():
    """Three [256, 256] fp32 products in a row, each dropped: at most two live at once (by hand)."""
    x = torch.empty(256, 256, device="meta")

    def work():
        y = x @ x
        for _ in range(2):
            y = y @ x

    assert traced_peak(work) == 2 * 256 * 256 * 4


def test_a_masks_values_are_kept_through_the_trace():
    """A tokenizer's mask (rows of 3 and 5 of 6 tokens) moved to the meta device: the states selected
    by it are 8 of the 12, the lengths read off it [3, 5], a mask padded from them selects 8 again;
    a mask computed from weights (no values) is refused by name, not guessed."""
    from mmrl.tasks.diffusion.meta_trace import LiveBytes
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]])
    hidden = torch.empty(2, 6, 4, device="meta")
    with LiveBytes():
        on_meta = mask.to("meta").bool()
        selected = hidden[on_meta]
        lengths = on_meta.sum(dim=1).tolist()
        padded = torch.zeros(2, 8, dtype=torch.bool, device="meta")
        for i, length in enumerate(lengths):
            padded[i, :length] = True
        again = torch.empty(2, 8, 4, device="meta")[padded]
    assert tuple(selected.shape) == (8, 4) and lengths == [3, 5] and tuple(again.shape) == (8, 4)
    with LiveBytes(), pytest.raises(NotImplementedError, match="depends on values"):
        hidden[hidden.sum(-1) > 0]


def demo_plan(*overrides: str, gpu_memory: int | None = None, recipe: str = "t2i_demo"):
    cfg = load_recipe(resolve_recipe(recipe), list(overrides))
    return plan_memory(cfg, 1, prompt_length=8, device_memory=gpu_memory)


def test_the_t2i_demos_plan_by_hand():
    """The t2i demo (a pixel-space UNet, 16 x 16 RGB, 8 steps, 4 prompts x 8): the frozen text
    encoder's weights, the rollouts' states on the host (32 rows x 9 states x 3 x 16 x 16 fp32),
    the reference copy of its KL (beta 0.04), and checkpointing keeping less."""
    plan = demo_plan()
    assert plan.state["frozen weights: text_encoder"] > 0 and plan.state["reference weights"] == plan.state["weights"]
    assert plan.host["rollouts' states (fp32 latents)"] == 32 * 9 * 3 * 16 * 16 * 4
    assert plan.activations_other < plan.update["activations"]
    table = plan_table(plan)
    assert "frozen weights: text_encoder" in table and "host, not in the peak" in table
    checkpointed = demo_plan("policy.gradient_checkpointing=true", "policy.tiny_args.size=32", "policy.height=32",
                             "policy.width=32")
    assert checkpointed.activations_other > 3 * plan.update["activations"]  # 4 times the pixels


@pytest.mark.slow  # ~25 s on the loaded 2-core machine (three plans; the search itself is tested in test_memory_plan)
def test_the_largest_group_size_fits_and_one_more_does_not():
    plan = demo_plan(gpu_memory=300 * 2 ** 20)
    group = plan.largest_group_size
    assert group > 0
    assert demo_plan(f"algorithm.group_size={group}").peak <= 300 * 2 ** 20
    assert demo_plan(f"algorithm.group_size={group + 1}").peak > 300 * 2 ** 20


def test_a_saved_pipeline_is_planned_from_its_files(tmp_path):
    """tiny:sd3 saved to a directory: the plan read from its files (configurations, tokenizers;
    the weights are never read) equals the plan of the tiny build."""
    from mmrl.tasks.model_loading import TINY_MODELS
    TINY_MODELS.get("sd3")().save_pretrained(tmp_path / "sd3")
    for weights in (tmp_path / "sd3").rglob("*.safetensors"):
        weights.write_bytes(b"not weights")  # what the plan must not read
    cfg = load_recipe(resolve_recipe("t2i_flowgrpo"), [])
    saved = load_recipe(resolve_recipe("t2i_flowgrpo"), [f"policy.model={tmp_path / 'sd3'}", "policy.tiny_args={}"])
    assert plan_memory(saved, 1, 8).as_dict() == plan_memory(cfg, 1, 8).as_dict()


def weightless_formula(recipe: str, *overrides: str):
    """The diffusion formula of a recipe's policy (its pipeline built without weights; nothing traced)."""
    from mmrl.config.parse import from_dict
    from mmrl.config.rollouts import adapter_policy
    from mmrl.registry import ADAPTERS
    cfg = load_recipe(resolve_recipe(recipe), list(overrides))
    adapter = ADAPTERS.get(cfg.task)
    return adapter.memory_model(from_dict(adapter.Config, adapter_policy(cfg.policy), "policy"), 8)


def test_the_sizes_searched_keep_the_aspect_and_the_frames_the_vaes_factor():
    """Wan (tiny: 8-pixel multiples, a 4x temporal VAE) at 32 x 64 pixels: the resolution's k-th
    step is 8k pixels on the longer side and half that on the other, the frames' 4(k - 1) + 1, up to
    what the denoiser's positions cover."""
    formula = weightless_formula("t2v_wan", "policy.height=32", "policy.width=64")
    axes = formula.size_axes()
    assert set(axes) == {"resolution", "frames"}
    settings, sized = axes["resolution"].at(10)
    assert settings == {"policy.height": 40, "policy.width": 80} and (sized.cfg.height, sized.cfg.width) == (40, 80)
    assert axes["frames"].at(5)[0] == {"policy.num_frames": 17} and axes["frames"].at(1)[0] == {"policy.num_frames": 1}
    # the tiny denoiser's rotary positions (rope_max_seq_len 32, patch 1 x 2 x 2) bound both searches
    assert axes["resolution"].most == 32 and axes["frames"].most == 32
    assert set(weightless_formula("t2i_demo").size_axes()) == {"resolution"}


@pytest.mark.slow  # ~3 min on the loaded 2-core machine (a plan with its search, two checks at the sizes it found)
def test_the_largest_resolution_fits_and_the_next_does_not():
    device = 300 * 2 ** 20
    found = demo_plan(gpu_memory=device).largest_sizes["resolution"]
    side = found["policy.height"]
    assert found == {"policy.height": side, "policy.width": side} and side > 16
    assert demo_plan(f"policy.height={side}", f"policy.width={side}").peak <= device
    step = weightless_formula("t2i_demo").size_axes()["resolution"].at(1)[0]["policy.height"]
    bigger = side + step
    assert demo_plan(f"policy.height={bigger}", f"policy.width={bigger}").peak > device


@pytest.mark.parametrize("overrides,named", [
    (["policy.units=forward_process"], "policy.units='forward_process'"),
    (["policy.turning_points=true"], "policy.turning_points=True"),
    (["policy.height=1024", "policy.width=1024"], "policy.height=1024"),
])
def test_what_the_plan_does_not_model_is_named(overrides, named):
    with pytest.raises(UserError, match=named.replace(".", r"\.")):
        demo_plan(*overrides, recipe="t2i_flowgrpo")


def test_an_unchecked_family_is_named(capsys):
    assert main(["plan", "i2v_wan", "--prompt-tokens", "8"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "WanImageToVideo" in err and "no memory formula" in err


def step_recipe(tmp_path, pipeline: str, side: int, guided: bool, frames: int = 1, **tiny_args) -> dict:
    """Two GRPO steps of a tiny pipeline: 2 prompts x 2 images (videos of `frames`) of `side`
    pixels, 4 denoising steps, one micro-batch, AdamW, beta 0 (scripts/bench_memory_plan.py's recipe)."""
    from mmrl.core.scoring import REWARDS, register_reward
    if "plan_pixels" not in REWARDS:
        register_reward("plan_pixels")(lambda completions, **kw: [
            float(sum((c[0] if isinstance(c, list) else c).getpixel((0, 0)))) for c in completions])
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return {"task": "diffusion",
            "policy": {"model": f"tiny:{pipeline}", "tiny_args": tiny_args, "height": side, "width": side,
                       "num_steps": 4, "classifier_free_guidance": guided, "num_frames": frames,
                       **({"sampler": "ddim"} if pipeline == "sd15" else {})},  # an eps model's sampler
            "data": {"path": str(data)}, "rewards": {"plan_pixels": {"weight": 1.0}},
            "algorithm": {"group_size": 2, "estimator": "grpo", "beta": 0.0},
            "optim": {"lr": 1e-5, "prompts_per_step": 2, "micro_batch_size": 4},
            "logging": {"report_to": ["none"], "progress": False}, "output_dir": str(tmp_path / "out"),
            "max_steps": 2, "save_every": 0}


def cpu_peak(plan) -> int:
    """The plan's peak on a CPU, where the rollouts' host memory is the probe's too: all of it beside
    the update, the states beside the rollout's end (scripts/bench_memory_plan.py)."""
    state = sum(plan.state.values())
    return max(state + sum(plan.host.values()) + sum(plan.update.values()),
               state + sum(plan.rollout.values()) + plan.host["rollouts' states (fp32 latents)"])


@pytest.mark.slow  # 8-50 s each under the profiler on the loaded 2-core machine (2026-11-30)
@pytest.mark.parametrize("pipeline,side,guided,frames,tiny_args", [
    ("sd3", 64, True, 1, {}), ("flux", 64, False, 1, {}), ("pixel-flow", 32, True, 1, {"size": 32}),
    ("pixel-flow-unet", 32, True, 1, {"size": 32}), ("wan-t2v", 32, True, 5, {}), ("flux2-klein", 64, True, 1, {}),
    ("sd15", 32, True, 1, {}), ("qwen-image", 32, True, 1, {}), ("z-image", 64, True, 1, {})])
def test_the_diffusion_plan_predicts_the_measured_peak(tmp_path, probe, pipeline, side, guided, frames, tiny_args):
    recipe = step_recipe(tmp_path, pipeline, side, guided, frames, **tiny_args)
    plan = plan_memory(parse_config(recipe), 1, prompt_length=len(PROMPTS[0]))
    assert cpu_peak(plan) == pytest.approx(measured_peak(recipe, probe[0]), rel=0.15)
