"""The settings of a reward served elsewhere (``rewards.NAME.url``): how its requests are sent
(`ClientSettings`, shared by every remote call), and the server a run may launch itself
(`ServerLaunch`). docs/rewards.md#served-rewards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class ClientSettings:
    batch_size: int = field(default=64, metadata={"help": (
        "Rows per request; a call's rows are split into requests of at most this many.")})
    concurrency: int = field(default=4, metadata={"help": (
        "Requests in flight at once (spread over the urls in turn).")})
    timeout_s: float = field(default=60.0, metadata={"help": (
        "Seconds a request may take before it counts as failed (and is retried).")})
    retries: int = field(default=3, metadata={"help": (
        "Times a request is sent again after a retryable failure (a status in retry_statuses, a timeout "
        "or a connection error); then the failure is handled as on_failure says.")})
    backoff_s: float = field(default=0.5, metadata={"help": (
        "Wait before the first retry; doubled before each next one (exponential backoff).")})
    retry_statuses: list[int] = field(default_factory=lambda: [429, 502, 503, 504], metadata={"help": (
        "HTTP statuses that are retried; any other error status fails at once.")})
    cache: bool = field(default=True, metadata={"help": (
        "Answer a request whose content (rows, arguments) was already answered in this run from memory, "
        "keyed by the content's hash.")})
    api_key_env: str | None = field(default=None, metadata={"help": (
        "Name of an environment variable holding the server's API key, sent as 'Authorization: Bearer KEY' "
        "(an OpenAI-compatible judge started with --api-key); the key itself never goes in the recipe.")})
    on_failure: Literal["stop", "skip"] = field(default="stop", metadata={"help": (
        "What a request that still fails does: stop (the step does not train; the run saves the last step's "
        "checkpoint and stops with one line naming the url, the status and the rows) or skip (those rows get "
        "no value from this reward, counted in reward/NAME/failed_frac, and train as rows without it do).")})


@dataclass
class ServerLaunch:
    command: str = field(default="", metadata={"help": (
        "Shell command that starts the reward's server (e.g. 'mmrl serve-reward clip --port 8001'), run by "
        "the run's main process before the model loads and stopped with the run (also on Ctrl-C and SIGTERM); "
        "its output goes to OUTPUT_DIR/servers/NAME.log.")})
    ready: str = field(default="/health", metadata={"help": (
        "Path on the reward's first url that answers 200 once the server is ready.")})
    timeout_s: float = field(default=300.0, metadata={"help": (
        "Seconds to wait for the server to be ready; then the run stops, showing the end of its log.")})
    devices: str | None = field(default=None, metadata={"help": (
        "CUDA_VISIBLE_DEVICES for the server (e.g. '1' or '2,3'); null keeps the run's environment.")})
