"""A sweep's cached warm starts: ``OUT/warm_starts/KEY.pt`` (weights and the torch RNG state after the
warm start), KEY a hash of what the warm start reads less the `--warm-start-ignores` keys; the first
run of a key computes it under a file lock, every other run of that key loads it (docs/sweep.md)."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from mmrl.config.parse import to_dict

WARM_DIR = "warm_starts"  # under the sweep's --out
# the parts of a config the supervised warm start reads
WARM_START_KEYS = ("task", "policy", "data", "warm_start", "reward_modules", "seed", "optim.lora")



def warm_key(cfg, ignores: list[str]) -> str:
    full = to_dict(cfg)
    picked: dict = {}
    for key in WARM_START_KEYS:
        node, parts = full, key.split(".")
        for part in parts:
            node = node[part]
        picked[key] = node
    for key in ignores:
        head, *rest = key.split(".")
        node = picked.get(head)
        for part in rest[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if rest and isinstance(node, dict):
            node.pop(rest[-1], None)
        elif not rest:
            picked.pop(head, None)
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_warm_start(cache: Path, ignores: list[str]) -> Callable:
    """A `warm_start(trainer)` that computes the warm start once per key and loads it afterwards."""
    import fcntl

    import torch

    def warm_start(trainer) -> None:
        cfg = trainer.cfg
        record = {"key": None, "reused": False}
        if cfg.warm_start.steps > 0:
            key = warm_key(cfg, ignores)
            path = cache / f"{key}.pt"
            cache.mkdir(parents=True, exist_ok=True)
            with open(cache / f"{key}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one process computes, the others wait and load
                if path.is_file():
                    state = torch.load(path, map_location="cpu", weights_only=True)
                    trainer.unwrapped.load_state_dict(state["model"])
                    trainer.reference_from_policy()
                    torch.set_rng_state(state["rng"])
                    record = {"key": key, "reused": True}
                else:
                    t0 = time.perf_counter()
                    loss = trainer.warm_start()
                    tmp = path.with_suffix(".tmp")
                    torch.save({"model": trainer.unwrapped.state_dict(), "rng": torch.get_rng_state()}, tmp)
                    os.replace(tmp, path)
                    record = {"key": key, "reused": False}
                    with open(cache / "log.jsonl", "a") as log:
                        log.write(json.dumps({"key": key, "seed": cfg.seed, "run": cfg.output_dir, "loss": loss,
                                              "wall_s": time.perf_counter() - t0}) + "\n")
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "warm_start.json").write_text(json.dumps(record))

    return warm_start
