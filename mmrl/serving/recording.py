"""Record and replay of remote answers: a JSON-lines file of ``{"hash": content hash of the request,
"answer": ...}``, appended to as answers arrive (``rewards.NAME.record``) and read back
(``rewards.NAME.replay``) so a later run, a test or CI needs no server."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from mmrl.errors import MissingFileError, UserError


class Recording:
    """Writes answers to `record`, or answers from `replay` (one of them)."""

    def __init__(self, record: str | None, replay: str | None):
        self.record, self.replay = record, replay
        self.replaying = replay is not None
        self._answers: dict[str, Any] = self._read(replay) if replay else {}
        self._lock = threading.Lock()
        if record:
            Path(record).parent.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def _read(path: str) -> dict[str, Any]:
        if not Path(path).is_file():
            raise MissingFileError(f"replay file {path!r} does not exist (write one with record: {path})")
        answers = {}
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            try:
                entry = json.loads(line)
                answers[entry["hash"]] = entry["answer"]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"replay file {path}, line {number}: not a recorded answer "
                                f"({line[:80]!r})") from None
        return answers

    def answer(self, key: str) -> Any | None:
        """The recorded answer to the request of hash `key`, or None."""
        return self._answers.get(key)

    def write(self, key: str, answer: Any) -> None:
        """Append one request's hash and answer to the record file."""
        line = json.dumps({"hash": key, "answer": answer}, separators=(",", ":")) + "\n"
        with self._lock, open(self.record, "a") as f:
            f.write(line)
