"""`mmrl train RECIPE --ray` (or `launch: ray` in the recipe): the recipe checked whole and the output
directory claimed here, before anything is placed; then the run's roles (the trainer ranks, the placed
rollout and reward servers) placed on a Ray cluster by the launcher (mmrl/distributed/ray_launch.py), each
running the same `mmrl` command as without Ray (docs/distributed.md#several-machines-with-ray)."""

from __future__ import annotations

import sys
from pathlib import Path

from mmrl.config.parse import to_dict
from mmrl.config.sections import TrainConfig
from mmrl.distributed.ray_launch import Role, launch
from mmrl.errors import UserError
from mmrl.serving.server_directory import LOGS, SERVERS
from mmrl.train.placement.placed_servers import server_commands
from mmrl.train.plan.validate import validate
from mmrl.train.safety import checkpoint as ckpt
from mmrl.train.safety.run_dir import claim


def ray_roles(cfg: TrainConfig, recipe: str, overrides: list[str]) -> list[Role]:
    """The trainer ranks (`placement.trainer`, each `mmrl train RECIPE OVERRIDES`), then each kind of placed
    server (its processes' commands), with the CPUs and GPUs `placement` gives each role."""
    p = cfg.placement
    ranks = Role("trainer", [[sys.executable, "-m", "mmrl", "train", recipe, *overrides]] * (p.trainer or 1),
                 cpus=p.cpus.get("trainer", 1.0), gpus=p.gpus.get("trainer"), ranks=True)
    servers: dict[str, Role] = {}
    for name, command in server_commands(cfg, recipe, overrides).items():
        kind = name.rsplit("-", 1)[0]
        key = "rollout" if kind == "rollout" else "reward"
        role = servers.setdefault(kind, Role(kind, [], cpus=p.cpus.get(key, 1.0), gpus=p.gpus.get(key),
                                             restarts=p.max_restarts))
        role.commands.append(command)
    return [ranks, *servers.values()]


def train_on_ray(cfg: TrainConfig, recipe: str, overrides: list[str], address: str | None) -> int:
    """Check, claim, place, run; a rank that failed is a UserError naming it, its log and the newest checkpoint."""
    plan = validate(cfg, cfg.placement.trainer or 1)
    output_dir = Path(cfg.output_dir)
    claim(output_dir, cfg.resume, cfg.overwrite, to_dict(plan.recipe), cfg.resume_changes, say=lambda m: None)
    for stale in (output_dir / SERVERS).glob("*.json"):  # an earlier run's servers' addresses
        stale.unlink()
    outcome = launch(ray_roles(cfg, recipe, overrides), output_dir / LOGS, address)
    if outcome.failed is None:
        return 0
    role, rank, log = outcome.failed
    code = outcome.codes[rank]
    why = outcome.why or (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
    newest = ckpt.latest_checkpoint(output_dir)
    raise UserError(f"{role} rank {rank} {why}, so the run stopped (see {log}); "
                    + (f"its newest checkpoint is {newest}: continue with the same command and resume=true"
                       if newest else "it saved no checkpoint"))
