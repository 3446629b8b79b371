"""The recipe's learning rates against what fine-tuning can use: a rate above ``optim.max_lr``
(default 1) is refused before anything loads (1e6 typed for 1e-6 would train on noise, a rate the
runtime health check notices only steps later), one above `WARN_ABOVE` trains with a warning (the
tiny CPU models' rates reach 2e-3; fine-tuning a real model uses 1e-6 to 1e-3)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from mmrl.config.sections import TrainConfig

WARN_ABOVE = 1e-2  # above every shipped recipe's rate (at most 2e-3), below a rate that trains anything real


def learning_rates(cfg: TrainConfig, stages: Iterable[TrainConfig] = ()) -> dict[str, float]:
    """{dotted key: rate} of every rate the run uses: the recipe's, its warm start's (when it has
    one), and each stage's where it differs from the recipe's."""
    rates = {"optim.lr": cfg.optim.lr}
    if cfg.warm_start.steps > 0:
        rates["warm_start.lr"] = cfg.warm_start.lr
    for index, stage in enumerate(stages):
        if stage.optim.lr != cfg.optim.lr:
            rates[f"stages[{index}].optim.lr"] = stage.optim.lr
    return rates


def check_learning_rates(cfg: TrainConfig, stages: Iterable[TrainConfig], problems: list[str],
                         warn: Callable[[str], None]) -> None:
    """Refuse a rate above optim.max_lr (into `problems`), warn about one above `WARN_ABOVE`; a
    negative or non-finite rate is the range checks' to name."""
    for key, rate in learning_rates(cfg, stages).items():
        if not math.isfinite(rate) or rate < 0:
            continue
        if rate > cfg.optim.max_lr:
            problems.append(f"{key}={rate!r} is above optim.max_lr={cfg.optim.max_lr!r}: a learning rate this large "
                            f"diverges at the first step (1e6 for 1e-6?); set optim.max_lr to train with it on purpose")
        elif rate > WARN_ABOVE:
            warn(f"{key}={rate!r} is above {WARN_ABOVE}: fine-tuning rates are 1e-6 to 1e-3 (the tiny CPU models' "
                 f"at most 2e-3); a rate this large may train on noise")
