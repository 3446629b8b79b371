"""The rollout server (`mmrl serve-rollout RECIPE`, docs/distributed.md#served-rollouts): any adapter's
`rollout()` behind HTTP, for `policy.rollout_engine: hf_server`.

One thread generates (`RolloutEngine`), one request at a time, with the newest weights the trainer pushed:
before each generation it reads every waiting message, so a weights transfer announced before it is
received first. A request names the oldest weights version that may draw it (``min_version``: the step's
staleness bound); it waits until the server has weights at least that new, so a request that reaches the
server before the weights it needs (from another trainer rank) is not drawn by older ones. Nothing is
generated before the first weights arrive: the server's rows are always drawn by the trainer's weights.

``POST /connect {"host", "port", "layout", "device"}``: join the trainer's weights group (a pair group on
the trainer's TCPStore, serving/weights_broadcast.py), replacing any earlier one. ``POST /weights
{"version"}``: receive the transfer the trainer has started. ``POST /rollout``: a request
(serving/rollout_wire.py), answered 202 (queued). ``GET /rollout/KEY?wait=S``: its answer (200), or after
up to S seconds 202 (not yet), 404 (the server does not know it: it was started again since), 500 (the
adapter raised: the reason). ``GET /health``: ``{"status": "ok", "version", "queued"}``.
"""

from __future__ import annotations

import json
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import FastAPI, HTTPException, Response

from mmrl.config.sections import TrainConfig
from mmrl.core.policy import Policy, build_policy
from mmrl.registry import load_plugins
from mmrl.serving.rollout_wire import Key, encode_rollout, key_text, read_request
from mmrl.serving.weights_broadcast import WHOLE, WeightsReceiver

MAX_WAIT_S = 30.0  # the longest a GET /rollout waits for its answer


@dataclass
class Request:
    key: Key
    rows: list[Any]
    group_size: int
    seeds: list[int]
    min_version: int


class RolloutEngine:
    """The server's policy and its generating thread (the module docstring); `own_host`: this server's
    address for the weights group."""

    def __init__(self, policy: Policy, own_host: str):
        self.policy, self.own_host = policy, own_host
        self.inbox: queue.Queue = queue.Queue()
        self.done = threading.Condition()
        self.answers: dict[str, bytes | str] = {}  # key -> the answer's JSON, or why its generation failed
        self.asked: set[str] = set()  # keys queued or generating
        self.version: int | None = None  # the weights' version (None: none received yet)
        self.receiver: WeightsReceiver | None = None
        self.thread = threading.Thread(target=self._run, name="mmrl-rollout-engine", daemon=True)
        self.thread.start()

    # ----- what the HTTP handlers call ------------------------------------------------------------
    def connect(self, host: str, port: int, layout: list, device: str) -> None:
        self.inbox.put(("connect", host, port, [(n, tuple(s), getattr(torch, d)) for n, s, d in layout], device))

    def weights(self, version: int) -> None:
        self.inbox.put(("weights", version))

    def ask(self, request: Request) -> None:
        with self.done:
            self.answers.pop(key_text(request.key), None)
            self.asked.add(key_text(request.key))
        self.inbox.put(("rollout", request))

    def answer(self, key: str, wait_s: float) -> bytes | str | None:
        """The answer to `key` (taken: a second call does not find it), or None while it is being made; a
        KeyError when the server was never asked for it."""
        with self.done:
            if key not in self.answers and key not in self.asked:
                raise KeyError(key)
            self.done.wait_for(lambda: key in self.answers, timeout=min(wait_s, MAX_WAIT_S))
            return self.answers.pop(key, None)

    def queued(self) -> int:
        with self.done:
            return len(self.asked)

    def stop(self) -> None:
        self.inbox.put(("stop",))

    # ----- the generating thread --------------------------------------------------------------
    def _run(self) -> None:
        pending: list[Request] = []
        while True:
            ready = [r for r in pending if self.version is not None and self.version >= r.min_version]
            try:  # every waiting message first: the newest weights before a generation
                message = self.inbox.get(block=not ready)
            except queue.Empty:
                pending.remove(ready[0])
                self._generate(ready[0])
                continue
            if message[0] == "stop":
                return
            if message[0] == "rollout":
                pending.append(message[1])
            else:
                self._weights(message)

    def _weights(self, message: tuple) -> None:
        """A connect or a transfer; a failed one (the trainer went away) leaves the server without weights
        until a trainer connects and sends them again."""
        try:
            if message[0] == "connect":
                _, host, port, layout, device = message
                self.receiver, self.version = None, None
                self.receiver = WeightsReceiver(port, {WHOLE: layout}, self.policy.model, torch.device(device), host,
                                                self.own_host)
            elif self.receiver is not None:
                self.version = None  # a transfer that fails halfway leaves weights of no version
                self.receiver.receive(WHOLE)
                self.version = message[1]
        except Exception:
            print(f"mmrl serve-rollout: the weights transfer failed:\n{traceback.format_exc()}", flush=True)
            self.receiver, self.version = None, None

    def _generate(self, request: Request) -> None:
        key = key_text(request.key)
        try:
            self.policy.set_training_step(request.key[0])
            with torch.no_grad():
                rollout = self.policy.rollout(request.rows, request.group_size, request.seeds)
            rollout.stamp_version(self.version)
            answer: bytes | str = json.dumps({"rollout": encode_rollout(rollout), "metrics": self.policy.pop_metrics()},
                                             separators=(",", ":")).encode()
        except Exception as e:
            print(f"mmrl serve-rollout: request {key} failed:\n{traceback.format_exc()}", flush=True)
            answer = f"{type(e).__name__}: {e}"
        with self.done:
            self.asked.discard(key)
            self.answers[key] = answer
            self.done.notify_all()


def build_server_policy(cfg: TrainConfig, device: str | None = None) -> Policy:
    """The recipe's policy as the server runs it: built as the trainer builds it (seeded by the recipe, so a
    tiny random model and the parts the trainer does not train are the trainer's), with the adapter's own
    engine, in eval mode, on `device` (else the recipe's policy.device, else cuda where there is one)."""
    load_plugins()
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg)
    policy.prompt_column = cfg.data.prompt_column
    if device is not None or cfg.policy.get("device") is None:
        policy.model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    policy.model.eval()
    return policy


def rollout_app(engine: RolloutEngine, name: str) -> FastAPI:
    """The HTTP face of `engine` (the module docstring); `name`: what the server serves, for /health."""
    app = FastAPI(title=f"mmrl rollouts {name}")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "serves": name, "version": engine.version, "queued": engine.queued()}

    @app.post("/connect")
    def connect(body: dict[str, Any]) -> dict[str, str]:
        try:
            engine.connect(str(body["host"]), int(body["port"]), list(body["layout"]), str(body["device"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise HTTPException(400, f"not a connect request ({type(e).__name__}: {e})") from None
        return {"status": "connecting"}

    @app.post("/weights")
    def weights(body: dict[str, Any]) -> dict[str, str]:
        engine.weights(int(body["version"]))
        return {"status": "receiving"}

    @app.post("/rollout", status_code=202)
    def rollout(body: dict[str, Any]) -> dict[str, str]:
        try:
            engine.ask(Request(*read_request(body)))
        except (KeyError, TypeError, ValueError) as e:
            raise HTTPException(400, f"not a rollout request ({type(e).__name__}: {e})") from None
        return {"status": "queued"}

    @app.get("/rollout/{key}")
    def result(key: str, wait: float = 0.0) -> Response:
        try:
            answer = engine.answer(key, wait)
        except KeyError:
            raise HTTPException(404, f"no request {key} (the server was started again since it was asked)") from None
        if answer is None:
            return Response(json.dumps({"status": "pending"}), status_code=202, media_type="application/json")
        if isinstance(answer, str):
            raise HTTPException(500, answer)
        return Response(answer, media_type="application/json")

    return app
