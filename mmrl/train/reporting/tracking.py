"""What users see of a run: a start summary and an end line, a progress bar (or a line of metrics
every `logging.print_every` steps without it), ``metrics.jsonl``, TensorBoard, W&B when asked, and
``plots/rewards.png`` redrawn as training goes."""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import secrets
import time
from pathlib import Path
from typing import Any, Sequence

REPORTERS = ("tensorboard", "wandb", "none")
PLOT_TIME_SHARE = 0.01  # the largest share of a run's wall time the reward plot's redraws may take
REPORTER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # reporter -> the package it writes with
WANDB_RUN_ID = Path("wandb") / "mmrl-run-id"  # under the output directory: the W&B run a resume continues

logger = logging.getLogger(__name__)


def _clean(value: Any) -> Any:
    """A JSON-ready value: numpy/python numbers as int or float, non-finite floats as None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a metrics.jsonl; a line cut short by a killed run is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return [r for r in records if isinstance(r, dict) and "step" in r]


def _save_figure_atomically(fig, out_png: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_png.with_name(f".{out_png.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, out_png)
    finally:
        tmp.unlink(missing_ok=True)


def _moving_average(values: Sequence[float], width: int) -> list[float]:
    """Trailing mean over at most `width` points."""
    sums = [0.0]
    for v in values:
        sums.append(sums[-1] + v)
    return [(sums[i + 1] - sums[max(0, i + 1 - width)]) / min(i + 1, width) for i in range(len(values))]


def _series(records: list[dict], key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pts], [v for _, v in pts]


def stage_starts(records: list[dict]) -> list[tuple[int, int]]:
    """(first step, stage index) of every stage after the first, from the records' ``stage``."""
    out, last = [], None
    for r in sorted((r for r in records if isinstance(r.get("stage"), int)), key=lambda r: r["step"]):
        if last is not None and r["stage"] != last:
            out.append((r["step"], r["stage"]))
        last = r["stage"]
    return out


def plot_rewards(metrics_path: str | Path, out_png: str | Path) -> bool:
    """Draw reward curves (raw and moving average) and, when logged, KL, clip fraction and entropy;
    a dotted line marks where each training stage begins.

    Returns False, writing nothing, when there is no reward to draw."""
    from matplotlib.figure import Figure
    records = read_metrics(metrics_path)
    names = ["reward_mean"] + sorted({k for r in records for k in r if k.startswith("reward/")})
    rewards = {k: s for k in names if (s := _series(records, k))[0]}
    if not rewards:
        return False
    extra = {k: s for k in ("kl", "clip_frac", "entropy") if (s := _series(records, k))[0]}
    fig = Figure(figsize=(8, 6.5 if extra else 4))
    axes = fig.subplots(2 if extra else 1, 1, squeeze=False, sharex=True)[:, 0]
    for key, (steps, values) in rewards.items():
        line, = axes[0].plot(steps, values, linewidth=0.7, alpha=0.4)
        axes[0].plot(steps, _moving_average(values, max(1, len(values) // 10)), linewidth=2,
                     color=line.get_color(), label=key)
    axes[0].set_title("rewards (thin: raw, thick: moving average)")
    axes[0].set_ylabel("reward")
    axes[0].legend(fontsize=8)
    for key, (steps, values) in extra.items():
        axes[1].plot(steps, values, label=key)
    if extra:
        axes[1].set_title("KL, clip fraction and entropy")
        axes[1].set_ylabel("value")
        axes[1].legend(fontsize=8)
    for step, stage in stage_starts(records):
        for ax in axes:
            ax.axvline(step - 0.5, color="gray", linestyle=":", linewidth=1)
        axes[0].annotate(f"stage {stage}", (step - 0.5, 1), xycoords=("data", "axes fraction"),
                         fontsize=7, color="gray", ha="left", va="top")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    _save_figure_atomically(fig, Path(out_png))
    return True


def plot_sample_grid(images: Sequence[Any], captions: Sequence[str], out_png: str | Path, ncols: int = 4) -> None:
    """Write a PNG grid of PIL images or HxW(xC) uint8 arrays, each with a short caption."""
    import numpy as np
    from matplotlib.figure import Figure
    n = len(images)
    ncols = max(1, min(ncols, n))
    nrows = max(1, math.ceil(n / ncols))
    fig = Figure(figsize=(2.5 * ncols, 2.8 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.axis("off")
        if i < n:
            image = np.asarray(images[i])
            ax.imshow(image, cmap="gray" if image.ndim == 2 else None)
            ax.set_title(str(captions[i])[:40], fontsize=7)
    fig.tight_layout()
    _save_figure_atomically(fig, Path(out_png))


def wandb_run_id(output_dir: str | Path, resumed: bool) -> str:
    """The W&B run id of the run in `output_dir`: the stored one when the run resumes and has one,
    else a new one, stored for its resumes."""
    path = Path(output_dir) / WANDB_RUN_ID
    if resumed and path.is_file():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id)
    return run_id


class Tracker:
    """metrics.jsonl + TensorBoard (+ W&B) + reward plot; every method is a no-op where `enabled` is False."""

    def __init__(self, output_dir: str | Path, report_to: Sequence[str] = ("tensorboard",), plot_every: int = 10,
                 config: dict | None = None, resume_step: int | None = None, enabled: bool = True,
                 wandb_project: str = "mmrl", run_name: str | None = None):
        report_to = [report_to] if isinstance(report_to, str) else list(report_to)
        for r in report_to:
            if r not in REPORTERS:
                raise ValueError(f"logging.report_to: {r!r} is not one of {list(REPORTERS)}")
        self.enabled = enabled
        self.plot_every = plot_every
        self._plot_ready_at = 0.0  # perf_counter time before which a redraw would exceed PLOT_TIME_SHARE
        self.dir = Path(output_dir)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.plot_path = self.dir / "plots" / "rewards.png"
        self.writer = None
        self.wandb = None
        if not enabled:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        config_path = self.dir / "config.json"
        if config is not None and (resume_step is None or not config_path.exists()):  # a resumed run keeps its own
            config_path.write_text(json.dumps(config, indent=1, default=str))
        if resume_step is not None:
            kept = [r for r in read_metrics(self.metrics_path) if r["step"] <= resume_step]
            tmp = self.metrics_path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
            os.replace(tmp, self.metrics_path)
        self._file = open(self.metrics_path, "a")
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter
            self.writer = SummaryWriter(str(self.dir / "tensorboard"))
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError as e:
                raise ImportError("logging.report_to includes 'wandb' but wandb is not installed: "
                                  "pip install wandb") from e
            self.wandb = wandb.init(project=wandb_project, name=run_name or self.dir.resolve().name, config=config,
                                    dir=str(self.dir), id=wandb_run_id(self.dir, resume_step is not None),
                                    resume="allow")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record `metrics` at `step` everywhere asked; redraw the plot every `plot_every` steps."""
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in metrics.items()}
        record["step"] = step
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        if self.writer is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.writer.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.plot_every and step % self.plot_every == 0 and time.perf_counter() >= self._plot_ready_at:
            self._plot()

    def _plot(self) -> None:
        """Redraw the reward plot, and put off the next redraw until it keeps the drawing's share of the
        run's time under PLOT_TIME_SHARE (a redraw reads the whole metrics file, so it slows as the run
        grows). A plot that cannot be written (a full disk) is a warning, never the run's error."""
        begun = time.perf_counter()
        try:
            plot_rewards(self.metrics_path, self.plot_path)
        except OSError as e:
            logger.warning("could not draw %s: %s", self.plot_path, e)
        finished = time.perf_counter()
        self._plot_ready_at = finished + (finished - begun) * (1 / PLOT_TIME_SHARE - 1)

    def close(self) -> None:
        """Draw the final plot and close the writers."""
        if not self.enabled:
            return
        self._file.close()
        self._plot()
        if self.writer is not None:
            self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


class Progress:
    """A tqdm bar over training steps showing reward, KL, clip fraction, loss and, in a distillation run,
    the student's divergence from its teacher; tqdm gives the ETA. Without the bar, with `print_every`,
    one printed line of those metrics every `print_every` steps."""

    SHOWN = {"reward": "reward_mean", "kl": "kl", "clip": "clip_frac", "loss": "loss", "distill": "distill_divergence"}

    def __init__(self, total: int, initial: int = 0, enabled: bool = True, desc: str = "train",
                 print_every: int = 0, leave: bool = True):
        self.bar = None
        self.total, self.desc, self.print_every = total, desc, print_every
        if enabled:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=leave)

    def update(self, step: int, metrics: dict) -> None:
        """Advance the bar to `step` and show the metrics present in `metrics` (or print them)."""
        shown = {k: f"{metrics[v]:.3g}" for k, v in self.SHOWN.items() if isinstance(metrics.get(v), numbers.Real)}
        if self.bar is None:
            if self.print_every and step % self.print_every == 0:
                print(f"{self.desc} step {step}/{self.total}: " + " ".join(f"{k}={v}" for k, v in shown.items()),
                      flush=True)
            return
        self.bar.set_postfix(shown, refresh=False)
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        """Close the bar."""
        if self.bar is not None:
            self.bar.close()


def start_summary(task: str, model: str, trainable: int, total: int, train_rows: int, eval_rows: int,
                  output_dir: str | Path, world_size: int, resumed_step: int | None) -> str:
    """The lines a run prints as it starts."""
    share = f" ({100 * trainable / total:.1f}%)" if total else ""
    lines = [f"mmrl train: task {task}, model {model}",
             f"  parameters: {trainable:,} trainable of {total:,}{share}",
             f"  data: {train_rows} train rows, {eval_rows} eval rows",
             f"  output: {output_dir} (world size {world_size})"]
    if resumed_step is not None:
        lines.append(f"  resumed from step {resumed_step}")
    return "\n".join(lines)


def end_line(step: int, first_step: int, seconds: float, metrics_path: str | Path, checkpoint: str | Path) -> str:
    """The line a finished run prints: its steps and time, its last and best training reward (and best
    held-out one) from `metrics_path`, and its final checkpoint."""
    records = read_metrics(metrics_path)
    rewards = [(r["reward_mean"], r["step"]) for r in records if isinstance(r.get("reward_mean"), (int, float))]
    evals = [(r["eval/reward_mean"], r["step"]) for r in records if isinstance(r.get("eval/reward_mean"), (int, float))]
    parts = [f"mmrl train: done, step {step} ({step - first_step} this session) in {seconds:.1f} s"]
    if rewards:
        best = max(rewards)
        parts.append(f"reward_mean last {rewards[-1][0]:.4g}, best {best[0]:.4g} (step {best[1]})")
    if evals:
        best = max(evals)
        parts.append(f"eval reward_mean best {best[0]:.4g} (step {best[1]})")
    parts.append(f"final checkpoint {checkpoint}")
    return "; ".join(parts)
