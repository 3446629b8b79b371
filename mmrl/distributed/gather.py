"""Python objects gathered from every process, whatever the strategy (the identity on one process):
the records a step's phases exchange, a signal one process received."""

from __future__ import annotations

from typing import Any


def gather_objects(accelerator, obj: Any) -> list[Any]:
    """One object from each process, in process order (the identity on one process)."""
    if accelerator.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object
    return gather_object([obj])
