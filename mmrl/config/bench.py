"""The ``eval.bench`` section: a benchmark's subset scored during training at every ``eval.every``,
logged beside the held-out rewards as ``eval/bench/NAME/FIGURE`` (docs/bench.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchEvalConfig:
    name: str = field(default="", metadata={"help": (
        "A registered benchmark (mmrl list), e.g. gsm8k; scored on its first num_prompts prompts at every "
        "eval.every, with the run's own policy settings.")})
    num_prompts: int = field(default=16, metadata={"help": (
        "How many of the benchmark's prompts (the first in its order) each evaluation scores.")})
    data: str | None = field(default=None, metadata={"help": (
        "A local copy of the benchmark's data in its source's format (a file, a folder, a save_to_disk folder); "
        "null: the Hugging Face hub data set the benchmark names.")})
    split: str | None = field(default=None, metadata={"help": "Another split than the benchmark's own; null: its own."})
    options: dict[str, Any] = field(default_factory=dict, metadata={"help": (
        "The benchmark's protocol options (docs/bench.md lists each benchmark's), e.g. {template: '{question}'}.")})
    scorer_url: str | None = field(default=None, metadata={"help": (
        "The url of a server scoring the benchmark (mmrl serve-reward SCORER, or an OpenAI-compatible judge); "
        "null: scored in process.")})
