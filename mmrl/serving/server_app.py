"""The reward server (`mmrl serve-reward NAME`): a FastAPI app serving one registered reward.

``GET /health`` answers ``{"status": "ok", "reward": NAME}``; ``POST /score`` takes what
`remote_reward` sends and answers ``{"rewards": [...], "metrics": {...}}``, calling the reward
on at most `batch_size` rows at a time (a reward that scores groups once per group of the request),
one call at a time (one model, one device). A reward that
raises or gives what is not a finite number or None answers 500 with the reason."""

from __future__ import annotations

import functools
import inspect
import math
import threading
from typing import Any

from fastapi import FastAPI, HTTPException

from mmrl.core.group_rewards import call_per_group, scores_groups
from mmrl.core.scoring import RewardFn, get_reward, metric_logger, takes_logger
from mmrl.errors import UserError
from mmrl.serving.app_runner import run_app
from mmrl.serving.wire import decode


def reward_app(name: str, fn: RewardFn, batch_size: int = 64) -> FastAPI:
    """The app serving `fn` (the reward `name`, its server-side arguments bound)."""
    app = FastAPI(title=f"mmrl reward {name}")
    one_call = threading.Lock()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "reward": name}

    @app.post("/score")
    def score(request: dict[str, Any]) -> dict[str, Any]:
        try:
            prompts, completions = decode(request["prompts"]), decode(request["completions"])
            columns, args = decode(request.get("columns") or {}), request.get("args") or {}
        except (KeyError, TypeError, ValueError) as e:
            raise HTTPException(400, f"not a scoring request ({type(e).__name__}: {e})") from None
        counts: dict[str, float] = {}
        values: list[float | None] = []
        size = max(1, len(completions) if scores_groups(fn) else batch_size)  # a request holds whole groups
        with one_call:
            for start in range(0, len(completions), size):
                rows = slice(start, start + size)
                values += _call(fn, prompts[rows], completions[rows], {k: v[rows] for k, v in columns.items()},
                                args, counts)
        return {"rewards": values, "metrics": counts}

    return app


def _call(fn: RewardFn, prompts: list, completions: list, columns: dict, args: dict,
          counts: dict[str, float]) -> list[float | None]:
    """The reward's values for one batch, checked as the engine checks them in process."""
    logger = {"log_metric": metric_logger(counts)} if takes_logger(fn) else {}
    try:
        values = (call_per_group(functools.partial(fn, **args), prompts, completions, columns, logger)
                  if scores_groups(fn) else list(fn(prompts=prompts, completions=completions, **columns, **args,
                                                    **logger)))
    except Exception as e:
        raise HTTPException(500, f"the reward raised {type(e).__name__}: {e}") from None
    if len(values) != len(completions):
        raise HTTPException(500, f"the reward returned {len(values)} values for {len(completions)} completions")
    out = []
    for i, v in enumerate(values):
        try:
            f = None if v is None else float(v)
        except (TypeError, ValueError):
            raise HTTPException(500, f"the reward returned {v!r} for row {i}; expected a number or None") from None
        if f is not None and not math.isfinite(f):
            raise HTTPException(500, f"the reward returned {f} for row {i}")
        out.append(f)
    return out


def bind_served_reward(name: str, args: dict[str, Any], device: str | None = None) -> RewardFn:
    """The registered reward `name` with the server's arguments bound (and ``device`` when given,
    which the reward must take); an argument it does not take is a UserError naming its arguments."""
    fn = get_reward(name)
    accepted = [p.name for p in inspect.signature(fn).parameters.values()  # as the recipe's args are checked
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("prompts", "completions")]
    if device is not None:
        args = {**args, "device": device}
    unknown = [a for a in args if a not in accepted]
    if unknown:
        raise UserError(f"mmrl serve-reward {name}: the reward takes no argument {unknown[0]!r}"
                        f"{' (--device)' if unknown[0] == 'device' else ''}; its arguments: "
                        f"{', '.join(accepted) or 'none'}")
    return functools.partial(fn, **args) if args else fn


def serve(name: str, fn: RewardFn, host: str, port: int, batch_size: int, announce_to: str | None = None,
          advertise: str | None = None) -> None:
    """Serve `fn` until SIGINT or SIGTERM, which end the server cleanly (uvicorn finishes the requests
    in flight, then returns); port 0 takes a free one; `announce_to`: the file its address is written
    to once it answers (a server the run placed, serving/server_directory.py)."""
    run_app(reward_app(name, fn, batch_size), host, port, f"serve-reward: {name}", announce_to, advertise,
            " (POST /score, GET /health)")
