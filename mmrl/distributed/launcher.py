"""What the launcher asked for: `accelerate launch` settings (an FSDP or DeepSpeed config) taken into the
recipe, and the number of processes that joined checked against the number asked for; and what a launcher
that places the run's roles (Ray) tells the processes it placed (`PLACED_ENV`, `NODE_ADDRESS_ENV`).
"""

from __future__ import annotations

import os
from dataclasses import replace

from mmrl.config.sections import TrainConfig
from mmrl.errors import UserError

PLACED_ENV = "MMRL_PLACED"  # "1": a launcher placed this process and the run's servers (the run starts none)
NODE_ADDRESS_ENV = "MMRL_NODE_ADDR"  # this machine's address as the other machines reach it


def placed_by_launcher() -> bool:
    """Whether a launcher placed this process and the run's servers (so the run starts none itself)."""
    return os.environ.get(PLACED_ENV) == "1"


# accelerate's FSDP launcher settings (`accelerate launch --config_file scripts/accelerate/fsdp.yaml`,
# exported as environment variables) -> recipe keys
_TRUE = ("true", "1")


_ACCELERATE_FSDP_ENV = {
    "FSDP_RESHARD_AFTER_FORWARD": ("distributed.reshard_after_forward", lambda v: v.lower() in (*_TRUE, "full_shard")),
    "FSDP_OFFLOAD_PARAMS": ("distributed.offload", lambda v: v.lower() in _TRUE),
    "FSDP_TRANSFORMER_CLS_TO_WRAP": ("distributed.shard_modules",
                                     lambda v: [c.strip() for c in v.split(",") if c.strip()]),
    "FSDP_ACTIVATION_CHECKPOINTING": ("policy.gradient_checkpointing", lambda v: v.lower() in _TRUE),
}


def deepspeed_launcher_settings(env: dict[str, str]) -> dict[str, object]:
    """The recipe settings of an `accelerate launch` DeepSpeed config (scripts/accelerate/zero3.yaml)."""
    stage = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    if env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none").lower() != "none" or stage != "3":
        raise UserError(f"accelerate launch: a DeepSpeed config with zero_stage {stage}"
                        f"{' and a deepspeed_config_file' if env.get('ACCELERATE_DEEPSPEED_CONFIG_FILE', 'none') != 'none' else ''}"
                        "; mmrl runs ZeRO stage 3 from the recipe (distributed.strategy: zero3; set zero_stage: 3 "
                        "and no deepspeed_config_file, as scripts/accelerate/zero3.yaml does), or FSDP2 (fsdp.yaml)")
    settings: dict[str, object] = {"distributed.strategy": "zero3"}
    offload = {env.get(f"ACCELERATE_DEEPSPEED_OFFLOAD_{what}_DEVICE", "none").lower() for what in ("PARAM", "OPTIMIZER")}
    if offload != {"none"}:
        settings["distributed.offload"] = True
    return settings


def launcher_settings(environ: dict[str, str] | None = None) -> dict[str, object] | None:
    """The recipe settings (dotted key -> value) an `accelerate launch` with an FSDP or DeepSpeed
    config asks for, or None when the launcher asked for neither. mmrl takes the launcher's
    sharding over and shards the policy itself, so `accelerate` is then started without its own
    FSDP plugin (for DeepSpeed, with mmrl's plugin: mmrl/distributed/zero3.py)."""
    env = os.environ if environ is None else environ
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() in _TRUE:
        return deepspeed_launcher_settings(env)
    if env.get("ACCELERATE_USE_FSDP", "").lower() not in _TRUE:
        return None
    if env.get("FSDP_VERSION", "2") != "2":
        raise UserError(f"accelerate launch: fsdp_version {env['FSDP_VERSION']} in the launcher config; mmrl shards "
                        "with FSDP2 (set fsdp_version: 2, as scripts/accelerate/fsdp.yaml does)")
    settings: dict[str, object] = {"distributed.strategy": "fsdp"}
    for name, (key, parse) in _ACCELERATE_FSDP_ENV.items():
        if env.get(name):
            value = parse(env[name])
            if key != "policy.gradient_checkpointing" or value:  # only switched on from the launcher
                settings[key] = value
    return settings


def with_launcher_settings(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the settings of an `accelerate launch` FSDP or DeepSpeed config
    (`launcher_settings`) in place of the recipe's; `accelerate.Accelerator` is then kept from
    building its own plugin from the launcher's environment (mmrl shards the policy, the
    reference and the rollouts itself). `cfg` itself when the launcher asked for neither."""
    settings = launcher_settings()
    if settings is None:
        return cfg
    os.environ.pop("ACCELERATE_USE_FSDP", None)
    os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    os.environ.pop("ACCELERATE_CONFIG_DS_FIELDS", None)  # the launcher's DeepSpeed fields, which mmrl's plugin replaces
    section = lambda name: {k.split(".", 1)[1]: v for k, v in settings.items() if k.startswith(name + ".")}  # noqa: E731
    return replace(cfg, policy={**cfg.policy, **section("policy")},
                   distributed=replace(cfg.distributed, **section("distributed")))


def check_world_size(num_processes: int) -> None:
    """The number of processes the launcher was asked for must be the number that joined:
    ``WORLD_SIZE`` (torchrun, accelerate's multi-process launchers), or accelerate's single-process
    launcher, which sets ``MASTER_ADDR`` only when it was given ``--num_processes`` > 1 and ignores it."""
    env = os.environ
    how = ("launch with `ACCELERATE_USE_CPU=1 torchrun --nproc_per_node N -m mmrl train ...` on CPU, "
           "or `accelerate launch --multi_gpu --num_processes N -m mmrl train ...` on GPUs")
    if "WORLD_SIZE" in env and int(env["WORLD_SIZE"]) != num_processes:
        raise UserError(f"the launcher expected {env['WORLD_SIZE']} processes (WORLD_SIZE) but {num_processes} "
                        f"joined; {how}")
    if ("WORLD_SIZE" not in env and num_processes == 1 and "MASTER_ADDR" in env
            and env.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")):
        raise UserError(f"`accelerate launch --cpu --num_processes N` starts ONE process whatever N is; {how}")
