"""Typed recipes: YAML -> dataclasses, with ``key=value`` overrides (dotted for nested fields).

Unknown keys and values of the wrong type are errors naming the dotted key. The ``policy``
section is typed by the chosen adapter's own ``Config`` dataclass (see `mmrl.policy.Policy`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import MissingFileError, UserError


class ConfigError(UserError, ValueError):
    """A recipe or override that does not fit the config schema."""


@dataclass
class AlgorithmConfig:
    """Advantage estimation and the clipped surrogate (docs/methods.md, 'Advantage estimators' and
    'Objectives')."""

    group_size: int = field(default=8, metadata={"help": (
        "Rollouts per prompt (G), the group whose rewards give the baseline. The median estimator (MC-GRPO) needs "
        "an odd G+1; pairwise (2-GRPO) is meant for G = 2.")})
    estimator: str = field(default="grpo", metadata={"help": (
        "Advantage estimator: grpo (DeepSeekMath), dr_grpo (Dr. GRPO: no std), rloo (leave-one-out), median "
        "(MC-GRPO, odd groups), pairwise (2-GRPO), ngrpo (virtual max-reward sample), step (per-unit rewards, "
        "TP-GRPO). Formulas in docs/methods.md."), "choices": "mmrl.advantages:ADVANTAGE_ESTIMATORS"})
    std: Literal["group", "batch", "none"] = field(default="group", metadata={"help": (
        "Divide advantages by the std of the group, of the whole batch (Flow-GRPO's global std), or not at all. "
        "Ignored by dr_grpo and pairwise.")})
    eps: float = field(default=1e-4, metadata={"help": (
        "Added to the std before dividing (1e-4 as TRL; Flow-GRPO also 1e-4).")})
    clip_advantage: float | None = field(default=None, metadata={"help": (
        "Clamp advantages to [-c, c] (Flow-GRPO uses 5); null: no clip.")})
    drop_zero_variance: bool = field(default=False, metadata={"help": (
        "Groups whose rewards are all equal take no part in the loss (DAPO's zero-variance filter); see "
        "sampling.dynamic to draw replacements.")})
    reward_combine: Literal["sum", "advantage", "gate", "product"] = field(default="sum", metadata={
        "help": "how the recipe's rewards make one: sum (weighted sum, then the estimator), advantage (the "
                "estimator on each reward, then the weighted sum of advantages: DanceGRPO, MixGRPO), gate "
                "(the non-gate rewards' weighted sum counts only where every reward in `gates` reaches its "
                "threshold, plus the gates' own weighted values: Vision-R1's hard formatting result reward) "
                "or product (prod_k w_k r_k); None rewards are left out of each"})
    gates: dict[str, float] = field(default_factory=dict, metadata={
        "help": "with reward_combine: gate, reward name -> threshold; e.g. {format: 1.0} pays the other "
                "rewards only where format >= 1 (Vision-R1). Give a gate weight 0 for a pure gate"})
    max_reward: float = field(default=1.0, metadata={"help": (
        "The reward of NGRPO's virtual sample that joins every group (estimator: ngrpo): the best reward a "
        "rollout can get.")})
    median_scale: Literal["mad", "std"] = field(default="mad", metadata={"help": (
        "normaliser of the median (MC-GRPO) estimator: mad = median absolute deviation of the group + 1e-3 "
        "(MC-GRPO's paper and code, lotusroot-kim/MC-GRPO); std = algorithm.std + algorithm.eps as the "
        "other estimators (mmrl's earlier rule)")})
    median_rescale: bool = field(default=False, metadata={"help": (
        "median (MC-GRPO) estimator: multiply a group's non-zero advantages by (G + 1) / (their number), "
        "as the authors' GSM8K trainer does (their MATH trainer and the paper do not)")})
    ratio_level: Literal["unit", "chunk", "sequence"] = field(default="unit", metadata={"help": (
        "Where the importance ratio is taken: unit (per token / denoising step: GRPO), chunk (one ratio per span "
        "of `chunks` units: Chunk-GRPO), sequence (one per rollout, exp of the mean log-ratio: GSPO).")})
    chunks: list[int] | None = field(default=None, metadata={"help": (
        "Sizes of consecutive unit spans sharing one ratio with ratio_level: chunk; they must sum to the number "
        "of units (Chunk-GRPO's best for 16 steps: [2, 3, 4, 7]).")})
    eps_low: float = field(default=0.2, metadata={"help": (
        "Lower clip range of the ratio, clip(rho, 1 - eps_low, 1 + eps_high) (GRPO 0.2; GSPO ~3e-4; diffusion "
        "~1e-4).")})
    eps_high: float = field(default=0.2, metadata={"help": (
        "Upper clip range of the ratio; above eps_low is DAPO's clip-higher (0.28).")})
    dual_clip: float | None = field(default=None, metadata={"help": (
        "Dual clip c > 1: the loss of a negative-advantage unit is bounded by -c A (Ye et al. 2020); null: off.")})
    beta: float = field(default=0.0, metadata={"help": (
        "Weight of the KL to the reference policy (DeepSeekMath 0.04; Flow-GRPO 0.01-0.04; many recipes 0). 0 "
        "runs no reference pass at all.")})
    kl_estimator: str = field(default="k3", metadata={"help": (
        "Per-unit KL estimate with x = log pi_ref - log pi_theta: k1 = -x, k2 = x^2/2, k3 = exp(x) - x - 1 "
        "(Schulman; GRPO's), or closed_form (the adapter's exact KL, e.g. Flow-GRPO's on a diffusion step's "
        "mean)."), "choices": "mmrl.loss:KL_ESTIMATORS,mmrl.loss:CLOSED_FORM_KL"})
    aggregation: str = field(default="token_mean", metadata={"help": (
        "How unit losses are averaged over the batch: token_mean (1 / units in the batch: DAPO), "
        "seq_mean_token_mean (mean over a row's units, then rows: original GRPO), seq_mean_token_sum_norm (1 / "
        "(rows x max_units): Dr. GRPO)."), "choices": "mmrl.loss:AGGREGATIONS"})
    max_units: int | None = field(default=None, metadata={"help": (
        "The constant of seq_mean_token_sum_norm (Dr. GRPO's max completion length); null: the adapter's bound "
        "(e.g. max_new_tokens), else the batch's longest rollout.")})
    entropy_coef: float = field(default=0.0, metadata={"help": (
        "Entropy bonus: -coef x H_u is added to each unit's loss (token families). 0: off.")})
    llds_coef: float = field(default=0.0, metadata={"help": (
        "Weight lambda of LLDS, the likelihood-preserving regulariser ('On GRPO Collapse in Search-R1'): "
        "penalises max(0, log pi_old - log pi_theta) on the units whose log-prob fell, in rollouts whose "
        "likelihood fell (which rows: llds_rows). 0: off.")})
    llds_rows: Literal["non_negative", "all"] = field(default="non_negative", metadata={"help": (
        "which rows LLDS preserves (algorithm.llds_coef > 0): non_negative = only rows (units) with "
        "advantage >= 0, as the LLDS authors' code and model card (Deng et al. 2025); all = every row "
        "whose likelihood fell, so a negative-advantage row is pushed back up (mmrl's earlier rule)")})
    prune_threshold: float = field(default=0.0, metadata={"help": (
        "Rows whose largest |advantage| is below this skip the update (CPPO-style pruning of low-advantage "
        "completions). 0: off.")})
    mu: int = field(default=1, metadata={"help": (
        "Update passes (optimizer steps) over each batch of rollouts (GRPO's mu; d1 uses 12). With mu > 1 the old "
        "log-probs are kept from before the first pass and the ratio departs from 1.")})
    objective: str = field(default="clip", metadata={"help": (
        "The surrogate loss: clip (PPO/GRPO clipped ratio) or wd1 (ratio-free weighted likelihood, Tang et al. "
        "2025, softmax of advantages per group)."), "choices": "mmrl.loss:OBJECTIVES"})
    rollout_correction: Literal["none", "tis", "mis"] = field(default="none", metadata={"help": (
        "Correct for the gap between the rollout sampler's log-probs (Rollout.rollout_logp) and the training "
        "forward's old log-probs, per unit, with rho = pi_old / pi_rollout (detached): tis = truncated IS, the "
        "unit's policy-gradient loss times min(rho, cap); mis = masked IS, times rho where rho <= cap and 0 above "
        "(TRL's token_truncate / token_mask, verl's token-level rollout_is). none: measured only "
        "(rollout/logp_diff_*). Needs an adapter that records rollout log-probs.")})
    rollout_correction_cap: float = field(default=2.0, metadata={"help": (
        "The cap C of rollout_correction: tis truncates rho at C, mis drops the units with rho > C (verl's "
        "rollout_is_threshold default 2; TRL's vllm_importance_sampling_clip_max default 3).")})


@dataclass
class LoraConfig:
    r: int = field(default=0, metadata={"help": (
        "LoRA rank (peft); 0 trains the full model. With LoRA on, the reference policy is the same model with the "
        "adapter disabled (Flow-GRPO uses 32).")})
    alpha: int = field(default=16, metadata={"help": (
        "LoRA scaling alpha (the update is scaled by alpha / r; Flow-GRPO uses 64).")})
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch."})
    target_modules: list[str] | str = field(default="all-linear", metadata={"help": (
        "Modules that get LoRA adapters: a list of module names, or peft's 'all-linear'.")})


@dataclass
class OptimConfig:
    lr: float = field(default=1e-5, metadata={"help": (
        "AdamW learning rate (LM GRPO ~1e-6; diffusion LoRA 3e-4 in Flow-GRPO).")})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": (
        "AdamW betas [beta1, beta2].")})
    schedule: str = field(default="constant", metadata={"help": (
        "Learning-rate schedule, a name transformers' get_scheduler knows (constant, constant_with_warmup, "
        "linear, cosine, ...).")})
    warmup_steps: int = field(default=0, metadata={"help": "Warm-up steps of the learning-rate schedule."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": (
        "Clip the gradient norm to this before each optimizer step; null: no clipping.")})
    prompts_per_step: int = field(default=4, metadata={"help": (
        "Prompts (groups) per training step; a step trains on prompts_per_step x group_size rollouts. Must be a "
        "multiple of the number of processes.")})
    micro_batch_size: int = field(default=8, metadata={"help": (
        "Rollouts per forward/backward pass; gradients accumulate over micro-batches and the result equals one "
        "big batch (the aggregation is taken over the whole batch).")})
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": (
        "LoRA settings (optim.lora.r = 0: full fine-tune).")})


@dataclass
class SamplingConfig:
    """How the prompts of a step are drawn (docs/methods.md, 'Prompt sampling')."""

    strategy: Literal["uniform", "variance"] = field(default="uniform", metadata={"help": (
        "How a step's prompts are drawn: uniform (epochs of a seeded shuffle) or variance (MMR1 Variance-Aware "
        "Sampling: prompts whose recent rewards vary are favoured).")})
    variance_mix: float = field(default=0.5, metadata={"help": (
        "With strategy variance: the fraction of prompts drawn by Variance Promotion Score; the rest are drawn "
        "uniformly.")})
    variance_window: int = field(default=4, metadata={"help": (
        "With strategy variance: how many recent rewards per prompt its outcome variance is taken over.")})
    variance_score: Literal["pass_rate", "variance"] = field(default="pass_rate", metadata={"help": (
        "strategy variance: a prompt's Variance Promotion Score from its recent outcomes: pass_rate = "
        "p(1 - p) of their mean p, outcomes in [0, 1] (MMR1's learnability, LengSicong/MMR1); variance = "
        "their population variance (mmrl's earlier rule; equal to p(1 - p) for 0/1 outcomes)")})
    variance_scaling: Literal["min_max", "none"] = field(default="min_max", metadata={"help": (
        "strategy variance: min_max = scores min-max scaled over the whole data set, (s - min) / (max - min "
        "+ 1e-8), before they become sampling weights (MMR1's trainer); none = raw scores (mmrl's earlier rule)")})
    variance_reward: str | None = field(default=None, metadata={"help": (
        "strategy variance: the reward (a name under `rewards`) whose values are the outcomes, e.g. a 0/1 "
        "accuracy reward as MMR1; null = the weighted reward total")})
    curriculum_column: str | None = field(default=None, metadata={"help": (
        "A numeric data-set column (difficulty): rows are walked easy -> hard by it, wrapping round (curriculum, "
        "SARI); null: off. Applies to strategy uniform.")})
    curriculum_descending: bool = field(default=False, metadata={"help": (
        "Walk the curriculum column from high to low values instead.")})
    dynamic: bool = field(default=False, metadata={"help": (
        "DAPO dynamic sampling: draw more prompts until the batch has prompts_per_step groups with non-zero "
        "reward variance (or dynamic_max_tries draws are used).")})
    dynamic_max_tries: int = field(default=4, metadata={"help": "With dynamic: the most draws per step."})


@dataclass
class DataConfig:
    name: str | None = field(default=None, metadata={"help": (
        "A registered synthetic data set (e.g. sorting, arithmetic, shapes); give this or path, not both."),
        "choices": "mmrl.registry:DATASETS"})
    path: str | None = field(default=None, metadata={"help": (
        "Training rows: a JSON / JSONL / CSV / parquet / arrow file, a datasets.save_to_disk directory, a "
        "directory of data files, or a hub data set id (docs/data.md); give this or name.")})
    eval_path: str | None = field(default=None, metadata={"help": (
        "Held-out rows for evaluation (mmrl eval, eval.every), in any form data.path takes.")})
    args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments of the registered data set builder named by `name` (e.g. n_train, seed).")})
    prompt_column: str = field(default="prompt", metadata={"help": (
        "The column that holds each row's prompt (a string or a list of chat messages).")})
    split: str | None = field(default=None, metadata={
        "help": "split of data.path (a hub data set or a save_to_disk directory with splits); default: its "
                "only split, else 'train'"})
    eval_split: str | None = field(default=None, metadata={
        "help": "split of data.eval_path (default: as data.split); data.eval_path may name the same data set "
                "as data.path"})
    subset: str | None = field(default=None, metadata={
        "help": "configuration (subset) of a hub data set, the `name` of datasets.load_dataset"})
    media_root: str | None = field(default=None, metadata={
        "help": "directory that relative media paths resolve against (default: the data file's directory)"})
    columns: dict[str, str] = field(default_factory=dict, metadata={
        "help": "renames {source: target} applied to every row before anything reads it, e.g. "
                "{problem: prompt, solution: answer}"})
    extract: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{column: regex}: the column becomes the first group of the regex's last match, e.g. "
                "{answer: '#### (.*)'} for GSM8K or {answer: '<answer>(.*?)</answer>'}; a row without a match "
                "is invalid"})
    pick: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{column: list_column}: an index in the column becomes that item of the list column, e.g. "
                "{answer: multi_choice} for R1-AQA (after data.columns and data.extract)"})
    prompt_template: str | None = field(default=None, metadata={
        "help": "builds the prompt column from {column} fields of the row (str.format; a list is its items "
                "joined by newlines, {col!r} the Python list, {col[0]} an item), e.g. '{problem}Options:\\n{options}'; "
                "a template without fields is a fixed prompt"})
    answer_from_conversation: bool = field(default=False, metadata={
        "help": "a conversation prompt (messages or LLaVA conversations) that ends with an assistant turn: "
                "true makes that turn the reference answer (in data.answer_column); false refuses the row"})
    answer_column: str = field(default="answer", metadata={
        "help": "column that data.answer_from_conversation writes the final assistant turn to"})
    validate: Literal["all", "sample", "off"] = field(default="all", metadata={
        "help": "rows checked before the model loads (prompt and reward columns present, media readable): "
                "all, an even sample of data.validate_rows per set, or off"})
    validate_rows: int = field(default=1000, metadata={"help": "rows per set checked by data.validate=sample"})
    skip_invalid: bool = field(default=False, metadata={
        "help": "drop rows that fail validation (their count is logged) instead of stopping with the list"})


@dataclass
class RewardSpec:
    weight: float = field(default=1.0, metadata={"help": (
        "The reward's weight in the combined reward (algorithm.reward_combine).")})
    args: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "Keyword arguments bound to the reward function (e.g. {mu: 1.0} for t_grpo).")})
    columns: dict[str, str] = field(default_factory=dict, metadata={
        "help": "{argument: column}: the reward reads its argument from that data column, e.g. "
                "{boxes: solution}; an argument that is also a data column is an error naming both"})


@dataclass
class LoggingConfig:
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={"help": (
        "Where metrics go besides OUTPUT_DIR/metrics.jsonl: tensorboard, wandb, or none.")})
    plot_every: int = field(default=10, metadata={"help": (
        "Redraw OUTPUT_DIR/plots/rewards.png every this many steps (0: never).")})
    progress: bool = field(default=True, metadata={"help": "Show a progress bar on the main process."})


@dataclass
class EvalConfig:
    every: int = field(default=0, metadata={"help": (
        "Score the held-out rows every this many training steps (0: never during training).")})
    max_prompts: int = field(default=64, metadata={"help": "The most held-out prompts an evaluation scores."})
    group_size: int = field(default=8, metadata={"help": "Samples per held-out prompt in an evaluation."})
    keep_best: bool = field(default=False, metadata={
        "help": "with save_total_limit: also keep the checkpoint with the highest eval reward_mean "
                "(scored when an eval falls on a save step)"})


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL (used by the demos): `steps` passes of `batch_size`
    rows on the data set's `target_column`, gradients clipped to `max_grad_norm` if set."""

    steps: int = field(default=0, metadata={"help": (
        "Supervised steps before RL (0: no warm start); the adapter's supervised_loss on target_column.")})
    lr: float = field(default=1e-3, metadata={"help": "Learning rate of the warm start."})
    batch_size: int = field(default=32, metadata={"help": "Rows per warm-start step."})
    target_column: str = field(default="target", metadata={"help": (
        "The data-set column holding the supervised target of each row.")})
    max_grad_norm: float | None = field(default=None, metadata={"help": (
        "Clip the warm start's gradient norm to this; null: no clipping.")})
    schedule: Literal["constant", "cosine"] = field(default="constant", metadata={"help": (
        "Learning rate over the warm start: constant, or cosine (from lr down to 0 at the last step).")})
    warmup_steps: int = field(default=0, metadata={"help": (
        "Steps over which the learning rate rises linearly from 0 to lr before the schedule.")})


@dataclass
class DistributedConfig:
    """How the policy is spread over processes (docs/distributed.md). The same recipe runs under
    `torchrun` or `accelerate launch`, on GPUs or on CPU processes (gloo)."""

    strategy: Literal["ddp", "fsdp", "zero3"] = field(default="ddp", metadata={"help": (
        "ddp: every process holds the whole model and gradients are averaged (data parallel); fsdp: parameters, "
        "gradients and AdamW state are sharded over the processes (PyTorch FSDP2, fully_shard): each holds 1/N "
        "of them between layers; zero3: the same with DeepSpeed ZeRO stage 3 (pip install deepspeed; each "
        "module's parameters are gathered for its forward and backward, so no-grad passes and rollouts always "
        "run in step over the processes, as rollout_params sharded). With fsdp or zero3, policy.dtype "
        "bfloat16 is the compute dtype: the weights and optimizer state stay fp32 (master copy).")})
    shard_modules: list[str] | None = field(default=None, metadata={"help": (
        "fsdp: class names of the blocks that form one shard unit each (gathered together in forward, freed "
        "after); null: the model's own list (transformers' and diffusers' _no_split_modules: decoder layers, "
        "vision / audio encoder blocks, DiT blocks). The rest of the model forms one unit with the root.")})
    reshard_after_forward: bool = field(default=True, metadata={"help": (
        "fsdp: free each unit's gathered parameters after its forward and gather them again in backward "
        "(ZeRO-3 memory); false keeps them until backward (ZeRO-2-like: less communication, more memory).")})
    rollout_params: Literal["gathered", "sharded"] = field(default="gathered", metadata={"help": (
        "fsdp: how rollouts, evaluation and the no-grad old / reference log-prob passes see the weights. "
        "gathered: all units are gathered once beforehand (one whole copy in the compute dtype per process "
        "while they run; as fast as an unsharded model; each process generates at its own pace). sharded: each "
        "forward gathers its units as training does (no whole copy; one all-gather per unit per forward, so per "
        "generated token, and processes generate in step). TP-GRPO's turning-point passes always gather. "
        "With policy.rollout_engine vllm, rollouts and evaluation never gather the policy (the engine's weight "
        "sync gathers one shard unit at a time): this setting then concerns the log-prob passes only. zero3 always "
        "runs them as sharded (DeepSpeed gathers each module's parameters as it runs).")})
    offload: bool = field(default=False, metadata={"help": (
        "fsdp, zero3: keep the parameter shards, gradients and AdamW state in CPU memory (the optimizer step runs "
        "on the CPU); each unit is copied to the device for its forward and backward.")})


@dataclass
class TrainConfig:
    task: str = field(default="causal_lm", metadata={"help": (
        "The task adapter (model family) to train; its Config types the policy section."),
        "choices": "mmrl.registry:ADAPTERS"})
    policy: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The adapter's own settings (model, sampling, ...), typed by the adapter's Config: see `mmrl explain "
        "policy.KEY --task TASK`.")})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "Where the prompts come from."})
    rewards: dict[str, RewardSpec] = field(default_factory=dict, metadata={"help": (
        "The rewards by registered name, each with its weight and args, e.g. {accuracy: {weight: 1.0}}."),
        "choices": "mmrl.reward_registry:REWARDS"})
    reward_modules: list[str] = field(default_factory=list, metadata={"help": (
        "Files (my_rewards.py) or modules (pkg.rewards) to import before training, so their @register_reward "
        "functions can be named in rewards.")})
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig, metadata={"help": (
        "Advantage estimation, the surrogate loss and its regularisers.")})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": (
        "Optimizer, learning rate and batch sizes.")})
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata={"help": (
        "How the prompts of a step are drawn.")})
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata={"help": (
        "Metrics, plots and the progress bar.")})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "Held-out evaluation during training."})
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig, metadata={"help": (
        "An optional supervised warm start before RL.")})
    distributed: DistributedConfig = field(default_factory=DistributedConfig, metadata={"help": (
        "Data parallel or sharded (FSDP2) training over the launched processes.")})
    output_dir: str = field(default="outputs/run", metadata={"help": (
        "Where metrics, plots and checkpoints are written.")})
    seed: int = field(default=0, metadata={"help": (
        "Run seed: every prompt draw and rollout is seeded from (seed, step, draw, group), the same on any number "
        "of processes.")})
    max_steps: int = field(default=100, metadata={"help": (
        "Training steps (each: rollouts, advantages, mu update passes).")})
    save_every: int = field(default=0, metadata={"help": (
        "Write a checkpoint every this many steps (0: only at the end).")})
    resume: bool | Literal["auto"] = field(default=False, metadata={
        "help": "true: continue the run in output_dir from its newest good checkpoint (an error if there is "
                "none); auto: continue if there is one, else start a new run; false: a new run (refuses a "
                "directory that holds another run's files unless overwrite=true)"})
    overwrite: bool = field(default=False, metadata={
        "help": "clear another run's files (metrics, config, checkpoints, plots) from output_dir before starting"})
    save_total_limit: int | None = field(default=None, metadata={
        "help": "keep only the newest N checkpoints (and the best one with eval.keep_best); null keeps all"})
    max_bad_steps: int = field(default=3, metadata={
        "help": "a step whose loss or gradient norm is NaN/inf is skipped (counted as nonfinite_skipped); "
                "after this many in a row the run saves a checkpoint and stops"})
    stages: list[dict[str, Any]] = field(default_factory=list, metadata={
        "help": "training in stages (Vision-R1 PTST, SARI curriculum): an ordered list of {steps: N, "
                "<overrides>}; stage k takes the recipe's settings with its own overrides of the fields a "
                "stage may change (mmrl/stages.py: e.g. policy.max_new_tokens, algorithm.group_size, "
                "optim.lr, data.path, sampling.*, rewards.NAME.weight); max_steps <= the sum of steps"})


def _check_value(tp: Any, value: Any, key: str) -> Any:
    """Return `value` converted to type `tp`, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_value(arg, value, key)
            except ConfigError as e:
                errors.append(str(e))
        # one alternative (an Optional field): its own message says what was expected
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {tp}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {k: _check_value(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {tp}")


def from_dict(cls: type, data: dict[str, Any] | None, prefix: str = "") -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and wrong types."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'recipe'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs, problems = {}, []  # every key is checked; the problems are reported together
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"unknown config key {dotted!r}{hint}; valid keys: {', '.join(sorted(names))}")
            continue
        try:
            kwargs[key] = _check_value(hints[key], value, dotted)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    return cls(**kwargs)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set ``a.b.c=value`` pairs in a nested mapping; values are parsed as YAML scalars."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            where = f" ({e.problem})" if getattr(e, "problem", None) else ""
            raise ConfigError(f"override {item!r}: the value {raw!r} is not valid YAML{where}; quote it "
                              f"(key='\"text\"') to pass it as a string") from None
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            if isinstance(node, list):  # a list entry by index, e.g. stages.1.steps=50
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {key!r}: {part!r} is not an index of a list of {len(node)}")
                child = node[int(part)]
            else:
                child = node.setdefault(part, {})
            if not isinstance(child, (dict, list)):
                raise ConfigError(f"override {key!r}: {part!r} is not a section")
            node = child
        if isinstance(node, list):
            raise ConfigError(f"override {key!r}: name a field of a list entry (e.g. stages.0.steps=10)")
        node[parts[-1]] = value
    return data


def load_recipe(path: str | Path, overrides: list[str] = ()) -> TrainConfig:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"recipe {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"{where}: YAML syntax error: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of keys to values, got {type(data).__name__}")
    return parse_config(data, overrides)


def parse_config(data: dict[str, Any], overrides: list[str] = ()) -> TrainConfig:
    data = apply_overrides(copy.deepcopy(data), list(overrides))
    cfg = from_dict(TrainConfig, data)
    if cfg.stages:  # each stage's overrides are checked now, before any model loads
        from .stages import StagePlan
        StagePlan(cfg)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
