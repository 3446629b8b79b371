"""A distillation teacher behind `mmrl serve-teacher` (serving/teacher_server.py), as the trainer asks
it: the teacher's log-probs of a micro-batch's units, over HTTP."""

from __future__ import annotations

import json
import urllib.error

from torch import Tensor

from mmrl.core.rollout import Rollout
from mmrl.errors import UserError
from mmrl.serving.json_http import ServerGone, detail, get, post
from mmrl.serving.rollout_wire import encode_rollout
from mmrl.serving.wire import decode


class ServedTeacher:
    """The teacher at `url` (`field`: the recipe key that names it, for errors)."""

    def __init__(self, url: str, field: str, timeout: float = 600.0):
        self.url, self.field, self.timeout = url.rstrip("/"), field, timeout

    def check(self) -> None:
        """A UserError unless a teacher server answers at the url."""
        try:
            status, body = get(f"{self.url}/health", timeout=10.0)
        except ServerGone:
            status, body = None, b""
        if status != 200 or "serves" not in json.loads(body or b"{}"):
            raise UserError(f"{self.field}.url: no teacher server answers at {self.url} (start one with "
                            f"`mmrl serve-teacher RECIPE policy.model=TEACHER --port PORT`)")

    def logprobs(self, mb: Rollout, units: slice) -> Tensor:
        """The teacher's fp32 log-probs [b, u] of `mb`'s units `units` (start and stop given)."""
        start, stop = units.indices(mb.num_units)[:2]
        try:
            answer = post(f"{self.url}/logprobs", {"rollout": encode_rollout(mb), "units": [start, stop]},
                          timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise UserError(f"{self.field}.url: the teacher at {self.url} refused the log-prob request "
                            f"({e.code}: {detail(e.read())})") from None
        except OSError as e:
            raise UserError(f"{self.field}.url: the teacher at {self.url} did not answer ({e})") from None
        return decode(answer["logprobs"])
