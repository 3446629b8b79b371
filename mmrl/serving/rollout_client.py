"""The trainer's handle on its rollout servers (`policy.rollout_engine: hf_server`,
docs/distributed.md#served-rollouts), with the interface of the rollout worker's (`ask`, `has_asked`,
`asked_for`, `take_scored`, `send_weights`, `pop_metrics`, `stop`), so the trainer's modes, queue and staleness bounds
are the same whoever generates.

Each trainer process asks for its own prompt groups, a request (serving/rollout_wire.py) going to the
live server with the fewest of its requests in flight. A request names the oldest weights that may draw
it: those of the step before it, less the mode's staleness bound (`max_behind`). A server that stops
answering, or that answers it does not know a request (it was started again), is set aside: its requests
in flight are asked again, with the same seeds, of the live servers (or of it once it is back, when none
is), so they come back as they would have. The main process also pushes the weights (serving/weights_push.py).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import torch

from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.serving.rollout_wire import Key, decode_rollout, key_text, rollout_request
from mmrl.serving.server_directory import Address, ServerSlot, answers
from mmrl.serving.weights_push import WeightsPush, post

POLL_WAIT_S = 10.0  # how long one GET of an answer waits at the server
REVIVE_EVERY_S = 2.0  # how often a set-aside server's address is read again


class RolloutServerError(UserError):
    """A rollout server that failed a request, or that did not come back; the run stops (after a checkpoint)."""


class ServerGone(Exception):
    """A server that did not answer (connection refused or reset, timed out)."""


class ServerState:
    """One server as this process sees it: its address while it answers (None: set aside), its requests in flight."""

    def __init__(self, slot: ServerSlot):
        self.slot = slot
        self.address: Address | None = None
        self.checked = 0.0  # when its address was last read while set aside
        self.in_flight: set[Key] = set()


class ServedRollouts:
    """The trainer process's requests to `slots`; `max_behind`: how many steps older than the step before a
    request its weights may be; `timeout_s`: how long to wait for a server that is not there;
    `push`: the main process's weights push (None on the others)."""

    def __init__(self, slots: list[ServerSlot], max_behind: int, timeout_s: float, push: WeightsPush | None):
        self.servers = [ServerState(slot) for slot in slots]
        self.max_behind, self.timeout_s, self.push = max_behind, timeout_s, push
        self.bodies: dict[Key, dict] = {}  # the requests asked and not yet taken
        self.where: dict[Key, int] = {}  # which server each is with
        self.counts: dict[str, float] = {}

    # ----- the rollout worker's interface ------------------------------------------------------
    def ask(self, key: Key, rows: list[dict], group_size: int, seeds: list[int]) -> None:
        try:
            body = rollout_request(key, rows, group_size, seeds, max(0, key[0] - 1 - self.max_behind))
        except TypeError as e:
            raise UserError(f"the data rows of step {key[0]} (groups from {key[2]}) cannot be sent to a rollout "
                            f"server: {e}") from None
        self.bodies[key] = body
        self._send(key)

    def has_asked(self, key: Key) -> bool:
        return key in self.bodies

    def asked_for(self, step: int) -> bool:
        return any(key[0] == step for key in self.bodies)

    def take_scored(self, key: Key, rows: list[dict], group_size: int, seeds: list[int]) -> tuple[Rollout, None]:
        """The rollout asked for under `key` (asked now if it was not), stamped with its weights version; the
        servers do not score (None)."""
        if key not in self.bodies:
            self.ask(key, rows, group_size, seeds)
        while True:
            index = self.where[key]
            server = self.servers[index]
            try:
                status, data = _get(f"{server.address.url}/rollout/{key_text(key)}?wait={POLL_WAIT_S:g}",
                                    POLL_WAIT_S + 30)
            except ServerGone:
                self._set_aside(index)
                continue
            if status == 202:
                continue
            if status == 404:  # started again since: it lost the request
                self._move(key, index)
                continue
            if status != 200:
                raise RolloutServerError(f"rollout server {server.slot.name} ({server.address.url}) failed on step "
                                         f"{key[0]}'s prompt groups from {key[2]}: HTTP {status}: {_detail(data)}"
                                         f"{server.slot.see_log()}")
            return self._taken(key, index, json.loads(data)), None

    def send_weights(self, model: torch.nn.Module, version: int) -> None:
        """The servers draw from these weights (after `version` optimizer steps) from now on (the main process
        pushes them; the other processes' models are the same)."""
        if self.push is not None:
            self.push.publish(model, version)

    def pop_metrics(self) -> dict[str, float]:
        out, self.counts = self.counts, {}
        return out

    def stop(self) -> None:
        if self.push is not None:
            self.push.close()

    # ----- where requests go --------------------------------------------------------------------
    def _taken(self, key: Key, index: int, answer: dict[str, Any]) -> Rollout:
        self.servers[index].in_flight.discard(key)
        del self.bodies[key], self.where[key]
        for name, value in (answer.get("metrics") or {}).items():
            self.counts[name] = self.counts.get(name, 0.0) + value
        return decode_rollout(answer["rollout"])

    def _send(self, key: Key) -> None:
        """Ask the live server with the fewest requests in flight (waiting for one if none is live)."""
        while True:
            index = self._least_busy()
            server = self.servers[index]
            try:
                post(f"{server.address.url}/rollout", self.bodies[key], timeout=60.0)
            except urllib.error.HTTPError as e:
                raise RolloutServerError(f"rollout server {server.slot.name} refused step {key[0]}'s request: "
                                         f"HTTP {e.code}: {_detail(e.read())}") from None
            except OSError:
                self._set_aside(index)
                continue
            server.in_flight.add(key)
            self.where[key] = index
            return

    def _move(self, key: Key, index: int) -> None:
        self.servers[index].in_flight.discard(key)
        self._send(key)

    def _set_aside(self, index: int) -> None:
        """Server `index` stopped answering: its requests in flight go to the others."""
        server = self.servers[index]
        server.address, server.checked = None, time.monotonic()
        for key in sorted(server.in_flight):
            self._move(key, index)

    def _least_busy(self) -> int:
        """The live server with the fewest requests in flight; set-aside ones that are back count as live
        again; with none live, wait (up to `timeout_s`) for the first to answer."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            for server in self.servers:
                self._revive(server, force=not any(s.address for s in self.servers))
            live = [i for i, s in enumerate(self.servers) if s.address is not None]
            if live:
                return min(live, key=lambda i: len(self.servers[i].in_flight))
            if time.monotonic() > deadline:
                names = ", ".join(f"{s.slot.name}{s.slot.see_log()}" for s in self.servers)
                raise RolloutServerError(f"no rollout server answered within {self.timeout_s:g}s "
                                         f"(placement.server_timeout_s): {names}")
            time.sleep(0.5)

    def _revive(self, server: ServerState, force: bool) -> None:
        if server.address is not None or (not force and time.monotonic() - server.checked < REVIVE_EVERY_S):
            return
        server.checked = time.monotonic()
        found = server.slot.address()
        if found is not None and answers(found.url):
            server.address = found


def _get(url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a GET; ServerGone when the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        raise ServerGone(url) from None


def _detail(body: bytes) -> str:
    try:
        return str(json.loads(body).get("detail", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
