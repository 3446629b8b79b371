"""The speak demo's data set and figure: digit strings to say, each with a clean recording through the
tone codec (the warm start's target), held-out strings never in training; and the held-out clips'
waveforms and spectrograms before and after RL, with the judge's transcripts, over the reward curve."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

from mmrl.registry import DATASETS
from mmrl.train.reporting.tracking import read_metrics

from .synthetic.spoken_words import RATE, WORDS
from .tone_codec import ToneCodec, word_codes


@DATASETS.register("tone_words_to_say")
def tone_words_to_say(n_train: int = 256, n_eval: int = 64, min_words: int = 1, max_words: int = 3, seed: int = 0):
    """Rows {"prompt": digit words to say, "reference": the same words (what the ASR judge's transcript is
    scored against), "speech": {"array", "sampling_rate"}, the words through `ToneCodec` at a shift drawn
    per row}; the eval strings are distinct from one another and from every training string."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"tone_words_to_say: need 1 <= min_words ({min_words}) <= max_words ({max_words})")
    possible = sum(len(WORDS) ** n for n in range(min_words, max_words + 1))
    if n_eval > possible // 2:
        raise ValueError(f"tone_words_to_say: n_eval={n_eval} is more than half the {possible} strings of "
                         f"{min_words}-{max_words} words")
    rng = random.Random(seed)
    vocab = sorted(WORDS)
    codec = ToneCodec()

    def text() -> str:
        return " ".join(rng.choice(vocab) for _ in range(rng.randint(min_words, max_words)))

    held_out: dict[str, None] = {}  # in the order drawn
    while len(held_out) < n_eval:
        held_out[text()] = None
    train = [t for t in (text() for _ in range(20 * n_train + 100)) if t not in held_out][:n_train]

    def row(words: str) -> dict:
        codes = word_codes(words, rng.randrange(8))
        wave = codec.decode(codes[None]).audio_values.reshape(-1).numpy()
        return {"prompt": words, "reference": words, "speech": {"array": wave, "sampling_rate": RATE}}

    return {"train": [row(t) for t in train], "eval": [row(t) for t in held_out]}


def _wave_and_spectrogram(axes, completion: dict, title: str) -> None:
    from .figures import spectrogram_image
    samples = np.asarray(completion["array"], dtype=np.float32)
    axes[0].plot(np.arange(len(samples)) / RATE, samples, linewidth=0.4)
    axes[0].set_title(title, fontsize=8)
    axes[0].set_ylim(-0.5, 0.5)
    axes[0].tick_params(labelsize=6)
    if len(samples) >= 512:
        axes[1].imshow(np.asarray(spectrogram_image(samples, RATE)), cmap="gray", aspect="auto")
    axes[1].axis("off")


def draw_samples(rows: list[dict], before: list, after: list, out_png, columns: int = 4) -> None:
    """For the first `columns` held-out strings: the greedy clip before RL and after (waveform above its
    spectrogram, the held-out judge's transcript in the title), and the reward curve
    (``metrics.jsonl`` beside ``plots/``) below."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from .digit_judge import digit_judge
    n = min(columns, len(rows))
    judge = digit_judge(1)
    heard = {"before": judge.transcribe([c["array"] for c in before[:n]]),
             "after": judge.transcribe([c["array"] for c in after[:n]])}
    fig = Figure(figsize=(3.2 * n, 10))
    grid = fig.add_gridspec(5, n, height_ratios=[1, 1.3, 1, 1.3, 1.6])
    for j in range(n):
        for k, (when, clips) in enumerate((("before", before), ("after", after))):
            axes = [fig.add_subplot(grid[2 * k, j]), fig.add_subplot(grid[2 * k + 1, j])]
            _wave_and_spectrogram(axes, clips[j], f"say: {rows[j]['reference']}\n{when} RL, heard: {heard[when][j]!r}")
    curve = fig.add_subplot(grid[4, :])
    records = read_metrics(Path(out_png).parent.parent / "metrics.jsonl")
    points = [(r["step"], r["reward_mean"]) for r in records if isinstance(r.get("reward_mean"), (int, float))]
    if points:
        curve.plot(*zip(*points), linewidth=1)
    curve.set_xlabel("RL step")
    curve.set_ylabel("training reward (1 - WER)")
    FigureCanvasAgg(fig)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
