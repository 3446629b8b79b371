"""The speak demo's ASR judges: a tiny CTC recogniser of the digit words, trained once on the asr demo's
synthetic sine-wave speech (`synthetic/spoken_words.py`) and cached like the other demo judges
(`shape_judge.cached_judge`).

It reads a log-magnitude spectrogram (512-point FFT, hop 10 ms, up to 3 kHz), two strided
convolutions, a bidirectional GRU and a linear layer over the 8 words and CTC's blank; the
transcript is the greedy CTC path (repeats merged, blanks dropped). Two judges are trained from two
seeds on two draws of the speech: ``tiny-digit-asr`` (seed 0), the training reward's
(`asr_wer` with ``model: tiny-digit-asr``), and ``tiny-digit-asr-heldout`` (seed 1), the demo's held-out
evaluator, so that a speaker which found a quirk of the first judge is not scored by it.

Why not the asr demo's tiny Qwen2-Audio: it learns its transcripts by RL over minutes and writes
characters; the judge must transcribe every rollout of every step, and a 60k-weight CTC model
trained for half a minute transcribes the synthetic speech almost perfectly.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from mmrl.rewards.wer import asr_wer_reward, register_transcriber
from mmrl.train.loop.evaluation import Evaluator

from .shape_judge import cached_judge
from .synthetic import spoken_words
from .synthetic.spoken_words import RATE, WORDS

VOCAB = sorted(WORDS)  # CTC class k + 1 is VOCAB[k]; 0 is the blank
N_FFT, HOP, MAX_BIN = 512, 160, 96  # 96 bins of 31.25 Hz: up to 3 kHz


def spectrogram(waves: Sequence[np.ndarray]) -> tuple[Tensor, Tensor]:
    """Log-magnitude spectrograms (scaled to about [-0.5, 2.5]) [B, F, MAX_BIN] of 16 kHz waveforms (zero-padded to the longest) and
    each one's frame count [B]."""
    longest = max(max(len(w) for w in waves), N_FFT)
    batch = torch.zeros(len(waves), longest)
    for i, w in enumerate(waves):
        batch[i, :len(w)] = torch.as_tensor(np.asarray(w, dtype=np.float32))
    spec = torch.stft(batch, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True, center=True)
    frames = torch.tensor([len(w) // HOP + 1 for w in waves])
    return (torch.log1p(100 * spec.abs()[:, :MAX_BIN]) / 3 - 0.5).transpose(1, 2), frames


class DigitASR(nn.Module):
    """Spectrogram frames -> CTC log-probs over blank + the words, at a quarter of the frame rate."""

    def __init__(self, width: int = 48):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv1d(MAX_BIN, width, 5, stride=2, padding=2), nn.GELU(),
                                   nn.Conv1d(width, width, 5, stride=2, padding=2), nn.GELU())
        self.rnn = nn.GRU(width, width, batch_first=True, bidirectional=True)
        self.out = nn.Linear(2 * width, len(VOCAB) + 1)

    def forward(self, spec: Tensor) -> Tensor:
        """CTC log-probs [B, F // 4 (rounded up), 1 + words] of spectrograms [B, F, MAX_BIN]."""
        hidden = self.convs(spec.transpose(1, 2)).transpose(1, 2)
        return torch.log_softmax(self.out(self.rnn(hidden)[0]), dim=-1)

    @staticmethod
    def out_lengths(frames: Tensor) -> Tensor:
        return (frames + 3) // 4

    @torch.no_grad()
    def transcribe(self, waves: Sequence[np.ndarray]) -> list[str]:
        """Greedy CTC transcripts of 16 kHz waveforms (an empty one: "")."""
        spec, frames = spectrogram([w if len(w) else np.zeros(1, np.float32) for w in waves])
        best = self(spec).argmax(-1)
        out = []
        for path, n in zip(best, self.out_lengths(frames)):
            ids = torch.unique_consecutive(path[:int(n)]).tolist()
            out.append(" ".join(VOCAB[k - 1] for k in ids if k))
        return out


def train_judge(seed: int, steps: int = 500, batch: int = 32) -> DigitASR:
    """A `DigitASR` trained with CTC on 2000 synthetic utterances of 1-3 words drawn from `seed`."""
    torch.manual_seed(seed)
    rows = spoken_words.spoken_words(n_train=2000, n_eval=0, seed=100 + seed)["train"]
    judge = DigitASR()
    optimizer = torch.optim.AdamW(judge.parameters(), lr=1e-2)
    ctc = nn.CTCLoss(blank=0, zero_infinity=True)
    for _ in range(steps):
        pick = torch.randint(len(rows), (batch,)).tolist()
        spec, frames = spectrogram([rows[i]["audio"]["array"] for i in pick])
        targets = [torch.tensor([VOCAB.index(w) + 1 for w in rows[i]["reference"].split()]) for i in pick]
        logp = judge(spec).transpose(0, 1)  # [F', B, C]
        loss = ctc(logp, torch.cat(targets), judge.out_lengths(frames), torch.tensor([len(t) for t in targets]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return judge.eval()


@functools.lru_cache(maxsize=2)
def digit_judge(seed: int = 0) -> DigitASR:
    """The judge of `seed`: trained once, then loaded from the cache (named by this module's and the
    speech's sources, so a change retrains)."""
    source = Path(__file__).read_bytes() + Path(spoken_words.__file__).read_bytes()
    key = hashlib.sha256(source + str(seed).encode()).hexdigest()[:16]
    return cached_judge(f"digit_asr-{key}", DigitASR, lambda: train_judge(seed))


def _transcriber(seed: int):
    return lambda waves: digit_judge(seed).transcribe(waves)


register_transcriber("tiny-digit-asr", _transcriber(0), RATE)
register_transcriber("tiny-digit-asr-heldout", _transcriber(1), RATE)


def heldout_intelligibility() -> Evaluator:
    """The speak demo's evaluator: 1 - min(WER, 1) of the held-out judge's transcript (`asr_wer`'s
    normaliser: lowercase, punctuation stripped) against the text to say."""
    def score(prompts, completions, reference, **columns):
        return asr_wer_reward(prompts, completions, reference, model="tiny-digit-asr-heldout")
    return Evaluator("1 - WER by a second ASR judge (another seed, other training speech)", score)
