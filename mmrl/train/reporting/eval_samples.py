"""Held-out samples where users look: at each evaluation the samples of the first
`eval.log_samples` prompts, with their prompts and rewards, go to TensorBoard and W&B.

Each completion becomes one `Medium` (text, image, video, audio, or a video with its sound
track), as the policy says (`Policy.sample_medium`; mmrl/core/media.py by default). TensorBoard
gets ``samples/<p>/<k>`` per medium (images; videos as animated GIFs in the images tab, encoded
here, so no moviepy is needed; audio), a video's sound track under the sibling tag
``samples/<p>/<k>/sound``, and ``samples/<p>`` a text table of the prompt, each sample's reward
and, for text, the sample. W&B gets one table ``samples`` per evaluation (step, prompt, sample
index, reward, the sample as text or ``wandb.Image`` / ``wandb.Video`` / ``wandb.Audio``, and
where a sample has a sound track a ``sound`` column of ``wandb.Audio``: ``wandb.Video`` takes
sound only from an encoded file, which would need an encoder installed).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mmrl.core.media import Medium, MediumOf, medium

SAMPLES_PER_PROMPT = 4  # the sampled completions logged per prompt, beside the greedy one


@dataclass
class LoggedSample:
    """One completion to log: its prompt's index and text, its index among them (0 = greedy), reward."""

    prompt_index: int
    prompt: str
    name: str
    reward: float | None
    medium: Medium


def logged_samples(samples: Sequence[dict], prompts: int, medium_of: MediumOf = medium) -> list[LoggedSample]:
    """The greedy and the first SAMPLES_PER_PROMPT sampled completions of the first `prompts`
    evaluation samples (`mmrl.train.loop.evaluation.evaluate`'s ``samples``), each made a medium by
    `medium_of` (the policy's `sample_medium`)."""
    out = []
    for p, sample in enumerate(samples[:prompts]):
        row = sample["row"]
        prompt = str(row.get("prompt", "")) if isinstance(row, dict) else str(row)
        columns = sample.get("columns") or {}
        greedy_columns = {k: v[0] for k, v in (sample.get("greedy_columns") or {}).items()}
        out.append(LoggedSample(p, prompt, "greedy", sample["greedy_reward"], medium_of(sample["greedy"], greedy_columns)))
        for k, (completion, reward) in enumerate(zip(sample["completions"][:SAMPLES_PER_PROMPT], sample["rewards"])):
            row_columns = {name: values[k] for name, values in columns.items()}
            out.append(LoggedSample(p, prompt, f"sample {k}", reward, medium_of(completion, row_columns)))
    return out


def gif_bytes(frames: np.ndarray, fps: float) -> bytes:
    """An animated GIF of uint8 frames [T, H, W, 3], looping."""
    from PIL import Image
    images = [Image.fromarray(f) for f in frames]
    buffer = io.BytesIO()
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return buffer.getvalue()


def _fmt(reward: float | None) -> str:
    return "None" if reward is None or reward != reward else f"{reward:.4g}"


def write_tensorboard(writer, step: int, logged: Sequence[LoggedSample]) -> None:
    """Each medium under ``samples/<p>/<name>`` and a text table per prompt under ``samples/<p>``."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    tables: dict[int, list[str]] = {}
    for s in logged:
        tag = f"samples/{s.prompt_index}/{s.name.replace(' ', '_')}"
        text = s.medium.data.replace("\n", " ").replace("|", "\\|") if s.medium.kind == "text" else f"({s.medium.kind})"
        tables.setdefault(s.prompt_index, [f"**prompt:** {s.prompt}", "", "| sample | reward | completion |",
                                           "|---|---|---|"]).append(f"| {s.name} | {_fmt(s.reward)} | {text} |")
        if s.medium.kind == "image":
            writer.add_image(tag, s.medium.data, step, dataformats="HWC")
        elif s.medium.kind in ("video", "audio_video"):
            t, h, w, c = s.medium.data.shape
            image = Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=gif_bytes(s.medium.data,
                                                                                                  s.medium.rate))
            writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
            if s.medium.sound is not None:
                writer.add_audio(f"{tag}/sound", np.clip(s.medium.sound, -1, 1)[None], step,
                                 sample_rate=int(s.medium.sound_rate))
        elif s.medium.kind == "audio":
            writer.add_audio(tag, np.clip(s.medium.data, -1, 1)[None], step, sample_rate=int(s.medium.rate))
    for p, lines in tables.items():
        writer.add_text(f"samples/{p}", "\n".join(lines), step)


def wandb_table(wandb, step: int, logged: Sequence[LoggedSample]):
    """A ``wandb.Table`` of the samples (module docstring)."""
    sound = any(s.medium.sound is not None for s in logged)
    table = wandb.Table(columns=["step", "prompt", "sample", "reward", "completion"] + (["sound"] if sound else []))
    for s in logged:
        cells = [_wandb_value(wandb, s.medium)]
        if sound:
            m = s.medium
            cells.append(None if m.sound is None else wandb.Audio(m.sound, sample_rate=int(m.sound_rate)))
        table.add_data(step, s.prompt, s.name, s.reward, *cells)
    return table


def _wandb_value(wandb, m: Medium):
    if m.kind == "image":
        return wandb.Image(m.data)
    if m.kind in ("video", "audio_video"):  # wandb.Video takes [T, C, H, W]
        return wandb.Video(m.data.transpose(0, 3, 1, 2), fps=int(round(m.rate)), format="gif")
    if m.kind == "audio":
        return wandb.Audio(m.data, sample_rate=int(m.rate))
    return m.data


def log_eval_samples(tracker, step: int, samples: Sequence[dict], prompts: int, medium_of: MediumOf = medium) -> None:
    """The first `prompts` evaluation samples to the tracker's TensorBoard writer and W&B run
    (`mmrl.train.reporting.tracking.Tracker`), where it has them; `medium_of` makes each completion a
    medium (the policy's `sample_medium`)."""
    if not tracker.enabled or prompts <= 0 or (tracker.writer is None and tracker.wandb is None):
        return
    logged = logged_samples(samples, prompts, medium_of)
    if tracker.writer is not None:
        write_tensorboard(tracker.writer, step, logged)
        tracker.writer.flush()
    if tracker.wandb is not None:
        import wandb
        tracker.wandb.log({"samples": wandb_table(wandb, step, logged)}, step=step)
