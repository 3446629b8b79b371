"""The `dlm` adapter's settings (`policy:` with `task: dlm`): the family, the model, its decoding
and the log-prob estimator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..lm.logprob_settings import (
    logprob_check_field,
    logprob_check_tolerance_field,
    logprob_chunk_tokens_field,
    logprob_setting_problems,
    logprobs_from_field,
)
from .block_diffusion import BlockDiffusionConfig
from .estimators import LOGP_ESTIMATORS
from .generation import DecodeConfig

AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")
# family diffusion_gemma's estimators (tasks/dlm/block_diffusion_scoring.py)
BLOCK_DIFFUSION_ESTIMATORS = ("final_step", "diffu_grpo")


@dataclass
class DLMConfig(DecodeConfig, BlockDiffusionConfig):
    """The masked family's decoding settings (`DecodeConfig`: gen_length, block_length, steps,
    temperature, remasking, schedule, cfg_scale, eos_early_rejection, eos_min_gamma), DiffusionGemma's
    (`BlockDiffusionConfig`), the model's and the log-prob estimator's."""
    family: Literal["masked", "diffusion_gemma"] = field(default="masked", metadata={"help": (
        "The kind of diffusion LM: masked (a mask token, LLaDA-style semi-autoregressive block decoding: LLaDA, "
        "Dream, tiny:dlm-char) or diffusion_gemma (DiffusionGemmaForBlockDiffusion: block diffusion with uniform-state "
        "noise and self-conditioning, google/diffusiongemma-*, tiny:diffusion-gemma).")})
    # model .. device, chat_template, system_prompt repeat CausalLMConfig's: its sampling fields mean nothing here
    model: str = field(default="", metadata={"help": (
        "Hub id or local path of the diffusion LM (LLaDA-8B-Instruct, Dream-7B, a DiffusionGemma), or tiny:dlm-char / "
        "tiny:diffusion-gemma.")})
    tokenizer: str | None = field(default=None, metadata={"help": (
        "Hub id or path of the tokenizer; null: the model's.")})
    tiny_args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the tiny model builder when model is tiny:NAME.")})
    auto_class: str = field(default="AutoModelForCausalLM", metadata={"help": (
        "The transformers class that loads the model: AutoModelForCausalLM, AutoModel (LLaDA, Dream with "
        "trust_remote_code) or AutoModelForMaskedLM."), "choices": "mmrl.tasks.dlm.config:AUTO_CLASSES"})
    trust_remote_code: bool = field(default=False, metadata={"help": (
        "Allow the model's own code from the hub (LLaDA, Dream).")})
    dtype: str = field(default="float32", metadata={"help": (
        "Weights' dtype: float32, bfloat16 or float16 (log-probs are always fp32)."),
        "choices": "mmrl.tasks.model_loading:DTYPES"})
    device: str | None = field(default=None, metadata={"help": (
        "Move the model to this device; null: leave placement to accelerate.")})
    mask_token_id: int | None = field(default=None, metadata={"help": (
        "The mask token's id; null: the tokenizer's mask token (LLaDA: 126336).")})
    logits_shift: bool = field(default=False, metadata={"help": (
        "The logits at position i predict token i + 1 (Dream); false: they predict token i (LLaDA).")})
    attention_mask: Literal["2d", "4d", "none"] = field(default="2d", metadata={"help": (
        "How padding is shown to the model: 2d (a padding mask), 4d (a full [B, 1, L, L] mask: Dream), none.")})
    chat_template: bool | None = field(default=None, metadata={"help": (
        "Apply the tokenizer's chat template: true, false, or null (only for prompts given as message lists).")})
    system_prompt: str | None = field(default=None, metadata={"help": (
        "A system message put first when the chat template is applied.")})
    image_column: str = field(default="image", metadata={"help": (
        "family diffusion_gemma: the data-set column holding each prompt's image(s) (a path, a PIL image or a list), "
        "read by the vision tower through the model's processor.")})
    # log-prob estimator (estimators.py)
    estimator: str = field(default="diffu_grpo", metadata={"help": (
        "Log-prob estimator of completion tokens (docs/dlm.md): diffu_grpo (d1: one view, completion masked, prompt "
        "masked with p_mask), coupled (DiffuCoder: two complementary masks), elbo (GDPO: Gauss-Legendre ELBO "
        "quadrature), spg (SPG: block-wise masks; lower and upper bounds for algorithm.objective spg), espo (ESPO: "
        "complementary masks, a sequence ELBO), tracerl (TraceRL: each token at the decoding step that committed "
        "it), agrpo (AGRPO: a sample of the decoding steps per pass); family diffusion_gemma: final_step (the "
        "sampler's own: each token at its block's last denoising step, canvas and self-conditioning replayed) or "
        "diffu_grpo (the block fully noised, no self-conditioning)."),
        "choices": "mmrl.tasks.dlm.estimators:LOGP_ESTIMATORS,mmrl.tasks.dlm.config:BLOCK_DIFFUSION_ESTIMATORS"})
    p_mask: float = field(default=0.15, metadata={"help": (
        "diffu_grpo: the probability that each prompt token is masked in the scoring view (d1: 0.15), redrawn "
        "each update pass.")})
    elbo_points: int = field(default=4, metadata={"help": (
        "elbo: Gauss-Legendre time points (views, forward passes) of the ELBO quadrature (GDPO).")})
    coupled_full_view: bool = field(default=True, metadata={"help": (
        "estimator coupled: average in the view with the whole completion masked, logp = (log p_full_mask + "
        "coupled term) / 2, as the DiffuCoder paper and apple/ml-diffucoder (3 forwards); false = the "
        "coupled term alone, halved (2 forwards; mmrl's earlier rule)")})
    spg_views: int = field(default=2, metadata={"help": (
        "estimator spg: masked views per row and pass (SPG's num_t; its scripts use 2), at most gen_length / "
        "block_length.")})
    spg_beta: float = field(default=1.5, metadata={"help": (
        "estimator spg: the upper bound's beta, log mean p^beta / beta (SPG's eubo_beta: 1.5 for GSM8K and MATH, "
        "2.0 Countdown, 1.0 Sudoku).")})
    spg_negative: Literal["eubo", "mix", "elbo"] = field(default="mix", metadata={"help": (
        "estimator spg: the bound rows with advantage <= 0 train on: eubo (the upper bound), mix (spg_mix_weight eubo "
        "+ (1 - spg_mix_weight) elbo: SPG's best) or elbo (the lower bound, no sandwich).")})
    spg_mix_weight: float = field(default=0.5, metadata={"help": (
        "estimator spg, spg_negative mix: the upper bound's share (SPG's mix_weight 0.5).")})
    espo_samples: int = field(default=2, metadata={"help": (
        "estimator espo: pairs of complementary views per row and pass (ESPO's num_mc; its runs use 2), each 2 "
        "forward passes.")})
    trace_shrink: int = field(default=1, metadata={"help": (
        "estimator tracerl: consecutive decoding steps scored in one view (TraceRL's shrink; its LLaDA config uses 8 "
        "with 512 steps); steps / trace_shrink forward passes.")})
    agrpo_samples: int = field(default=4, metadata={"help": (
        "estimator agrpo: decoding steps drawn per row and pass (AGRPO's mc_samples; its config uses 24 of 128 "
        "steps), one forward pass each.")})
    agrpo_step_sampling: Literal["uniform", "entropy"] = field(default="uniform", metadata={"help": (
        "estimator agrpo: how the steps are drawn: uniform (stratified) or entropy (in proportion to the summed "
        "entropies of the tokens each step committed, importance-weighted back: AGRPO's importance_sampling).")})
    gradient_checkpointing: bool = field(default=False, metadata={"help": (
        "Recompute activations in backward to save memory.")})
    logprobs_from: Literal["hidden_states", "logits"] = logprobs_from_field("logits", (
        " Masked diffusion LMs default to logits: with hidden_states the dlm demo learned less (sampled reward "
        "0.797 -> 0.880 against 0.797 -> 1.014) although the two paths' log-probs and gradients agree on a "
        "micro-batch; until that is understood, hidden_states is an opt-in here."))
    logprob_chunk_tokens: int = logprob_chunk_tokens_field()
    logprob_check: bool = logprob_check_field()
    logprob_check_tolerance: float | None = logprob_check_tolerance_field()
    sft_seed: int = field(default=0, metadata={"help": (
        "Seed of the random masks of the supervised warm start (LLaDA's SFT loss).")})


def config_problems(cfg: DLMConfig) -> list[str]:
    """What is wrong with `cfg` that is known before any model loads, one line per problem."""
    problems = list(logprob_setting_problems(cfg))
    if cfg.family == "diffusion_gemma":
        if cfg.estimator not in BLOCK_DIFFUSION_ESTIMATORS:
            problems.append(f"policy.estimator={cfg.estimator!r}: family diffusion_gemma takes "
                            f"{' or '.join(BLOCK_DIFFUSION_ESTIMATORS)}; the masked estimators' weights come from "
                            "the mask token's ELBO, and DiffusionGemma corrupts with uniform noise (docs/dlm.md)")
        if cfg.p_mask != 0:
            problems.append(f"policy.p_mask={cfg.p_mask}: family diffusion_gemma encodes the prompt causally and "
                            "never corrupts it; set 0")
        if cfg.logprobs_from != "logits":
            problems.append("policy.logprobs_from: family diffusion_gemma reads its log-probs from the logits")
        try:
            BlockDiffusionConfig.check(cfg)
        except ValueError as e:
            problems.append(str(e))
    elif cfg.estimator not in LOGP_ESTIMATORS.names():
        problems.append(f"policy.estimator={cfg.estimator!r} is not one of {', '.join(LOGP_ESTIMATORS.names())}")
    else:
        problems += method_problems(cfg)
    return problems


def method_problems(cfg: DLMConfig) -> list[str]:
    """The masked family's estimator settings."""
    problems = []
    blocks = cfg.gen_length // max(cfg.block_length, 1)
    if cfg.estimator == "spg" and not 1 <= cfg.spg_views <= blocks:
        problems.append(f"policy.spg_views={cfg.spg_views} must be between 1 and the completion's {blocks} blocks "
                        "(gen_length / block_length), as SPG's")
    if cfg.estimator == "spg" and (not cfg.spg_beta > 0 or not 0 <= cfg.spg_mix_weight <= 1):
        problems.append(f"policy.spg_beta={cfg.spg_beta} must be > 0 and policy.spg_mix_weight={cfg.spg_mix_weight} "
                        "in [0, 1]")
    for name in ("espo_samples", "trace_shrink", "agrpo_samples"):
        if getattr(cfg, name) < 1:
            problems.append(f"policy.{name}={getattr(cfg, name)} must be >= 1")
    if cfg.estimator == "agrpo" and cfg.temperature == 0:
        problems.append("policy.temperature=0: estimator agrpo scores each token at the decoding temperature; "
                        "greedy decoding has none")
    return problems
