"""Shared by the benchmark scripts: print a report as JSON and write it where --json says."""

from __future__ import annotations

import json


def emit(report: dict, path: str | None) -> None:
    text = json.dumps(report, indent=1)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
