"""The policy a benchmark generates with: the run's (or the recipe's, or a bare model's) ``policy:``
section with the benchmark protocol's settings for its adapter over it and the user's ``key=value``
overrides over both, built in this process, with a checkpoint's weights when one is given; the rows'
media checked before it loads."""

from __future__ import annotations

from pathlib import Path

from mmrl.config.parse import from_dict, parse_config, to_dict
from mmrl.config.sections import TrainConfig
from mmrl.core.benchmark import Benchmark
from mmrl.core.policy import Policy, build_policy
from mmrl.data.rows import RowError
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS
from mmrl.core.lora import with_lora

WEIGHTS = "model.safetensors"  # a checkpoint's whole weights, as the run's single-process strategy saved them


def protocol_config(bench: Benchmark, cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """`cfg` with the protocol's policy settings for ``cfg.task`` applied, then `overrides` again (they win)."""
    data = to_dict(cfg)
    data["policy"] = {**data["policy"], **bench.policy.get(cfg.task, {})}
    return parse_config(data, overrides)


def generation_settings(bench: Benchmark, cfg: TrainConfig) -> dict:
    """The ``policy:`` settings a summary records: the protocol's keys and the model."""
    keys = {"model", *bench.policy.get(cfg.task, {})}
    return {k: cfg.policy[k] for k in sorted(keys) if k in cfg.policy}


def check_media(cfg: TrainConfig, rows: list[dict], where: str) -> None:
    """Every media value of the rows readable (the adapter's `media_columns` checks, headers only), before
    the model loads; the first that is not is a UserError naming the row, the column and the value."""
    adapter = ADAPTERS.get(cfg.task)
    checks = adapter.media_columns(from_dict(adapter.Config, cfg.policy, "policy"))
    for row in rows:
        for column, check in checks.items():
            if row.get(column) is not None:
                try:
                    check(row[column])
                except RowError as e:
                    raise UserError(f"{where}: row {row['id']!r}: {e}") from None


def load_policy(cfg: TrainConfig, checkpoint: Path | None, prompt_column: str = "prompt") -> Policy:
    """The adapter of `cfg` in eval mode; with `checkpoint`, its LoRA (``optim.lora``) and the
    checkpoint's weights (``CHECKPOINT/model.safetensors``)."""
    import torch
    from safetensors.torch import load_model
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg)
    policy.prompt_column = prompt_column
    if checkpoint is not None:
        weights = checkpoint / WEIGHTS
        if not weights.is_file():
            raise UserError(f"checkpoint {checkpoint} has no {WEIGHTS} (its weights are sharded over processes): "
                            f"merge it first, `mmrl export {checkpoint} --merge DIR`, then `mmrl bench NAME --model DIR`")
        policy.model = with_lora(policy.model, cfg.optim.lora)
        try:
            load_model(policy.model, str(weights))
        except RuntimeError as e:
            raise UserError(f"checkpoint {checkpoint} does not fit the model of its run's config "
                            f"({str(e).splitlines()[0][:200]})") from None
    if cfg.policy.get("device") is None:  # as a run places it: the accelerator when there is one
        policy.model.to("cuda" if torch.cuda.is_available() else "cpu")
    policy.model.eval()
    return policy
