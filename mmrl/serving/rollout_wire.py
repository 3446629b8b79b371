"""What travels between a trainer and a rollout server (`mmrl serve-rollout`, docs/distributed.md#served-
rollouts): a request for prompt groups, and the `Rollout` record that answers it, in the wire format
(`wire`, exact: tensors keep their dtype, bfloat16 included, and tuples stay tuples), so the trainer gets
back the record the adapter built, bit for bit, whatever the family (token ids, latents, timesteps, images,
lists of per-row tensors).

A request (``POST /rollout``): ``{"key": [step, attempt, first group], "rows": the prompts' data rows,
"group_size", "seeds": one per group, "min_version": the oldest weights version that may draw it}``.
An answer (``GET /rollout/KEY``): ``{"rollout": the record, "metrics": the policy's counts of that
generation (`Policy.pop_metrics`)}``, the record stamped with the version of the weights that drew it.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from mmrl.core.rollout import Rollout
from mmrl.serving.wire import decode, encode

Key = tuple[int, int, int]  # (step, attempt, the request's first prompt group in its draw)


def key_text(key: Key) -> str:
    """A request's key as it appears in a url path."""
    return "-".join(str(int(k)) for k in key)


def encode_rollout(rollout: Rollout) -> dict[str, Any]:
    """The record as JSON-ready data; a value of `extras` or `columns` the wire cannot carry raises a
    TypeError naming it."""
    out = {}
    for f in fields(Rollout):
        value = getattr(rollout, f.name)
        if f.name in ("columns", "extras"):
            out[f.name] = {name: _encoded(f"{f.name}[{name!r}]", v) for name, v in value.items()}
        else:
            out[f.name] = _encoded(f.name, value)
    return out


def _encoded(where: str, value: Any) -> Any:
    try:
        return encode(value, exact=True)
    except TypeError as e:
        raise TypeError(f"the rollout's {where} cannot travel to the trainer: {e}") from None


def decode_rollout(data: dict[str, Any]) -> Rollout:
    """The record `encode_rollout` was given."""
    return Rollout(**{f.name: decode(data[f.name]) for f in fields(Rollout)})


def rollout_request(key: Key, rows: list[Any], group_size: int, seeds: list[int], min_version: int) -> dict[str, Any]:
    """The body of ``POST /rollout`` (the module docstring); a row the wire cannot carry raises a TypeError."""
    return {"key": list(key), "rows": encode(rows, exact=True), "group_size": group_size, "seeds": list(seeds),
            "min_version": min_version}


def read_request(body: dict[str, Any]) -> tuple[Key, list[Any], int, list[int], int]:
    """(key, rows, group_size, seeds, min_version) of a ``POST /rollout`` body; a KeyError, TypeError or
    ValueError where it is not one."""
    key = tuple(int(k) for k in body["key"])
    if len(key) != 3:
        raise ValueError(f"key {body['key']!r} is not [step, attempt, first group]")
    seeds = [int(s) for s in body["seeds"]]
    rows = decode(body["rows"])
    if len(rows) != len(seeds):
        raise ValueError(f"{len(rows)} rows for {len(seeds)} seeds")
    return key, rows, int(body["group_size"]), seeds, int(body["min_version"])
