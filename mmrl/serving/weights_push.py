"""The trained weights pushed to every rollout server (docs/distributed.md#served-rollouts), by the trainer's
main process: each server and the trainer form a pair group of their own over torch.distributed
(serving/weights_broadcast.py: gloo on CPUs, NCCL between two GPUs), so a server that dies and is started
again joins again without disturbing the others.

`publish` copies the whole state dict once into flat buffers (the latest transfer, kept: a server that
joins later needs all of it, so the servers are always sent the whole of it, LoRA or not) and starts their
broadcast to every connected server, then tells each ``POST /weights {version}``; the trainer goes on
while the servers receive. A thread watches the servers' addresses: a server that (re)appears is
connected (``POST /connect``) and sent the latest transfer, so a restarted server draws with the
trainer's newest weights before anything else.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import torch

from mmrl.serving.server_directory import Address, ServerSlot, answers
from mmrl.serving.weights_broadcast import WHOLE, WeightsSender, flatten, layout_of, model_device

WATCH_S = 0.5  # how often the servers' addresses are read
CONNECT_TIMEOUT_S = 600.0  # how long a server may take to join (it joins between two generations)


class ConnectAbandoned(Exception):
    """A server that went away while it was joining the weights group."""


def post(url: str, body: dict, timeout: float = 30.0) -> dict:
    """POST `body` as JSON; the decoded answer. OSError (urllib's errors included) when it fails."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Link:
    """A connected server: the incarnation it was connected as, its url, the trainer's side of the pair."""

    incarnation: str
    url: str
    sender: WeightsSender


class WeightsPush:
    """Pushes the trained weights to the servers of `slots`; `host`: the trainer's address for them."""

    def __init__(self, slots: list[ServerSlot], model: torch.nn.Module, host: str):
        self.slots, self.host = slots, host
        self.device = model_device(model)
        self.layouts = {WHOLE: layout_of(model.state_dict())}
        self.layout = [(name, list(shape), str(dtype).removeprefix("torch."))
                       for name, shape, dtype in self.layouts[WHOLE]]
        self.links: dict[int, Link] = {}
        self.latest: tuple[int, list[torch.Tensor]] | None = None  # (version, flat CPU buffers)
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="mmrl-weights-push", daemon=True)
        self.thread.start()

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """The weights after `version` optimizer steps, to every server from now on."""
        buffers = flatten(model.state_dict(), self.layouts[WHOLE], torch.device("cpu"))
        with self.lock:
            self.latest = (version, buffers)
            for index in list(self.links):
                self._push(index)

    def versions(self) -> dict[int, str]:
        """The servers connected now (index -> url), for messages and tests."""
        with self.lock:
            return {index: link.url for index, link in self.links.items()}

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        with self.lock:
            for link in self.links.values():
                link.sender.close()
            self.links = {}

    def _push(self, index: int) -> None:
        """The latest transfer to server `index` (under the lock); a server that does not take it is dropped
        (the watch connects it again when it is back)."""
        link = self.links[index]
        version, buffers = self.latest
        try:
            link.sender.release_sent()
            device = link.sender.device
            link.sender.broadcast(WHOLE, buffers if device.type == "cpu" else [b.to(device) for b in buffers])
            post(f"{link.url}/weights", {"version": version})
        except (OSError, RuntimeError):
            link.sender.close()
            del self.links[index]

    def _watch(self) -> None:
        while not self.stopping.wait(WATCH_S):
            for index, slot in enumerate(self.slots):
                address = slot.address()
                with self.lock:
                    link = self.links.get(index)
                if address is None or (link is not None and link.incarnation == address.incarnation):
                    continue
                if not answers(address.url):
                    continue
                try:
                    sender = self._connect(address)
                except (ConnectAbandoned, OSError, RuntimeError):
                    continue
                with self.lock:
                    if index in self.links:
                        self.links[index].sender.close()
                    self.links[index] = Link(address.incarnation, address.url, sender)
                    if self.latest is not None:
                        self._push(index)

    def _connect(self, address: Address) -> WeightsSender:
        """A new pair group with the server at `address` (it joins between two generations)."""
        sender = WeightsSender(self.layouts, self.host)
        post(f"{address.url}/connect", {"host": self.host, "port": sender.port, "layout": self.layout,
                                        "device": str(self.device)})
        deadline = time.monotonic() + CONNECT_TIMEOUT_S

        def wait() -> None:
            if self.stopping.is_set() or time.monotonic() > deadline or not answers(address.url):
                raise ConnectAbandoned(address.url)
            time.sleep(0.1)
        sender.connect(self.device, wait)
        return sender
