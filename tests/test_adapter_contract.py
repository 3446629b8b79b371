"""Every registered adapter runs the shared contract (tests/adapter_contract.py) on a tiny model."""

from pathlib import Path

import pytest
import torch
from adapter_contract import AdapterContract
from helpers import on_policy_step_changes
from test_composite import PAIRINGS, PIXEL_FLOW, SD3, composite_recipe
from test_unified import unified_recipe

from mmrl.registry import ADAPTERS


class TestCausalLM(AdapterContract):
    recipe = {"task": "causal_lm",
              "policy": {"model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
                         "max_new_tokens": 8},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "algorithm": {"group_size": 4}, "optim": {"lr": 1e-3, "prompts_per_step": 2}}
    stream_sizes = (3,)


class TestVLM(AdapterContract):
    recipe = {"task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "max_new_tokens": 6},
              "data": {"name": "shapes", "args": {"n_train": 16, "n_eval": 4, "size": 56}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 3}}


class TestAudioLM(AdapterContract):
    recipe = {"task": "audio_lm", "policy": {"model": "tiny:qwen2-audio-char", "max_new_tokens": 5},
              "data": {"name": "tones", "args": {"n_train": 8, "n_eval": 2}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "algorithm": {"group_size": 4}, "optim": {"lr": 1e-2, "prompts_per_step": 3}}
    stream_sizes = (5,)


class TestDiffusion(AdapterContract):
    recipe = {"task": "diffusion",
              "policy": {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4, "eval_num_steps": 4,
                         "noise_level": 0.7},
              "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
              "rewards": {"colour_shape": {"weight": 1.0}},
              "reward_modules": [],
              "algorithm": {"group_size": 3, "eps_low": 1e-3, "eps_high": 1e-3},
              "optim": {"lr": 1e-3, "prompts_per_step": 2}}

    def reload_model(self, model, path):
        # a full fine-tune is saved as a whole pipeline: the denoiser is its `transformer` component
        from diffusers import DiffusionPipeline
        return DiffusionPipeline.from_pretrained(path).transformer.eval()

    def assert_same_draw(self, alone, in_batch):
        # images decoded from latents that agree to float rounding (a batched denoiser call)
        assert torch.allclose(alone.extras["latents"], in_batch.extras["latents"], atol=1e-5)



class TestJanus(AdapterContract):
    """Janus-Pro's text-to-image: units are image tokens drawn under classifier-free guidance."""
    recipe = {"task": "janus", "policy": {"model": "tiny:janus", "guidance_scale": 3.0},
              "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}},
              "rewards": {"mean_red": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-3, "prompts_per_step": 2}}

    def assert_same_draw(self, alone, in_batch):
        # the same tokens; their images decoded in another batch agree to float rounding
        assert torch.equal(alone.extras["image_tokens"], in_batch.extras["image_tokens"])


class TestEmu3(AdapterContract):
    """Emu3's text-to-image: units are the visual tokens, drawn row by row (a forced row end after
    each row) under classifier-free guidance against a negative prompt."""
    recipe = {**TestJanus.recipe, "task": "emu3",
              "policy": {"model": "tiny:emu3", "image_area": 1024, "negative_prompt": "blurry", "guidance_scale": 3.0}}
    assert_same_draw = TestJanus.assert_same_draw  # the same tokens; images decoded in another batch


class TestCSM(AdapterContract):
    recipe = {"task": "csm", "policy": {"model": "tiny:csm-char", "max_new_frames": 4, "top_k": 0},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"loudness": {"weight": 1.0}},
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2}}
    stream_sizes = (2,)

    def assert_same_draw(self, alone, in_batch):
        assert torch.equal(alone.extras["completion_codes"], in_batch.extras["completion_codes"][..., :alone.num_units])


class TestDia(AdapterContract):
    recipe = {"task": "dia", "policy": {"model": "tiny:dia", "max_new_frames": 4, "top_k": 8},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"loudness": {"weight": 1.0}},
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2}}
    stream_sizes = (2,)

    def assert_same_draw(self, alone, in_batch):
        width = alone.extras["decoder_ids"].shape[1]
        assert torch.equal(alone.extras["decoder_ids"], in_batch.extras["decoder_ids"][:, :width])


class TestOmniTalker(AdapterContract):
    """Qwen2.5-Omni's talker: units are single-codebook codec tokens after the frozen thinker's teacher-forced reply."""
    recipe = {"task": "omni_talker", "policy": {"model": "tiny:qwen2_5-omni-talker", "system_prompt": "",
                                                "max_new_tokens": 4},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"loudness": {"weight": 1.0}},
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2}}
    stream_sizes = (2,)

    def assert_same_draw(self, alone, in_batch):
        assert torch.equal(alone.extras["completion_codes"], in_batch.extras["completion_codes"][..., :alone.num_units])


VIDEO = {"height": 32, "width": 32, "num_frames": 5, "num_steps": 3, "eval_num_steps": 3, "noise_level": 0.7}
VIDEO_RECIPE = {**TestDiffusion.recipe, "rewards": {"colour_shape": {"weight": 1.0, "args": {"frames": "all"}}}}


class TestWanTextToVideo(TestDiffusion):
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:wan-t2v", **VIDEO}}


class TestWanImageToVideo(TestDiffusion):
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:wan-i2v", "image_column": "image", **VIDEO}}


@pytest.mark.slow  # 52 s on the loaded 2-core machine (2026-11-29); the default run keeps its stock-pipeline, log-prob,
# method and LoRA checks (test_wan22_experts.py)
class TestWan22A14B(TestDiffusion):
    """Wan 2.2 A14B: the trained `model` holds both experts (`experts.TimestepExperts`)."""
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:wan22-a14b", **VIDEO}}

    def reload_model(self, model, path):
        # a full fine-tune is a whole WanPipeline: the experts are its `transformer` and `transformer_2`
        from diffusers import DiffusionPipeline
        from mmrl.tasks.diffusion.experts import TimestepExperts
        pipe = DiffusionPipeline.from_pretrained(path)
        return TimestepExperts({name: getattr(pipe, name) for name in model.component_names}, model.boundary).eval()


@pytest.mark.slow  # 16-37 s per test on the loaded 2-core machine (its fixed 1000 + 256 + 729 conditioning tokens per forward,
# 2026-11-29); the default run keeps its stock-pipeline check (test_hunyuan_video15.py)
class TestHunyuanVideo15(TestDiffusion):
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:hunyuan-video-15", **VIDEO}}


class TestHunyuanVideo(TestDiffusion):
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:hunyuan-video", "classifier_free_guidance": False, **VIDEO}}


IMAGE_2026 = {"height": 16, "width": 16, "num_steps": 3, "eval_num_steps": 3, "noise_level": 0.7}
RECIPE_2026 = {**TestDiffusion.recipe, "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 16}}}


class TestQwenImage(TestDiffusion):
    recipe = {**RECIPE_2026, "policy": {"model": "tiny:qwen-image", **IMAGE_2026}}


class TestQwenImageEdit(TestDiffusion):
    """Image editing: each row's source image (policy.image_column) conditions the edit."""
    recipe = {**RECIPE_2026, "policy": {"model": "tiny:qwen-image-edit", "image_column": "image", "source_area": 1024,
                                        **IMAGE_2026},
              "data": {"name": "shape_edits", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
              # a continuous reward: the untrained editor's edits all miss colour_shape's target
              "rewards": {"mean_red": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "image_reward.py")]}


@pytest.mark.slow  # 40-90 s on the loaded 2-core machine (2026-11-29); Edit-Plus shares Qwen-Image-Edit's denoiser call
class TestQwenImageEditPlus(TestQwenImageEdit):
    recipe = {**TestQwenImageEdit.recipe, "policy": {**TestQwenImageEdit.recipe["policy"],
                                                     "model": "tiny:qwen-image-edit-plus"}}


class TestFluxKontext(TestQwenImageEdit):
    recipe = {**TestQwenImageEdit.recipe, "policy": {**TestQwenImageEdit.recipe["policy"], "model": "tiny:flux-kontext",
                                                     "classifier_free_guidance": False}}


class TestZImage(TestDiffusion):
    recipe = {**RECIPE_2026, "policy": {"model": "tiny:z-image", **IMAGE_2026}}


@pytest.mark.slow  # 2.5 min on the loaded 2-core machine (2026-11-29): its 27-layer text encoder reads 512 tokens per
# prompt; the default run keeps FLUX.2 [klein]'s stock-pipeline, log-prob and LoRA checks (test_generators_2026.py)
class TestFlux2Klein(TestDiffusion):
    recipe = {**RECIPE_2026, "policy": {"model": "tiny:flux2-klein", **IMAGE_2026}}


class TestDiffusionFast(TestDiffusion):
    """Flow-GRPO-Fast: an SDE window per group (random_window), the ODE elsewhere."""
    recipe = {**TestDiffusion.recipe,
              "policy": {**TestDiffusion.recipe["policy"], "num_steps": 6,
                         "schedule": {"kind": "random_window", "size": 2, "window_range": [0, 5]}}}


class TestDiffusionGuard(TestDiffusion):
    """GRPO-Guard: per-step normalised ratios and 1 / |dt| loss weights (algorithm.ratio_norm)."""
    recipe = {**TestDiffusion.recipe, "algorithm": {**TestDiffusion.recipe["algorithm"], "ratio_norm": "grpo_guard"}}


class TestDiffusionDPPO(TestDiffusion):
    """FlowDPPO: the KL-ADV mask in place of the ratio clip, two update passes from the old step
    means kept before the first (algorithm.trust_region: dppo)."""
    recipe = {**TestDiffusion.recipe, "algorithm": {**TestDiffusion.recipe["algorithm"], "trust_region": "dppo",
                                                    "mu": 2}}


class TestDiffusionPrefGRPO(TestDiffusion):
    """Pref-GRPO: each image's win rate in its group under a pairwise judge (rounded as the authors),
    group-normalised with eps 1e-8, GDPO's batch renormalisation, the advantage clip."""
    recipe = {**TestDiffusion.recipe,
              "rewards": {"win_rate": {"weight": 1.0, "args": {
                  "prefer": f"{Path(__file__).parent / 'image_reward.py'}:redder", "decimals": 3}}},
              "algorithm": {**TestDiffusion.recipe["algorithm"], "eps": 1e-8, "batch_renorm": True,
                            "clip_advantage": 5.0}}


class TestDiffusionNFT(TestDiffusion):
    """DiffusionNFT's forward-process units (policy.units: forward_process, algorithm.objective: nft):
    a unit is a (final sample, noise level) pair, and there are no sampler log-probs."""
    recipe = {**TestDiffusion.recipe,
              "policy": {**TestDiffusion.recipe["policy"], "units": "forward_process", "sampler": "ode",
                         "classifier_free_guidance": False, "forward_fraction": 0.75},
              "algorithm": {"group_size": 3, "objective": "nft", "beta": 1e-4, "kl_estimator": "closed_form"}}

    def assert_same_draw(self, alone, in_batch):
        assert torch.allclose(alone.extras["clean"], in_batch.extras["clean"], atol=1e-5)

    def test_rollout_logp_is_the_training_forwards_in_any_batch(self, tmp_path):
        """No sampler log-probs; each row trains 3 of its 4 levels, and its implicit-velocity
        losses are the same in the batch reversed and alone."""
        t = self.make_trainer(tmp_path)
        batch = self.rollout(t)
        assert batch.rollout_logp is None and batch.unit_mask.sum(1).tolist() == [3.0] * len(batch)
        reverse = torch.arange(len(batch) - 1, -1, -1)
        with torch.no_grad():
            together = torch.stack(t.policy.implicit_velocity_losses(t.model, batch, slice(None), 1.0)[:2])
            flipped = torch.stack(t.policy.implicit_velocity_losses(t.model, batch.select(reverse), slice(None), 1.0)[:2])
            alone = torch.cat([torch.stack(t.policy.implicit_velocity_losses(t.model, batch.select([i]), slice(None),
                                                                             1.0)[:2]) for i in range(len(batch))], 1)
        for other in (flipped[:, reverse], alone):
            assert torch.allclose(together, other, atol=self.atol)

    def test_a_step_is_on_policy_and_moves_the_weights(self, tmp_path):
        assert on_policy_step_changes(self.make_trainer(tmp_path), rollout_atol=None)

    def test_a_step_logs_the_rollout_gap(self, tmp_path):
        """No rollout gap is logged (no sampler log-probs); the velocity KL to the reference, 0 at
        the start, is measured once the policy has moved."""
        t = self.make_trainer(tmp_path, "max_steps=2")
        first = t.train_step()
        assert first["kl"] == 0.0 and not any(k.startswith("rollout/logp_diff") for k in first)
        assert t.train_step()["kl"] > 0


class TestDLM(AdapterContract):
    recipe = {"task": "dlm",
              "policy": {"model": "tiny:dlm-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
                         "gen_length": 8, "block_length": 4, "steps": 4},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "algorithm": {"group_size": 4}, "optim": {"lr": 1e-3, "prompts_per_step": 2}}
    stream_sizes = (3,)
    # the decoding probability of a token is the diffu_grpo estimate only when every token is drawn
    # from the canvas with the whole completion masked (one block, one step), the prompt unmasked
    # and at temperature 1 (docs/methods.md, 'Rollout log-probs')
    comparable = ("policy.block_length=8", "policy.steps=1", "policy.p_mask=0.0")


class TestDiffusionGemma(AdapterContract):
    """DiffusionGemma's block diffusion (`policy.family: diffusion_gemma`): two canvases of 8 tokens;
    the sampler's log-probs are the final_step estimator's (each token at its block's last step,
    canvas and self-conditioning replayed) at any temperature."""
    recipe = {"task": "dlm",
              "policy": {"family": "diffusion_gemma", "model": "tiny:diffusion-gemma", "estimator": "final_step",
                         "p_mask": 0.0, "gen_length": 16, "denoising_steps": 4},
              "data": {"name": "arithmetic", "args": {"n_train": 16, "n_eval": 4, "digits": 1}},
              "rewards": {"digit_share": {"weight": 1.0}},
              "algorithm": {"group_size": 4}, "optim": {"lr": 1e-2, "prompts_per_step": 2}}
    stream_sizes = (3,)


class TestThinkerWithPixelFlow(AdapterContract):
    """A composite (tasks/composite/): the char-level Qwen2 thinker, then the pixel flow MMDiT drawing its text."""
    recipe = composite_recipe(PIXEL_FLOW)

    def reload_model(self, model, path):
        """Each part from its own directory, with its own family's `from_pretrained`."""
        from transformers import AutoModelForCausalLM

        from mmrl.tasks.composite.model import CompositeModel
        from mmrl.tasks.demos.pixel import PixelFlowPipeline
        generator = PixelFlowPipeline.from_pretrained(path / "generator").transformer
        return CompositeModel({"thinker": AutoModelForCausalLM.from_pretrained(path / "thinker"),
                               "generator": generator}).eval()

    def assert_same_draw(self, alone, in_batch):
        assert alone.columns["thought"] == in_batch.columns["thought"]
        assert torch.allclose(alone.extras["generator/latents"], in_batch.extras["generator/latents"], atol=1e-5)


class TestThinkerWithSD3(TestThinkerWithPixelFlow):
    recipe = composite_recipe(SD3, size=32)

    def reload_model(self, model, path):
        from diffusers import DiffusionPipeline
        from transformers import AutoModelForCausalLM

        from mmrl.tasks.composite.model import CompositeModel
        return CompositeModel({"thinker": AutoModelForCausalLM.from_pretrained(path / "thinker"),
                               "generator": DiffusionPipeline.from_pretrained(path / "generator").transformer}).eval()


VISION_PAIRING, VIDEO_PAIRING = PAIRINGS["vlm+pixel-flow"], PAIRINGS["causal_lm+wan-t2v"]


class TestVisionThinkerWithPixelFlow(TestThinkerWithPixelFlow):
    """A vision-language thinker (Qwen2.5-VL) reads the row's image and writes; the pixel flow draws its text."""
    recipe = {**composite_recipe(VISION_PAIRING["generator"]),
              **{k: VISION_PAIRING[k] for k in ("data", "rewards", "reward_modules")},
              "policy": {**composite_recipe(VISION_PAIRING["generator"])["policy"], "thinker_task": "vlm",
                         "thinker": VISION_PAIRING["thinker"]}}

    def reload_model(self, model, path):
        from transformers import AutoModelForImageTextToText

        from mmrl.tasks.composite.model import CompositeModel
        from mmrl.tasks.demos.pixel import PixelFlowPipeline
        return CompositeModel({"thinker": AutoModelForImageTextToText.from_pretrained(path / "thinker"),
                               "generator": PixelFlowPipeline.from_pretrained(path / "generator").transformer}).eval()


class TestThinkerWithWanTextToVideo(TestThinkerWithSD3):
    """The text thinker, then Wan 2.1 text-to-video drawing a clip of its text."""
    recipe = {**composite_recipe(VIDEO_PAIRING["generator"], size=32), "rewards": VIDEO_PAIRING["rewards"],
              "reward_modules": VIDEO_PAIRING["reward_modules"]}


class TestThinkerWithJanus(TestThinkerWithPixelFlow):
    """T2I-R1's shape: the thinker's text, then Janus's image tokens drawn from it."""
    recipe = {**composite_recipe({"model": "tiny:janus", "guidance_scale": 3.0}), "reward_modules": [],
              "policy": {**composite_recipe({})["policy"], "generator_task": "janus",
                         "generator": {"model": "tiny:janus", "guidance_scale": 3.0}}}

    def reload_model(self, model, path):
        from transformers import AutoModelForCausalLM, JanusForConditionalGeneration

        from mmrl.tasks.composite.model import CompositeModel
        return CompositeModel({"thinker": AutoModelForCausalLM.from_pretrained(path / "thinker"),
                               "generator": JanusForConditionalGeneration.from_pretrained(path / "generator")}).eval()

    def assert_same_draw(self, alone, in_batch):
        assert alone.columns["thought"] == in_batch.columns["thought"]
        assert torch.equal(alone.extras["generator/image_tokens"], in_batch.extras["generator/image_tokens"])


class TestThinkerWithEmu3(TestThinkerWithJanus):
    """The thinker's text, then Emu3's visual tokens drawn from it."""
    generator = {"model": "tiny:emu3", "image_area": 1024, "negative_prompt": "blurry", "guidance_scale": 3.0}
    recipe = {**TestThinkerWithJanus.recipe,
              "policy": {**composite_recipe({})["policy"], "generator_task": "emu3", "generator": generator}}

    def reload_model(self, model, path):
        from transformers import AutoModelForCausalLM, Emu3ForConditionalGeneration

        from mmrl.tasks.composite.model import CompositeModel
        return CompositeModel({"thinker": AutoModelForCausalLM.from_pretrained(path / "thinker"),
                               "generator": Emu3ForConditionalGeneration.from_pretrained(path / "generator")}).eval()


class TestJanusText(AdapterContract):
    """Janus writing text through its language head (tasks/ar_image/janus_text.py)."""
    recipe = {**TestCausalLM.recipe, "task": "janus_text",
              "policy": {"model": "tiny:janus", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2, "patches": 2},
                         "max_new_tokens": 8}}
    stream_sizes = TestCausalLM.stream_sizes

    def reload_model(self, model, path):
        from transformers import JanusForConditionalGeneration
        return JanusForConditionalGeneration.from_pretrained(path).eval()


class TestUnifiedJanus(TestThinkerWithPixelFlow):
    """T2I-R1's form: one Janus writes its thought and draws from it (policy.shared_weights, tests/test_unified.py)."""
    recipe = unified_recipe()

    def reload_model(self, model, path):
        """The one module, saved whole in the checkpoint directory, by the stock class."""
        from transformers import JanusForConditionalGeneration

        from mmrl.tasks.composite.model import CompositeModel
        return CompositeModel({"thinker": JanusForConditionalGeneration.from_pretrained(path)},
                              shared={"generator": "thinker"}).eval()

    def assert_same_draw(self, alone, in_batch):
        assert alone.columns["thought"] == in_batch.columns["thought"]
        assert torch.equal(alone.extras["generator/image_tokens"], in_batch.extras["generator/image_tokens"])


def test_every_registered_adapter_runs_the_contract():
    covered = {cls.recipe["task"] for cls in AdapterContract.__subclasses__()}
    missing = set(ADAPTERS.names()) - covered
    assert not missing, f"adapters without a contract test: {sorted(missing)} (see tests/adapter_contract.py)"



class TestStableAudio3(TestDiffusion):
    """Sound: Stable Audio 3's latents are audio frames; a completion is a waveform."""
    recipe = {**TestDiffusion.recipe, "policy": {"model": "tiny:stable-audio-3", "duration": 0.25, "num_steps": 3,
                                                 "eval_num_steps": 3, "noise_level": 0.7},
              "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
              "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "digit_reward.py")]}


class TestAudioLDM2(TestDiffusion):
    """Sound by DDPM: AudioLDM 2's latents are a mel spectrogram's; a completion is the vocoder's waveform."""
    recipe = {**TestDiffusion.recipe, "policy": {"model": "tiny:audioldm2", "num_steps": 3, "eval_num_steps": 3,
                                                 "sampler": "ddim", "noise_level": 1.0},
              "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
              "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "digit_reward.py")]}

    def reload_model(self, model, path):
        from diffusers import DiffusionPipeline
        return DiffusionPipeline.from_pretrained(path).unet.eval()


class TestLTX2(TestDiffusion):
    """Video with its sound: LTX-2's latents are the video's and the audio's in one action unit; a
    completion is {"frames", "array", "sampling_rate"}."""
    recipe = {**TestDiffusion.recipe, "policy": {"model": "tiny:ltx2", "height": 32, "width": 32, "num_frames": 5,
                                                 "num_steps": 3, "eval_num_steps": 3, "noise_level": 0.7},
              "data": {"name": "words_to_say", "args": {"n_train": 8, "n_eval": 2}},
              "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "digit_reward.py")]}


@pytest.mark.slow  # 57 s on the loaded 2-core machine (2026-11-30; its three forwards a step), TestLTX2 runs by default
class TestLTX2StockGuidance(TestDiffusion):
    """LTX-2 with the stock call's guidance beyond CFG (STG, modality isolation, guidance rescale):
    the rescale's std is each row's, so a row's steps do not depend on the rows beside it."""
    recipe = {**TestLTX2.recipe, "policy": {**TestLTX2.recipe["policy"], "tiny_args": {"perturbed_attn": True},
                                             "stg_scale": 1.0, "stg_blocks": [0], "modality_scale": 3.0,
                                             "guidance_rescale": 0.7}}


class TestLTX2ImageToVideo(TestDiffusion):
    """LTX-2 image to video with sound: each row's image is the clean first latent frame, outside the unit."""
    recipe = {**VIDEO_RECIPE, "policy": {"model": "tiny:ltx2-i2v", "image_column": "image", **VIDEO}}
