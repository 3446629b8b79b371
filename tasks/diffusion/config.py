"""The diffusion adapter's settings (`policy:` with `task: diffusion`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from .branching import Branching
from .schedule import StepSchedule


@dataclass
class DiffusionConfig:
    """model: hub id, local path, or tiny:sd3 / tiny:flux / tiny:sd15.
    sampler: flow_sde | dance | cps | ode (flow models), ddim (SD 1.5); noise_level: its strength
    (a for flow_sde and cps, eta for dance and ddim). num_steps: training rollouts;
    eval_num_steps: greedy (ODE / deterministic DDIM) evaluation. classifier_free_guidance: on or off
    in training rollouts and log-probs; guidance-distilled FLUX.1 / HunyuanVideo take guidance_scale as an
    embedding without it, and with it the stock call's true CFG (embedded_guidance_scale).
    turning_points: TP-GRPO step rewards (`turning_point.py`) for the trained window, at most
    `tp_max_extra_passes` extra denoiser calls per rollout for the ODE completions."""

    # model, tiny_args, dtype, device: as CausalLMConfig's, but for a diffusers pipeline (no tokenizer)
    model: str = field(default="", metadata={"help": (
        "A diffusers pipeline: hub id, local path, or tiny:sd3 / tiny:flux / tiny:sd15 / tiny:pixel-flow / "
        "tiny:pixel-flow-unet / tiny:pixel-flow-video / tiny:wan-t2v / tiny:wan-i2v / tiny:hunyuan-video / tiny:stable-audio-3 / "
        "tiny:audioldm2 / tiny:ltx2 / tiny:ltx2-i2v (tiny random "
        "pipelines; pixel-flow draws pixels directly, an MMDiT or a UNet, pixel-flow-video a clip's frames stacked "
        "on a UNet's channels; pixel-flow-video, wan and hunyuan-video are video pipelines, "
        "stable-audio-3 and audioldm2 sound ones, ltx2 (text) and ltx2-i2v "
        "(image) video with its sound).")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny pipeline builder when model is tiny:NAME.")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the pipeline to this device; null: leave placement to accelerate.")})
    height: int = field(default=512, metadata={"help": "Image (video frame) height in pixels."})
    width: int = field(default=512, metadata={"help": "Image (video frame) width in pixels."})
    num_frames: int = field(default=1, metadata={"help": (
        "Frames of a video (Wan, HunyuanVideo; 4k + 1 for their VAEs' 4x time compression); image families "
        "ignore it.")})
    fps: int | None = field(default=None, metadata={"help": (
        "Frames per second of the generated videos, handed to video rewards as the `fps` column (motion per "
        "second, VideoAlign's frame sampling); null: the family's (Wan 16, HunyuanVideo 15, as diffusers' "
        "examples export them; LTX-2 24, where it also sets the sound's length, num_frames / fps seconds, and the "
        "positions the model reads). Image families ignore it.")})
    duration: float | None = field(default=None, metadata={"help": (
        "Sound families: the seconds each completion lasts (Stable Audio 3: the pipeline's duration "
        "conditioning, null its 10 s; AudioLDM 2: the mel spectrogram's length, null the UNet's sample_size, "
        "10.24 s for cvssp/audioldm2). Image and video families refuse it.")})
    image_column: str | None = field(default=None, metadata={"help": (
        "Image-to-video (Wan I2V, LTX-2 I2V) and image editing (Qwen-Image-Edit / Edit-Plus, FLUX.1 Kontext): the column holding "
        "each prompt's conditioning (source) image (a path or a PIL image); required by those pipelines, unused "
        "by the others.")})
    source_area: int | None = field(default=None, metadata={"help": (
        "Image editing: the area in pixels each source image (policy.image_column) is resized to, its aspect "
        "ratio kept (Qwen-Image-Edit, Edit-Plus's VAE view: sides rounded to 32, the stock pipeline's calculate_dimensions; FLUX.1 "
        "Kontext: rounded to its packed latents); null: as the stock pipeline resizes it (Qwen-Image-Edit 1024 x "
        "1024; Kontext the preferred resolution nearest its aspect ratio). See docs/editing.md.")})
    flow_shift: float | None = field(default=None, metadata={"help": (
        "The flow-matching scheduler's timestep shift (DanceGRPO's HunyuanVideo run: 5); null keeps the "
        "pipeline's own. Not for schedulers with resolution-dependent shifting (FLUX).")})
    vae_tiling: bool = field(default=False, metadata={"help": (
        "Decode with the VAE's own tiling (spatial tiles, and temporal ones for video VAEs) to bound the "
        "decoding memory of large frames and long videos.")})
    num_steps: int = field(default=10, metadata={"help": (
        "Denoising steps of training rollouts (Flow-GRPO 10 for SD3.5, 6 for FLUX).")})
    eval_num_steps: int = field(default=40, metadata={"help": (
        "Denoising steps of greedy evaluation (ODE / deterministic DDIM; Flow-GRPO 40 / 28).")})
    guidance_scale: float = field(default=4.5, metadata={"help": (
        "Classifier-free guidance scale (FLUX: the guidance embedding's value).")})
    classifier_free_guidance: bool = field(default=True, metadata={"help": (
        "Use classifier-free guidance in training rollouts and log-probs (SD3, SD 1.5, ...). Guidance-distilled "
        "models (FLUX.1, FLUX.1 Kontext, HunyuanVideo) take policy.guidance_scale as an embedding when false; "
        "true gives them the stock call's true CFG (policy.embedded_guidance_scale).")})
    guidance_scale_2: float | None = field(default=None, metadata={"help": (
        "A two-expert model's CFG scale below the experts' boundary timestep (Wan 2.2 A14B's low-noise "
        "expert, transformer_2; the stock call's guidance_scale_2: Wan 2.2 T2V-A14B publishes 3.0 low beside 4.0 "
        "high); null: policy.guidance_scale for both, as the stock call's default.")})
    embedded_guidance_scale: float | None = field(default=None, metadata={"help": (
        "A guidance-embedding model under true CFG (FLUX.1, FLUX.1 Kontext, HunyuanVideo with "
        "policy.classifier_free_guidance=true: two "
        "forwards, prompt and empty negative prompt, combined at policy.guidance_scale, the stock call's "
        "true_cfg_scale): the embedding's value (the stock call's guidance_scale: 6.0 HunyuanVideo's default, 3.5 "
        "FLUX.1's, 2.5 Kontext's). "
        "Required then; without CFG the embedding takes policy.guidance_scale.")})
    stg_scale: float = field(default=0.0, metadata={"help": (
        "LTX-2: spatio-temporal guidance's scale s (the stock call's stg_scale, on both streams): one more forward "
        "of the prompt per step with the self-attention of policy.stg_blocks skipped, x0 += s (x0_c - x0_stg) in "
        "x0 space; 0 off (the stock call's default is 1.0). Needs policy.classifier_free_guidance true and a "
        "transformer built with perturbed_attn; docs/methods.md.")})
    stg_blocks: list[int] = field(default_factory=list, metadata={"help": (
        "LTX-2: the zero-indexed transformer blocks spatio-temporal guidance skips the self-attention of (the "
        "stock call's spatio_temporal_guidance_blocks: [28] its default and LTX-2.3's, [29] LTX-2.0's); required "
        "with policy.stg_scale > 0, checked against the transformer's num_layers.")})
    modality_scale: float = field(default=1.0, metadata={"help": (
        "LTX-2: modality-isolation guidance's scale m (the stock call's modality_scale, on both streams): one more "
        "forward of the prompt per step without the audio-video cross-attention, x0 += (m - 1) (x0_c - x0_iso); "
        "1 off (the stock call's default is 3.0). Needs policy.classifier_free_guidance true.")})
    guidance_rescale: float = field(default=0.0, metadata={"help": (
        "LTX-2: guidance rescale phi (the stock call's guidance_rescale, on each stream): the guided x0 rescaled "
        "to the conditional x0's std, mixed at phi; 0 off (the stock call's default is 0.7). No extra forward. "
        "Needs policy.classifier_free_guidance true.")})
    sampler: str = field(default="flow_sde", metadata={"help": (
        "The stochastic denoising step: flow_sde (Flow-GRPO), dance (DanceGRPO), cps (coefficient-preserving), "
        "ode (deterministic) for flow models; ddim for eps models (SD 1.5)."),
        "choices": "mmrl.tasks.diffusion.samplers:SAMPLERS"})
    noise_level: float = field(default=0.7, metadata={"help": (
        "The sampler's strength: a for flow_sde and cps (Flow-GRPO 0.7 SD3.5, 0.9 FLUX), eta for dance (0.3) and "
        "ddim; 0 gives the deterministic step.")})
    units: Literal["steps", "forward_process"] = field(default="steps", metadata={"help": (
        "What a training unit is: steps = a denoising step of the rollout, its Gaussian log-prob (the GRPO "
        "methods); forward_process = a (clean sample, noise level) pair, the final sample re-noised at one of "
        "the rollout's levels, trained by algorithm.objective: nft (DiffusionNFT; CFG-free, any sampler).")})
    forward_fraction: float = field(default=0.99, metadata={"help": (
        "units: forward_process: each sample trains int(num_steps x this) of the rollout's noise levels, drawn "
        "per sample (DiffusionNFT's timestep_fraction 0.99: 9 of 10).")})
    schedule: StepSchedule = field(default_factory=StepSchedule, metadata={"help": (
        "Which steps are stochastic and which are trained (policy.schedule.kind and its settings).")})
    branching: Branching = field(default_factory=Branching, metadata={"help": (
        "BranchGRPO: each group a tree of rollouts sharing prefixes, split at policy.branching.at (its settings; "
        "see docs/methods.md).")})
    decode_batch: int = field(default=8, metadata={"help": "Images (videos) decoded by the VAE per batch."})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute the denoiser's activations in backward to save memory.")})
    cfg_dropout: float = field(default=0.1, metadata={"help": (
        "In the supervised warm start, prompts are dropped to '' with this probability so that CFG has an "
        "unconditional model.")})
    turning_points: bool = field(default=False, metadata={"help": (
        "TP-GRPO step rewards: each state of the trained window is completed by the ODE and scored; turning "
        "points get the long-term reward (use algorithm.estimator: step).")})
    tp_eta: float = field(default=1.0, metadata={"help": (
        "TP-GRPO's bonus weight of the aggregated long-term reward at a turning point (1 in the paper).")})
    tp_max_extra_passes: int = field(default=64, metadata={"help": (
        "The most extra denoiser calls per rollout for TP-GRPO's ODE completions (a cost bound; an error when "
        "exceeded).")})
    tp_consistent_steps: Literal["all", "first"] = field(default="all", metadata={"help": (
        "TP-GRPO: which steps need the trajectory-consistency condition sign(d_t) sign(R_W - R_{t+1}) > 0 "
        "to be turning points: 'all' (the authors' published run, "
        "select_inter_step_only_from_consistent_trajectory=true) or 'first' (step 0 only)")})
    tp_balanced_bonus: bool = field(default=False, metadata={"help": (
        "TP-GRPO's use_balanced_bonus (on in the authors' published run): keep equally many turning points "
        "of rising and falling rows in the batch, those with the largest |R_W - R_0|")})
    kl_form: Literal["exact", "flow_grpo", "velocity_mse"] = field(default="exact", metadata={"help": (
        "closed-form KL (algorithm.kl_estimator: closed_form): 'exact' = KL of the two step Gaussians, "
        "||mu - mu_ref||^2 / (2 std^2); 'flow_grpo' = Flow-GRPO's train_sd3.py, divided by 2 sigma_t^2 where "
        "sigma_t is the step std without sqrt(|dt|) for flow_sde (= |dt| x exact) and the step std for cps; "
        "'velocity_mse' = UniGRPO's regulariser in its place, mean_d (v_theta - v_ref)^2 of the two velocity "
        "predictions (flow samplers, classifier_free_guidance false)")})
    cps_logprob: Literal["gaussian", "authors"] = field(default="gaussian", metadata={"help": (
        "sampler cps: 'gaussian' = the true log-density; 'authors' = Flow-GRPO's CPS code, "
        "-mean((x - mu)^2) without constants or 1/(2 std^2), so the ratio is true_ratio^(2 std^2) "
        "and the clip range acts on that rescaled ratio")})
