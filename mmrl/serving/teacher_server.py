"""The teacher server (`mmrl serve-teacher RECIPE [key=value ...]`, docs/methods.md#served-teachers): a
frozen policy of any adapter that scores rollouts it is sent, for on-policy distillation from a teacher
that does not fit (or should not run) beside the student (`algorithm.distill.teacher: {url: ...}`).

``POST /logprobs {"rollout": the micro-batch (serving/rollout_wire.py), "units": [start, stop]}``: the
teacher's fp32 log-probs [rows, stop - start] of the rollout's units (`Policy.logprobs` of its own
model), as ``{"logprobs": the tensor in the wire format}``; 400 for a body that is not such a request,
500 with the reason when the adapter raises. ``GET /health``: ``{"status": "ok", "serves"}``.
One request is scored at a time (a lock around the forward), in the order they arrive.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Response

from mmrl.core.policy import Policy
from mmrl.serving.rollout_wire import decode_rollout
from mmrl.serving.wire import dumps, encode


def teacher_app(policy: Policy, name: str) -> FastAPI:
    """The HTTP face of the frozen `policy` (the module docstring); `name`: what it serves, for /health."""
    app = FastAPI(title=f"mmrl teacher {name}")
    model = policy.model.eval().requires_grad_(False)
    lock = threading.Lock()

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "serves": name}

    @app.post("/logprobs")
    def logprobs(body: dict[str, Any]) -> Response:
        try:
            rollout = decode_rollout(body["rollout"])
            start, stop = (int(u) for u in body["units"])
        except (KeyError, TypeError, ValueError) as e:
            raise HTTPException(400, f"not a log-prob request ({type(e).__name__}: {e})") from None
        try:
            with lock, torch.no_grad():
                logp = policy.logprobs(model, rollout, slice(start, stop))[0].float().cpu()
        except Exception as e:  # the adapter's reason, for the trainer's error
            raise HTTPException(500, f"the teacher's adapter raised {type(e).__name__}: {e}\n"
                                     f"{traceback.format_exc(limit=3)}") from None
        return Response(dumps({"logprobs": encode(logp, exact=True)}), media_type="application/json")

    return app
