"""FLUX.1's and FLUX.1 Kontext's true CFG on the tiny random pipelines: two forwards (the prompt and
an empty negative prompt, both with the guidance embedding at `policy.embedded_guidance_scale`)
combined at `policy.guidance_scale`. The ODE path equals the stock call with `true_cfg_scale` (an
edit's source in both forwards), a step's log-prob equals one computed by hand from two transformer
calls and the Flow-GRPO SDE step, and a missing embedding value is refused before the model loads."""

import random

import pytest
import torch
from helpers import flow_sde_step_logprob
from mmrl.tasks.demos.synthetic.colour_shapes import draw_shape
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy

SIZE, STEPS, SEED, PROMPT = 16, 3, 7, "make the circle blue"
TRUE_CFG, EMBEDDED, NOISE = 3.0, 2.5, 0.7


def make(name, **kw):
    args = dict(model=f"tiny:{name}", height=SIZE, width=SIZE, num_steps=STEPS, eval_num_steps=STEPS,
                sampler="flow_sde", noise_level=NOISE, classifier_free_guidance=True, guidance_scale=TRUE_CFG,
                embedded_guidance_scale=EMBEDDED)
    if name == "flux-kontext":
        args.update(image_column="image", source_area=32 * 32)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


def source(seed=0):
    return draw_shape("red", "circle", 32, random.Random(seed))


def row(name, seed=0):
    return {"prompt": PROMPT, "image": source(seed)} if name == "flux-kontext" else PROMPT


def stock_call(name, pipe, **kw):
    """The stock pipeline's call at the policy's evaluation settings (Kontext: the source at its own size)."""
    call = dict(prompt=[PROMPT], guidance_scale=EMBEDDED, num_inference_steps=STEPS, height=SIZE, width=SIZE,
                generator=torch.Generator().manual_seed(SEED), output_type="latent", **kw)
    if name == "flux-kontext":
        call.update(image=[source()], max_area=SIZE * SIZE, _auto_resize=False)
    return pipe(**call).images


@pytest.fixture(scope="module", params=["flux", "flux-kontext"])
def named_policy(request):
    return request.param, make(request.param)


def test_zero_noise_reproduces_the_stock_true_cfg_call(named_policy):
    name, policy = named_policy
    policy.cfg.noise_level = 0.0
    try:
        ours = policy.rollout([row(name)], 1, seeds=[SEED]).extras["latents"][0, -1]
    finally:
        policy.cfg.noise_level = NOISE
    stock = stock_call(name, policy.pipe, negative_prompt=[""], true_cfg_scale=TRUE_CFG)
    assert torch.allclose(ours, stock[0].float(), atol=5e-5), (ours - stock[0]).abs().max()
    unguided = stock_call(name, policy.pipe)
    assert (unguided - stock).abs().max() > 1e-3  # the negative prompt's forward matters


def hand_logprob(name, policy, batch, k):
    """Step k's log-prob of each row by hand: both forwards of the transformer (Kontext: the source's
    tokens after the noisy ones in each), u + g (c - u), the Flow-GRPO SDE step's Gaussian, fp32,
    mean over dims."""
    pipe = policy.pipe
    x, after = batch.extras["latents"][:, k], batch.extras["latents"][:, k + 1]
    s, s_next = (float(v) for v in batch.extras["levels"][0, k:k + 2])
    n, tokens = x.shape[0], x.shape[1]
    t = batch.extras["timesteps"][:, k]
    side = SIZE // pipe.vae_scale_factor // 2
    ids = pipe._prepare_latent_image_ids(n, side, side, "cpu", torch.float32)
    hidden = x
    if name == "flux-kontext":
        grid = batch.extras["pos/source_grid"][0]
        source_ids = pipe._prepare_latent_image_ids(n, int(grid[0]), int(grid[1]), "cpu", torch.float32)
        source_ids[..., 0] = 1
        hidden, ids = torch.cat([x, batch.extras["pos/source"]], 1), torch.cat([ids, source_ids])

    def forward(texts):
        embeds, pooled, _ = pipe.encode_prompt(prompt=texts, prompt_2=None, device="cpu")
        return pipe.transformer(hidden_states=hidden, timestep=t / 1000, guidance=torch.full((n,), EMBEDDED),
                                pooled_projections=pooled, encoder_hidden_states=embeds,
                                txt_ids=torch.zeros(embeds.shape[1], 3), img_ids=ids,
                                return_dict=False)[0][:, :tokens].float()
    with torch.no_grad():
        cond, uncond = forward(list(batch.prompts)), forward([""] * n)
    v = uncond + TRUE_CFG * (cond - uncond)
    return flow_sde_step_logprob(x, after, v, s, s_next, NOISE)


def test_a_guided_steps_log_prob_is_the_hand_computed_one(named_policy):
    name, policy = named_policy
    batch = policy.rollout([row(name), row(name, seed=2)], 2, seeds=[5, 6])
    k = 1  # a trained step below the first level (s < 1)
    assert batch.unit_mask[:, k].all()
    want = hand_logprob(name, policy, batch, k)
    with torch.no_grad():
        ours = policy.logprobs(policy.model, batch, slice(k, k + 1))[0][:, 0]
    assert torch.allclose(ours, want, atol=1e-5), (ours - want).abs().max()
    assert torch.allclose(batch.rollout_logp[:, k], want, atol=1e-5)  # as the sampler drew it


def test_true_cfg_without_the_embeddings_value_is_refused_before_loading():
    cfg = DiffusionConfig(model="tiny:flux", height=SIZE, width=SIZE)  # classifier_free_guidance defaults to true
    assert any("policy.embedded_guidance_scale is not set: Flux" in p for p in DiffusionPolicy.config_problems(cfg))
    cfg.classifier_free_guidance = False
    assert not DiffusionPolicy.config_problems(cfg)
