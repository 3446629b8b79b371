"""TRL's and verl's names of settings, and mmrl's key for each (docs/from-trl-verl.md is this
table; a test keeps the two equal and checks every mmrl key is a real field).

An unknown recipe key that is one of these names gets mmrl's key in its error (`peer_hint`):
TRL's ``GRPOConfig`` fields by their bare name (wherever in the recipe they are written), verl's
by their dotted path (``actor_rollout_ref.rollout.n``, as YAML sections or overrides).
"""

from __future__ import annotations

from typing import Any, NamedTuple

TABLE = "docs/from-trl-verl.md"


class PeerName(NamedTuple):
    mmrl: str   # mmrl's key
    note: str   # how the meaning differs, or ""


TRL = {
    "num_generations": PeerName("algorithm.group_size", ""),
    "max_completion_length": PeerName("policy.max_new_tokens", ""),
    "max_prompt_length": PeerName("policy.max_prompt_length", "cut from the left, as TRL"),
    "learning_rate": PeerName("optim.lr", ""),
    "per_device_train_batch_size": PeerName(
        "optim.micro_batch_size", "rollouts per forward/backward; a step's prompts are optim.prompts_per_step"),
    "gradient_accumulation_steps": PeerName(
        "optim.prompts_per_step", "mmrl accumulates over micro-batches up to the step's prompts x group_size rollouts"),
    "beta": PeerName("algorithm.beta", ""),
    "epsilon": PeerName("algorithm.eps_low", "and algorithm.eps_high, the two sides of the clip"),
    "epsilon_high": PeerName("algorithm.eps_high", ""),
    "loss_type": PeerName("algorithm.aggregation", "grpo: seq_mean_token_mean; dapo, bnpo: token_mean; "
                                                   "dr_grpo: seq_mean_token_sum_norm"),
    "num_iterations": PeerName("algorithm.mu", ""),
    "scale_rewards": PeerName("algorithm.std", "group, batch or none"),
    "importance_sampling_level": PeerName("algorithm.ratio_level", "token: unit; sequence: sequence"),
    "mask_truncated_completions": PeerName("policy.mask_truncated", ""),
    "temperature": PeerName("policy.temperature", ""),
    "top_p": PeerName("policy.top_p", ""),
    "top_k": PeerName("policy.top_k", ""),
    "use_vllm": PeerName("policy.rollout_engine", "vllm or hf"),
    "gradient_checkpointing": PeerName("policy.gradient_checkpointing", ""),
    "max_grad_norm": PeerName("optim.max_grad_norm", ""),
    "weight_decay": PeerName("optim.weight_decay", ""),
    "lr_scheduler_type": PeerName("optim.schedule", ""),
    "warmup_steps": PeerName("optim.warmup_steps", ""),
    "reward_weights": PeerName("rewards.NAME.weight", "one weight per reward, under its name"),
    "save_steps": PeerName("save_every", ""),
    "model_name_or_path": PeerName("policy.model", ""),
    "use_liger_loss": PeerName("policy.logprobs_from", "hidden_states (the default): chunked, in PyTorch"),
}

VERL = {
    "actor_rollout_ref.rollout.n": PeerName("algorithm.group_size", ""),
    "data.max_prompt_length": PeerName("policy.max_prompt_length", "cut from the left, as verl's truncation: left"),
    "data.max_response_length": PeerName("policy.max_new_tokens", ""),
    "data.train_batch_size": PeerName("optim.prompts_per_step", "prompts per step, as verl"),
    "data.train_files": PeerName("data.path", ""),
    "data.val_files": PeerName("data.eval_path", ""),
    "data.prompt_key": PeerName("data.prompt_column", ""),
    "actor_rollout_ref.model.path": PeerName("policy.model", ""),
    "actor_rollout_ref.model.enable_gradient_checkpointing": PeerName("policy.gradient_checkpointing", ""),
    "actor_rollout_ref.model.use_fused_kernels": PeerName("policy.logprobs_from",
                                                          "hidden_states (the default): chunked, in PyTorch"),
    "actor_rollout_ref.actor.optim.lr": PeerName("optim.lr", ""),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": PeerName("optim.micro_batch_size", ""),
    "actor_rollout_ref.actor.ppo_epochs": PeerName("algorithm.mu", ""),
    "actor_rollout_ref.actor.clip_ratio": PeerName("algorithm.eps_low", "and algorithm.eps_high"),
    "actor_rollout_ref.actor.clip_ratio_low": PeerName("algorithm.eps_low", ""),
    "actor_rollout_ref.actor.clip_ratio_high": PeerName("algorithm.eps_high", ""),
    "actor_rollout_ref.actor.clip_ratio_c": PeerName("algorithm.dual_clip", ""),
    "actor_rollout_ref.actor.use_kl_loss": PeerName("algorithm.beta", "a KL loss is on when beta > 0"),
    "actor_rollout_ref.actor.kl_loss_coef": PeerName("algorithm.beta", ""),
    "actor_rollout_ref.actor.kl_loss_type": PeerName("algorithm.kl_estimator", "low_var_kl: k3; kl: k1; mse: k2"),
    "actor_rollout_ref.actor.entropy_coeff": PeerName("algorithm.entropy_coef", ""),
    "actor_rollout_ref.actor.loss_agg_mode": PeerName("algorithm.aggregation", "the same modes, with _ for -"),
    "actor_rollout_ref.actor.grad_clip": PeerName("optim.max_grad_norm", ""),
    "actor_rollout_ref.actor.strategy": PeerName("distributed.strategy", ""),
    "actor_rollout_ref.rollout.name": PeerName("policy.rollout_engine", "vllm or hf"),
    "actor_rollout_ref.rollout.temperature": PeerName("policy.temperature", ""),
    "actor_rollout_ref.rollout.top_p": PeerName("policy.top_p", ""),
    "actor_rollout_ref.rollout.top_k": PeerName("policy.top_k", "0 is off (verl: -1)"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": PeerName("policy.episode.max_turns", ""),
    "actor_rollout_ref.rollout.multi_turn.tool_config_path": PeerName(
        "policy.episode.tools", "the tools as typed functions (zoom, python, FILE.py:FUNCTION), not a YAML of tool classes"),
    "algorithm.adv_estimator": PeerName("algorithm.estimator", ""),
    "algorithm.norm_adv_by_std_in_grpo": PeerName("algorithm.std", "false: none"),
    "trainer.total_training_steps": PeerName("max_steps", ""),
    "trainer.save_freq": PeerName("save_every", ""),
    "trainer.test_freq": PeerName("eval.every", ""),
    "trainer.default_local_dir": PeerName("output_dir", ""),
    "trainer.logger": PeerName("logging.report_to", ""),
}


def _leaves(key: str, value: Any) -> list[str]:
    """`key` and the dotted paths of the leaves under it when `value` is a mapping."""
    if not isinstance(value, dict):
        return [key]
    return [key] + [leaf for k, v in value.items() for leaf in _leaves(f"{key}.{k}", v)]


def peer_hint(key: str, value: Any) -> str | None:
    """mmrl's key for each TRL or verl name in the unknown recipe key `key` (dotted, holding
    `value`), or None when it holds none."""
    hints = []
    for name in _leaves(key, value):
        bare = name.rsplit(".", 1)[-1]  # TRL's settings are flat: only the unknown key itself is one
        framework, said, peer = (("verl", name, VERL[name]) if name in VERL else
                                 ("TRL", bare, TRL.get(bare) if name == key else None))
        if peer is not None:
            hints.append(f"{said} is {framework}'s name; mmrl's is {peer.mmrl}" + (f" ({peer.note})" if peer.note else ""))
    return "; ".join(dict.fromkeys(hints)) + f" ({TABLE})" if hints else None
