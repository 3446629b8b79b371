"""HunyuanVideo's true CFG on the tiny random pipeline: two forwards (the prompt and an empty
negative prompt, both with the guidance embedding at `policy.embedded_guidance_scale`) combined at
`policy.guidance_scale`. The ODE path equals the stock call with `true_cfg_scale`, a step's
log-prob equals one computed by hand from two transformer calls and the Flow-GRPO SDE step, a
training step is on-policy, and a missing embedding value is refused before the model loads."""


import pytest
import torch
from helpers import flow_sde_step_logprob, on_policy_step_changes
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from test_video_diffusion import WAN_RECIPE

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

SIZE, FRAMES, STEPS, SEED, PROMPT = 32, 5, 3, 7, "red circle"
TRUE_CFG, EMBEDDED, NOISE = 3.0, 6.0, 0.7


def make(**kw):
    args = dict(model="tiny:hunyuan-video", height=SIZE, width=SIZE, num_frames=FRAMES, num_steps=STEPS,
                eval_num_steps=STEPS, sampler="flow_sde", noise_level=NOISE, classifier_free_guidance=True,
                guidance_scale=TRUE_CFG, embedded_guidance_scale=EMBEDDED)
    return DiffusionPolicy(DiffusionConfig(**{**args, **kw}))


@pytest.fixture(scope="module")
def policy():
    return make()


def test_zero_noise_reproduces_the_stock_true_cfg_call(policy):
    policy.cfg.noise_level = 0.0
    try:
        ours = policy.rollout([PROMPT], 1, seeds=[SEED]).extras["latents"][0, -1]
    finally:
        policy.cfg.noise_level = NOISE
    call = dict(prompt=[PROMPT], num_inference_steps=STEPS, height=SIZE, width=SIZE, num_frames=FRAMES,
                guidance_scale=EMBEDDED, output_type="latent")
    stock = policy.pipe(**call, negative_prompt=[""], true_cfg_scale=TRUE_CFG,
                        generator=torch.Generator().manual_seed(SEED)).frames
    assert torch.allclose(ours, stock[0].float(), atol=1e-5), (ours - stock[0]).abs().max()
    unguided = policy.pipe(**call, generator=torch.Generator().manual_seed(SEED)).frames
    # the negative prompt's forward matters: 5e-4 on this tiny model, 50x the tolerance above
    assert (unguided - stock).abs().max() > 1e-4


def hand_logprob(pipe, batch, k):
    """Step k's log-prob of each row by hand: both forwards of the transformer, u + g (c - u), the
    Flow-GRPO SDE step's Gaussian (sigma = a sqrt(s / (1 - s)), s < 1 here), fp32, mean over dims."""
    x, after = batch.extras["latents"][:, k], batch.extras["latents"][:, k + 1]
    s, s_next = (float(v) for v in batch.extras["levels"][0, k:k + 2])
    n = x.shape[0]
    t = batch.extras["timesteps"][:, k]
    guidance = torch.full((n,), EMBEDDED * 1000.0)

    def forward(texts):
        embeds, pooled, mask = pipe.encode_prompt(prompt=texts, device="cpu", max_sequence_length=256)
        return pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=embeds,
                                encoder_attention_mask=mask, pooled_projections=pooled, guidance=guidance,
                                return_dict=False)[0].float()
    with torch.no_grad():
        cond, uncond = forward(batch.prompts), forward([""] * n)
    v = uncond + TRUE_CFG * (cond - uncond)
    return flow_sde_step_logprob(x, after, v, s, s_next, NOISE)


def test_a_guided_steps_log_prob_is_the_hand_computed_one(policy):
    batch = policy.rollout([PROMPT, "blue square"], 2, seeds=[5, 6])
    k = 1  # a trained step below the first level (s < 1)
    assert batch.unit_mask[:, k].all()
    want = hand_logprob(policy.pipe, batch, k)
    with torch.no_grad():
        ours = policy.logprobs(policy.model, batch, slice(k, k + 1))[0][:, 0]
    assert torch.allclose(ours, want, atol=1e-5), (ours - want).abs().max()
    assert torch.allclose(batch.rollout_logp[:, k], want, atol=1e-5)  # as the sampler drew it
    policy.cfg.classifier_free_guidance = False  # the unguided forward scores the same step otherwise
    try:
        with torch.no_grad():
            alone = policy.logprobs(policy.model, batch, slice(k, k + 1))[0][:, 0]
    finally:
        policy.cfg.classifier_free_guidance = True
    assert (alone - want).abs().max() > 1e-4, (alone - want).abs().max()


def test_a_true_cfg_step_is_on_policy(tmp_path):
    t = Trainer(parse_config(WAN_RECIPE, [f"output_dir={tmp_path}", "policy.model=tiny:hunyuan-video",
                                          f"policy.guidance_scale={TRUE_CFG}",
                                          f"policy.embedded_guidance_scale={EMBEDDED}"]))
    assert on_policy_step_changes(t)


def test_true_cfg_without_the_embeddings_value_is_refused_before_loading():
    cfg = DiffusionConfig(model="tiny:hunyuan-video", height=SIZE, width=SIZE, num_frames=FRAMES)
    assert any("policy.embedded_guidance_scale is not set" in p for p in DiffusionPolicy.config_problems(cfg))
    cfg.embedded_guidance_scale = EMBEDDED
    assert not DiffusionPolicy.config_problems(cfg)
