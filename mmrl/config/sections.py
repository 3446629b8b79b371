"""The recipe as typed data: every section of a recipe except ``algorithm:`` (mmrl/config/algorithm.py)
and the rollouts' ``sampling:``, ``scoring:`` and ``rollout:`` (mmrl/config/rollouts.py), and the whole
recipe, `TrainConfig`. The ``policy`` section is typed by the chosen adapter's own ``Config``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.bench import BenchEvalConfig
from mmrl.config.placement import Launch, PlacementConfig
from mmrl.config.remote import ClientSettings, ServerLaunch
from mmrl.config.rollouts import RolloutConfig, SamplingConfig, ScoringConfig


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
    lr: float = field(default=1e-5, metadata={"stage": True, "help": (
        "AdamW learning rate (LM GRPO ~1e-6; diffusion LoRA 3e-4 in Flow-GRPO). Above 1e-2 a run warns; above "
        "optim.max_lr it is refused.")})
    max_lr: float = field(default=1.0, metadata={"help": (
        "The largest learning rate the recipe may give (optim.lr, warm_start.lr, each stage's optim.lr): a larger "
        "one is refused before anything loads (1e6 typed for 1e-6 would train on noise). Raise it to train with "
        "such a rate on purpose.")})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999], metadata={"help": (
        "AdamW betas [beta1, beta2].")})
    schedule: str = field(default="constant", metadata={"help": (
        "Learning-rate schedule, a name transformers' get_scheduler knows (constant, constant_with_warmup, "
        "linear, cosine, ...).")})
    warmup_steps: int = field(default=0, metadata={"help": "Warm-up steps of the learning-rate schedule."})
    max_grad_norm: float | None = field(default=1.0, metadata={"stage": True, "help": (
        "Clip the gradient norm to this before each optimizer step; null: no clipping.")})
    prompts_per_step: int = field(default=4, metadata={"stage": True, "help": (
        "Prompts (groups) per training step; a step trains on prompts_per_step x group_size rollouts. Must be a "
        "multiple of the number of processes.")})
    micro_batch_size: int = field(default=8, metadata={"stage": True, "help": (
        "Rollouts per forward/backward pass; gradients accumulate over micro-batches and the result equals one "
        "big batch (the aggregation is taken over the whole batch).")})
    lora: LoraConfig = field(default_factory=LoraConfig, metadata={"help": (
        "LoRA settings (optim.lora.r = 0: full fine-tune).")})


@dataclass
class DataConfig:
    name: str | None = field(default=None, metadata={"stage": True, "replaces": ("path",), "help": (
        "A registered synthetic data set (e.g. sorting, arithmetic, shapes); give this or path, not both (a "
        "data.name=... override clears the recipe's data.path)."), "choices": "mmrl.registry:DATASETS"})
    path: str | None = field(default=None, metadata={"stage": True, "replaces": ("name", "args"), "help": (
        "Training rows: a JSON / JSONL / CSV / parquet / arrow file, a datasets.save_to_disk directory, a "
        "directory of data files, or a hub data set id (docs/data.md); give this or name (a data.path=... "
        "override clears the recipe's data.name and data.args).")})
    eval_path: str | None = field(default=None, metadata={"help": (
        "Held-out rows for evaluation (mmrl eval, eval.every), in any form data.path takes.")})
    args: dict[str, Any] = field(default_factory=dict, metadata={"stage": True, "help": (
        "Keyword arguments of the registered data set builder named by `name` (e.g. n_train, seed).")})
    prompt_column: str = field(default="prompt", metadata={"stage": True, "help": (
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
                "{problem: prompt, solution: answer}; a dotted source reads a field of a nested column (copied), "
                "e.g. {reward_model.ground_truth: answer} for verl's rows"})
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
    url: str | list[str] | None = field(default=None, metadata={"help": (
        "The reward served elsewhere (`mmrl serve-reward NAME`): its url, or a list of urls the requests are "
        "spread over; same columns and values as in process (docs/rewards.md#served-rewards)")})
    client: ClientSettings = field(default_factory=ClientSettings, metadata={"help": (
        "With url or replay: request batch size, concurrency, timeout, retries, cache, on_failure")})
    server: ServerLaunch | None = field(default=None, metadata={"help": (
        "With url: a server the run starts itself before the first step and stops with the run")})
    record: str | None = field(default=None, metadata={"help": (
        "With url: a JSON-lines file every request's content hash and answer are appended to, for replay")})
    replay: str | None = field(default=None, metadata={"help": (
        "A file written by record: requests are answered from it, no server needed (give no url with it); a "
        "request it does not hold is an error naming its rows")})


@dataclass
class LoggingConfig:
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={"help": (
        "Where metrics go besides OUTPUT_DIR/metrics.jsonl: tensorboard, wandb, or none.")})
    plot_every: int = field(default=10, metadata={"help": (
        "Redraw OUTPUT_DIR/plots/rewards.png every this many steps, but no more often than keeps the redraws "
        "under 1% of the run's time (a redraw reads the whole metrics file; 0: only once, when the run ends).")})
    progress: bool = field(default=True, metadata={"help": (
        "Show progress bars (training steps, warm start, evaluations) on the main process.")})
    print_every: int = field(default=10, metadata={"help": (
        "With progress false: print one line of the step's metrics (reward, KL, clip fraction, loss) every this "
        "many steps on the main process (0: never).")})
    wandb_project: str = field(default="mmrl", metadata={"help": "The W&B project of the run (report_to: [wandb])."})
    run_name: str | None = field(default=None, metadata={"help": (
        "The W&B run's name; null: the output directory's name. A resumed run continues its W&B run (the id is "
        "kept in OUTPUT_DIR/wandb/mmrl-run-id).")})


@dataclass
class EvalConfig:
    every: int = field(default=0, metadata={"stage": True, "help": (
        "Score the held-out rows every this many training steps (0: never during training).")})
    max_prompts: int = field(default=64, metadata={"stage": True, "help": "The most held-out prompts an evaluation scores."})
    group_size: int = field(default=8, metadata={"stage": True, "help": "Samples per held-out prompt in an evaluation."})
    log_samples: int = field(default=4, metadata={"stage": True, "help": (
        "At each evaluation, the samples of this many held-out prompts (the greedy one and up to 4 sampled, with "
        "the prompt and rewards) go to TensorBoard (images, videos as GIFs, audio, a text table) and to W&B (a "
        "table with wandb.Image / Video / Audio); 0: none.")})
    keep_best: bool = field(default=False, metadata={
        "help": "with save_total_limit: also keep the checkpoint with the highest eval reward_mean "
                "(scored when an eval falls on a save step)"})
    bench: BenchEvalConfig | None = field(default=None, metadata={"help": (
        "A benchmark's subset scored at every evaluation beside the rewards ({name, num_prompts, ...}), logged as "
        "eval/bench/NAME/FIGURE (docs/bench.md); null: none.")})


@dataclass
class WarmStartConfig:
    """Supervised warm start before RL (`mmrl train`, `mmrl demo` and `mmrl sweep`; not again on
    resume): `steps` passes of `batch_size` rows on the data set's `target_column`, gradients
    clipped to `max_grad_norm` if set."""

    steps: int = field(default=0, metadata={"help": (
        "Supervised steps before RL (0: no warm start); the adapter's supervised_loss on target_column. With a KL "
        "(algorithm.beta > 0) the reference is then the warm-started model, kept in checkpoints (ddp or one "
        "process, no LoRA).")})
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

    strategy: str = field(default="ddp", metadata={"choices": "mmrl.distributed:STRATEGIES", "help": (
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
        "The rewards, each with its weight and args, e.g. {accuracy: {weight: 1.0}}: a registered name, or a plain "
        "function named FILE.py:FUNCTION or MODULE:FUNCTION, called as TRL's GRPOTrainer calls reward functions "
        "(conversational completions as [{role: assistant, content}]; docs/howto-reward.md)."),
        "choices": "mmrl.core.scoring:REWARDS"})
    reward_modules: list[str] = field(default_factory=list, metadata={"help": (
        "Files (my_rewards.py) or modules (pkg.rewards) to import before training, so their @register_reward "
        "functions can be named in rewards.")})
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig, metadata={"help": (
        "Advantage estimation, the surrogate loss and its regularisers.")})
    optim: OptimConfig = field(default_factory=OptimConfig, metadata={"help": (
        "Optimizer, learning rate and batch sizes.")})
    sampling: SamplingConfig = field(default_factory=SamplingConfig, metadata={"help": (
        "How the prompts of a step are drawn.")})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": (
        "Who generates the rollouts and when: the trainer, or a rollout worker overlapping the update.")})
    scoring: ScoringConfig = field(default_factory=ScoringConfig, metadata={"help": (
        "When the rollouts are scored: after the whole rollout, or while the next groups generate.")})
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata={"help": (
        "Metrics, plots and the progress bar.")})
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={"help": "Held-out evaluation during training."})
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig, metadata={"help": (
        "An optional supervised warm start before RL.")})
    distributed: DistributedConfig = field(default_factory=DistributedConfig, metadata={"help": (
        "Data parallel or sharded (FSDP2) training over the launched processes.")})
    launch: Launch = field(default="local", metadata={"help": (
        "Who starts the run's processes. local: this process, or those torchrun / accelerate launch started (placed "
        "servers are started by the main process); ray: `mmrl train` places the trainer ranks and the servers on a "
        "Ray cluster, as `mmrl train --ray` does (docs/distributed.md).")})
    placement: PlacementConfig = field(default_factory=PlacementConfig, metadata={"help": (
        "Processes of each role: trainer ranks, rollout servers, reward servers, and what each needs under Ray.")})
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
        "help": "replace another run's files (metrics, config, checkpoints, plots) in output_dir: they are "
                "cleared once the new run's data and model loaded"})
    resume_changes: Literal["refuse", "allow"] = field(default="refuse", metadata={
        "help": "resume with settings that differ from the saved run's config.json: refuse (list them and "
                "stop) or allow (continue; the changes are recorded in config.resume-step-N.json beside the "
                "kept config.json). resume, resume_changes, overwrite, max_steps, output_dir, save_every, "
                "save_total_limit and logging.* may always change; task and policy.model never"})
    save_total_limit: int | None = field(default=None, metadata={
        "help": "keep only the newest N checkpoints (and the best one with eval.keep_best); null keeps all"})
    max_bad_steps: int = field(default=3, metadata={
        "help": "a step whose loss or gradient norm is NaN/inf is skipped (counted as nonfinite_skipped); "
                "after this many in a row the run saves a checkpoint and stops; it stops as well after this many "
                "steps in a row in which no reward gave a value for any completion (returned None, failed and "
                "skipped, or unreadable), and a run none of whose steps had a reward ends in an error"})
    stages: list[dict[str, Any]] = field(default_factory=list, metadata={
        "help": "training in stages (Vision-R1 PTST, SARI curriculum): an ordered list of {steps: N, "
                "<overrides>}; stage k takes the recipe's settings with its own overrides of the fields a "
                "stage may change (mmrl/train/plan/stages.py: e.g. policy.max_new_tokens, algorithm.group_size, "
                "optim.lr, data.path, sampling.*, rewards.NAME.weight); max_steps <= the sum of steps"})
