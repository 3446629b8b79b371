"""The sizes a diffusion family declares it draws (`Family.size_multiple`, `Family.max_size`, read from
the pipeline's configs before it loads) are the sizes its pipeline draws: on every tiny pipeline, a
size the check takes is drawn at exactly that size, and one it refuses, with the check switched off,
either fails in the pipeline or draws another size. The configs read before loading (the tiny
pipeline built on the meta device, a saved pipeline's files) are the loaded pipeline's."""

import pytest
import torch
from PIL import Image

from mmrl.registry import load_plugins

# tiny pipeline -> (sampler, classifier-free guidance, frames, the size the recipes use)
PIPELINES = {"sd3": ("flow_sde", True, 1), "flux": ("flow_sde", False, 1), "sd15": ("ddim", True, 1),
             "pixel-flow": ("flow_sde", False, 1), "pixel-flow-unet": ("flow_sde", False, 1),
             "pixel-flow-video": ("flow_sde", False, 4), "wan-t2v": ("dance", True, 5),
             "wan-i2v": ("dance", True, 5), "hunyuan-video": ("dance", False, 5),
             "qwen-image": ("flow_sde", True, 1), "z-image": ("flow_sde", True, 1),
             "flux2-klein": ("flow_sde", True, 1), "qwen-image-edit": ("flow_sde", True, 1),
             "qwen-image-edit-plus": ("flow_sde", True, 1), "flux-kontext": ("flow_sde", False, 1)}
EDITING = ("qwen-image-edit", "qwen-image-edit-plus", "flux-kontext")  # a source image per row, resized to 32 x 32


def drawn_size(name, pipe, size):
    """The (width, height) the adapter draws with tiny pipeline `name` (built: `pipe`) at `size` x
    `size`, or the error it raises."""
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.policy import DiffusionPolicy
    sampler, guided, frames = PIPELINES[name]
    cfg = DiffusionConfig(model=f"tiny:{name}", height=size, width=size, num_frames=frames, num_steps=2,
                          eval_num_steps=2, sampler=sampler, classifier_free_guidance=guided,
                          image_column="image" if name in ("wan-i2v", *EDITING) else None,
                          source_area=32 * 32 if name in EDITING else None)
    try:
        rollout = DiffusionPolicy(cfg, pipe).rollout([{"prompt": "red", "image": Image.new("RGB", (32, 32))}], 2,
                                                     seeds=[1])
    except (RuntimeError, ValueError, IndexError) as e:
        return e
    completion = rollout.completions[0]
    return (completion[0] if isinstance(completion, list) else completion).size


# sd3 (~21 s: it also draws past its 128-pixel positions), wan-i2v (~11 s) and qwen-image and its
# editing pipelines (~18 s: its 512-token text padding at every refused size), flux-kontext (~13 s: a source
# encoded at every size) on a loaded 2-core machine
SLOW_PIPELINES = ("sd3", "wan-i2v", "qwen-image", *EDITING)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_PIPELINES else n
                                  for n in PIPELINES])
def test_the_declared_sizes_are_the_drawn_ones(name, monkeypatch):
    load_plugins()
    from mmrl.tasks.diffusion import checks
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.pipeline_configs import described_pipeline
    from mmrl.tasks.model_loading import TINY_MODELS
    described = described_pipeline(DiffusionConfig(model=f"tiny:{name}"))
    multiple, most = described.family.size_multiple(described.configs), described.family.max_size(described.configs)
    pipe = TINY_MODELS.get(name)()
    taken = 2 * multiple if multiple > 2 else 8
    assert drawn_size(name, pipe, taken) == (taken, taken)
    assert not checks.size_problems(described, DiffusionConfig(height=taken, width=taken))
    refused = [s for s in (taken + 1, taken + 2, taken + multiple // 2, (most or 0) + multiple) if s % multiple or
               (most and s > most)]
    assert refused or multiple == 1
    monkeypatch.setattr(checks, "size_problems", lambda *args: [])  # what the pipeline does without the check
    for size in refused:
        drawn = drawn_size(name, pipe, size)
        assert drawn != (size, size), (name, size, drawn)


def test_the_configs_read_before_loading_are_the_loaded_pipelines(tmp_path):
    load_plugins()
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.pipeline_configs import described_pipeline, loaded_configs
    from mmrl.tasks.model_loading import TINY_MODELS
    for name in ("sd3", "wan-i2v"):
        pipe = TINY_MODELS.get(name)()
        before, loaded = described_pipeline(DiffusionConfig(model=f"tiny:{name}")), loaded_configs(pipe)
        assert before.classes == loaded.classes and before.configs == loaded.configs
        assert not any(p.device.type == "meta" for p in pipe.transformer.parameters())  # the cache built nothing real
        pipe.save_pretrained(tmp_path / name)
        saved = described_pipeline(DiffusionConfig(model=str(tmp_path / name)))
        assert saved.family is loaded.family and saved.classes[0] == type(pipe).__name__
        for component in ("vae", "transformer"):
            assert {k: v for k, v in saved.configs[component].items() if not k.startswith("_")} == \
                {k: (list(v) if isinstance(v, tuple) else v) for k, v in loaded.configs[component].items()
                 if not k.startswith("_")}, component
    assert described_pipeline(DiffusionConfig(model="no-such-org/no-such-pipeline")) is None  # offline: checked after loading
    assert torch.zeros(1).device.type == "cpu"  # building on the meta device left the default device alone


# the configs of published checkpoints, the keys the multiples read (their model_index.json's
# components' config.json); diffusers' own checks (check_inputs) of those pipelines take heights
# and widths divisible by: SD3 vae_scale_factor * patch_size, FLUX vae_scale_factor * 2, Wan and
# HunyuanVideo 16, SD 1.5 8 (diffusers 0.36, pipelines/*/pipeline_*.py)
PUBLISHED = {
    "sd3": ({"vae": {"block_out_channels": [128, 256, 512, 512]},  # stable-diffusion-3.5-medium
             "transformer": {"patch_size": 2, "pos_embed_max_size": 384}}, 16, 6144),
    "flux": ({"vae": {"block_out_channels": [128, 256, 512, 512]},  # FLUX.1-dev
              "transformer": {"patch_size": 1}}, 16, None),
    "sd15": ({"vae": {"block_out_channels": [128, 256, 512, 512]}, "unet": {"sample_size": 64}}, 8, None),
    "wan": ({"vae": {"z_dim": 16}, "transformer": {"patch_size": [1, 2, 2], "rope_max_seq_len": 1024}}, 16,
            16384),  # Wan2.1-T2V-1.3B: its rotary positions cover 1,024 patches a side
    "hunyuan_video": ({"vae": {"spatial_compression_ratio": 8}, "transformer": {"patch_size": 2}}, 16, None),
    # Qwen-Image, Z-Image and FLUX.2 [klein]: vae_scale_factor * 2 (diffusers 0.42.1)
    "qwen_image": ({"vae": {"temperal_downsample": [False, True, True]}, "transformer": {"patch_size": 2}}, 16, None),
    "z_image": ({"vae": {"block_out_channels": [128, 256, 512, 512]}, "transformer": {"all_patch_size": [2]}}, 16,
                None),
    "flux2_klein": ({"vae": {"block_out_channels": [128, 256, 512, 512]}, "transformer": {"patch_size": 1}}, 16, None),
    # the editing pipelines: Qwen-Image-Edit(-Plus) as Qwen-Image, FLUX.1 Kontext as FLUX.1
    "qwen_image_edit": ({"vae": {"temperal_downsample": [False, True, True]}, "transformer": {"patch_size": 2}}, 16,
                        None),
    "flux_kontext": ({"vae": {"block_out_channels": [128, 256, 512, 512]}, "transformer": {"patch_size": 1}}, 16,
                     None),
}


@pytest.mark.parametrize("family", list(PUBLISHED))
def test_the_published_pipelines_multiples_are_diffusers_own(family):
    load_plugins()
    from mmrl.tasks.diffusion.family import FAMILIES
    configs, multiple, most = PUBLISHED[family]
    assert FAMILIES.get(family).size_multiple(configs) == multiple
    assert FAMILIES.get(family).max_size(configs) == most


def test_sd3s_check_takes_what_diffusers_check_inputs_takes():
    """diffusers derives SD3's multiple from the configs as mmrl does: the same sizes pass both."""
    load_plugins()
    from mmrl.tasks.diffusion import checks
    from mmrl.tasks.diffusion.config import DiffusionConfig
    from mmrl.tasks.diffusion.pipeline_configs import loaded_configs
    from mmrl.tasks.model_loading import TINY_MODELS
    with torch.device("meta"):
        pipe = TINY_MODELS.get("sd3")()
    described = loaded_configs(pipe)
    for size in range(4, 130):
        try:
            pipe.check_inputs("red", None, None, size, size)
            diffusers_takes = True
        except ValueError:
            diffusers_takes = False
        ours = not checks.size_problems(described, DiffusionConfig(height=size, width=size))
        assert ours == diffusers_takes, size  # (no size here passes the 128-pixel positions' bound)
