"""LTX-2's stock guidance beyond CFG (`tasks/diffusion/ltx2_guidance.py`): spatio-temporal guidance
(STG), modality-isolation guidance and guidance rescale. At noise 0 the policy equals the stock
`LTX2Pipeline` / `LTX2ImageToVideoPipeline` call with each on, alone and together, and differs
from the call with it off; a guided step's log-prob equals one computed by hand from the
transformer's separate forwards; the rescale equals diffusers' `rescale_noise_cfg`; settings that
cannot apply are refused before the pipeline loads."""

import pytest
import torch
from PIL import Image
from mmrl.tasks.diffusion.checks import check_settings
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.ltx2_guidance import GuidanceTerms, rescaled
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.samplers import flow_sde
from test_ltx2 import FRAMES, PROMPT, SCALE, SEED, SIZE, STEPS, packed

STG = {"stg_scale": 1.0, "stg_blocks": [0]}
TERMS = {"stg": STG, "modality": {"modality_scale": 3.0}, "rescale": {"guidance_rescale": 0.7},
         "all": {**STG, "modality_scale": 3.0, "guidance_rescale": 0.7}}
OFF = {"stg_scale": 0.0, "stg_blocks": [], "modality_scale": 1.0, "guidance_rescale": 0.0}
IMAGE = Image.new("RGB", (40, 24), (200, 30, 30))


def settings(model="tiny:ltx2", **kw):
    return DiffusionConfig(**{**dict(model=model, tiny_args={"perturbed_attn": True}, height=SIZE, width=SIZE,
                                     num_frames=FRAMES, num_steps=STEPS, eval_num_steps=STEPS, noise_level=0.0,
                                     guidance_scale=SCALE), **kw})


def stock_call(pipe, terms, image=None):
    """The stock call's latents (packed as the policy's) with the guidance `terms`, each `audio_*` None
    (the video's values on both streams)."""
    extra = {"image": image} if image is not None else {}
    out = pipe(**extra, prompt=[PROMPT], height=SIZE, width=SIZE, num_frames=FRAMES, frame_rate=24.0,
               num_inference_steps=STEPS, guidance_scale=SCALE, audio_guidance_scale=None,
               stg_scale=terms["stg_scale"], audio_stg_scale=None, modality_scale=terms["modality_scale"],
               audio_modality_scale=None, guidance_rescale=terms["guidance_rescale"], audio_guidance_rescale=None,
               spatio_temporal_guidance_blocks=terms["stg_blocks"] or None,
               generator=torch.Generator().manual_seed(SEED), output_type="latent")
    return packed(pipe, out)


@pytest.mark.parametrize("term", list(TERMS))
def test_zero_noise_is_the_stock_call_with_each_term(term):
    policy = DiffusionPolicy(settings(**TERMS[term]))
    ours = policy.rollout([PROMPT], 1, seeds=[SEED]).extras["latents"][0, -1]
    stock = stock_call(policy.pipe, {**OFF, **TERMS[term]})
    assert torch.allclose(ours, stock, atol=1e-5), (ours - stock).abs().max()
    assert (stock_call(policy.pipe, OFF) - ours).abs().max() > 1e-2  # the term changes the sample


def test_image_to_video_at_zero_noise_is_the_stock_call_with_every_term():
    """The rescale's std covers the conditioning frame's x0 too (the stock call's whole video)."""
    policy = DiffusionPolicy(settings("tiny:ltx2-i2v", image_column="image", **TERMS["all"]))
    rollout = policy.rollout([{"prompt": PROMPT, "image": IMAGE}], 1, seeds=[SEED])
    ours = torch.cat([rollout.extras["pos/first"][0].flatten(), rollout.extras["latents"][0, -1]])
    stock = stock_call(policy.pipe, {**OFF, **TERMS["all"]}, IMAGE)
    assert torch.allclose(ours, stock, atol=1e-5), (ours - stock).abs().max()
    assert (stock_call(policy.pipe, OFF, IMAGE) - ours).abs().max() > 1e-2


def by_hand_velocity(policy, x, t, cond, s):
    """The guided velocity [B, D] of every term at flat latents x [B, D], from four separate transformer
    calls combined in x0 space as the stock call does (written out here, not `ltx2_guidance.py`)."""
    fam, terms = policy.family, TERMS["all"]
    frames, height, width = fam._video_grid()
    video, audio = fam._split(x)

    def forward(side, **kw):
        timestep = t.expand(len(x))
        v, a = policy.pipe.transformer(
            hidden_states=video, audio_hidden_states=audio, encoder_hidden_states=cond[f"{side}/video"],
            audio_encoder_hidden_states=cond[f"{side}/audio"], timestep=timestep, audio_timestep=timestep,
            sigma=timestep, encoder_attention_mask=cond[f"{side}/mask"], audio_encoder_attention_mask=cond[f"{side}/mask"],
            num_frames=frames, height=height, width=width, fps=24.0, audio_num_frames=fam._audio_frames(),
            use_cross_timestep=True, return_dict=False, **kw)
        return torch.cat([v.flatten(1), a.flatten(1)], dim=1)
    c, u = forward("pos"), forward("neg")
    stg, iso = forward("pos", spatio_temporal_guidance_blocks=[0]), forward("pos", isolate_modalities=True)
    x0 = {name: x - s * v for name, v in (("c", c), ("u", u), ("stg", stg), ("iso", iso))}
    g = x0["c"] + (SCALE - 1) * (x0["c"] - x0["u"]) + terms["stg_scale"] * (x0["c"] - x0["stg"]) \
        + (terms["modality_scale"] - 1) * (x0["c"] - x0["iso"])
    split = video.flatten(1).shape[1]  # the rescale is per stream
    out = []
    for part_g, part_c in ((g[:, :split], x0["c"][:, :split]), (g[:, split:], x0["c"][:, split:])):
        ratio = part_c.std(dim=1, keepdim=True) / part_g.std(dim=1, keepdim=True)
        out.append(terms["guidance_rescale"] * ratio * part_g + (1 - terms["guidance_rescale"]) * part_g)
    return (x - torch.cat(out, dim=1)) / s


def test_guided_step_logprob_is_the_separate_forwards_combined_by_hand():
    policy = DiffusionPolicy(settings(noise_level=0.7, **TERMS["all"]))
    batch = policy.rollout([PROMPT, "rain on a roof"], 1, seeds=[5, 6])
    new, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert mask.any() and torch.allclose(new[mask], batch.rollout_logp[mask], atol=1e-5)
    k = int(mask[0].nonzero()[0])
    ex = batch.extras
    s, s_next = float(ex["levels"][0, k]), float(ex["levels"][0, k + 1])
    cond = {key: v for key, v in ex.items() if key.startswith(("pos/", "neg/"))}
    with torch.no_grad():
        v = by_hand_velocity(policy, ex["latents"][:, k].float(), ex["timesteps"][0, k], cond, s)
    mean, std = flow_sde(ex["latents"][:, k].float(), v, s, s_next, 0.7)
    by_hand = torch.distributions.Normal(mean, std).log_prob(ex["latents"][:, k + 1].float()).mean(1)
    assert torch.allclose(new[:, k].detach(), by_hand, atol=1e-5), (new[:, k] - by_hand).abs().max()
    policy.family.guidance_terms = GuidanceTerms()  # CFG alone: another log-prob
    with torch.no_grad():
        cfg_only, _ = policy.logprobs(policy.model, batch)
    assert (cfg_only[:, k] - by_hand).abs().max() > 1e-3

def test_rescale_is_diffusers_rescale_noise_cfg():
    """Ours beside diffusers' `rescale_noise_cfg` (the function the stock call applies) on random
    estimates of different spreads, and beside numpy's std by hand."""
    from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg
    gen = torch.Generator().manual_seed(0)
    guided, cond = 3 * torch.randn(4, 6, 5, generator=gen), torch.randn(4, 6, 5, generator=gen)
    for phi in (0.0, 0.7, 1.0):
        theirs = rescale_noise_cfg(guided, cond, guidance_rescale=phi)
        assert torch.allclose(rescaled(guided, cond, phi), theirs, atol=1e-6)
    flat_g, flat_c = guided.flatten(1).numpy(), cond.flatten(1).numpy()
    ratio = torch.tensor(flat_c.std(1, ddof=1) / flat_g.std(1, ddof=1)).view(4, 1, 1).float()
    assert torch.allclose(rescaled(guided, cond, 1.0), guided * ratio, atol=1e-6)


@pytest.mark.parametrize("model,kw,message", [
    ("tiny:ltx2", {"stg_scale": 1.0, "stg_blocks": [1]}, "policy.stg_blocks=[1]: block(s) [1] out of range"),
    ("tiny:ltx2", {"modality_scale": 3.0, "tiny_args": {"layers": 2}, "stg_scale": 1.0, "stg_blocks": [0, 2]},
     "out of range: the transformer has 2 blocks"),
    ("tiny:ltx2", {"stg_scale": 1.0, "stg_blocks": [0], "tiny_args": {}}, "perturbed_attn false"),
    ("tiny:ltx2-i2v", {"stg_scale": 1.0, "stg_blocks": [3], "image_column": "image"}, "out of range"),
    ("tiny:wan-t2v", {"modality_scale": 3.0, "tiny_args": {}}, "policy.modality_scale=3.0: Wan has no such guidance term"),
    ("tiny:sd3", {"guidance_rescale": 0.7, "tiny_args": {}}, "policy.guidance_rescale=0.7: SD3 has no such guidance term"),
])
def test_terms_that_cannot_apply_are_refused_before_loading(model, kw, message):
    problems = DiffusionPolicy.config_problems(settings(model, **kw))
    assert any(message in p for p in problems), problems


@pytest.mark.parametrize("kw,message", [
    ({"stg_scale": 1.0}, "spatio-temporal guidance needs both a scale above 0 and the blocks"),
    ({"stg_blocks": [0]}, "policy.stg_scale=0.0 with policy.stg_blocks=[0]"),
    ({"modality_scale": 0.5}, "modality_scale >= 1 (1 off)"),
    ({"guidance_rescale": 1.5}, "guidance_rescale in [0, 1]"),
    ({"stg_scale": -1.0, "stg_blocks": [0]}, "need stg_scale >= 0"),
    ({"modality_scale": 3.0, "classifier_free_guidance": False}, "policy.classifier_free_guidance is false"),
])
def test_settings_that_cannot_go_together_are_refused(kw, message):
    with pytest.raises(ValueError) as info:
        check_settings(settings(**kw))
    assert message in str(info.value)
    check_settings(settings(**TERMS["all"]))  # and the valid ones pass


def test_a_loaded_pipeline_is_checked_too():
    """A pipeline not described before loading (a hub id offline) is checked once loaded."""
    from mmrl.tasks.demos.tiny_video_generators import tiny_ltx2
    from mmrl.tasks.diffusion.checks import fitted_family
    with pytest.raises(ValueError, match="perturbed_attn false"):
        fitted_family(settings(**STG), tiny_ltx2())
    assert fitted_family(settings(**TERMS["all"]), tiny_ltx2(perturbed_attn=True)).guidance_terms.stg_blocks == (0,)
