"""A gated composite reward for speech, as UniRL's `TTSCompositeScorer`
(`unirl/reward/local/tts_composite.py`, weights from its talker-TTS recipe): content first, quality
can veto.

    total   = sum_k w_k r_k / sum_k w_k                     over the components (registered rewards)
    reward  = total * prod_{p: r_p < t_p} f_p  if every gate g has r_g >= t_g, else 0

The defaults are UniRL's recipe's: weights asr_wer 0.60 (intelligibility), speaker_similarity 0.15,
a MOS predictor 0.15, tts_stability 0.10; gates tts_stability >= 1 and the MOS reward >= 0.30;
speaker similarity below 0.40 halves the reward. The content component (asr_wer) must carry at least
half the weight. `mos` names the registered reward that gives a mapped MOS in [0, 1] (the `mos`
reward: DNSMOS; or a served UTMOS), and without it its weight and gate are left out.
A row where any component is None (no reference voice, no reference text) scores None, fail-closed
as UniRL's, which refuses to train on a failed component. `components` passes each component its
own arguments: {"asr_wer": {"model": "openai/whisper-large-v3"}}."""

from __future__ import annotations

import math
from typing import Any

from mmrl.core.scoring import get_reward, register_reward

from .outputs import AUDIO

DEFAULT_WEIGHTS = {"asr_wer": 0.60, "speaker_similarity": 0.15, "tts_stability": 0.10}


def gated_total(scores: dict[str, float], weights: dict[str, float], gates: dict[str, float],
                penalties: dict[str, tuple[float, float]]) -> float:
    """UniRL's composite of one row's component scores (module docstring)."""
    total = sum(weights[k] * scores[k] for k in weights) / sum(weights.values())
    if any(scores[g] < threshold for g, threshold in gates.items()):
        return 0.0
    for name, (threshold, factor) in penalties.items():
        if scores[name] < threshold:
            total *= factor
    return total


def _settings(weights, gates, penalties, mos, mos_weight, mos_gate, content, min_content):
    weights = dict(DEFAULT_WEIGHTS if weights is None else weights)
    gates = dict({"tts_stability": 1.0} if gates is None else gates)
    if mos is not None:
        weights.setdefault(mos, mos_weight)
        gates.setdefault(mos, mos_gate)
    penalties = {k: tuple(v) for k, v in ({"speaker_similarity": (0.40, 0.50)} if penalties is None else penalties).items()}
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"tts_composite: weights={weights!r} must be non-negative with a positive sum")
    if weights.get(content, 0.0) / sum(weights.values()) < min_content:
        raise ValueError(f"tts_composite: the content reward {content!r} has {weights.get(content, 0.0)} of the weight "
                         f"{sum(weights.values())}, under min_content_weight_fraction={min_content}")
    for name in (*gates, *penalties):
        if name not in weights:
            raise ValueError(f"tts_composite: {name!r} is gated or penalised but not among the weights {sorted(weights)}")
    return weights, gates, penalties


@register_reward("tts_composite", outputs=AUDIO)
def tts_composite(prompts, completions, weights: dict[str, float] | None = None, gates: dict[str, float] | None = None,
                  penalties: dict[str, list[float]] | None = None, mos: str | None = None, mos_weight: float = 0.15,
                  mos_gate: float = 0.30, components: dict[str, dict[str, Any]] | None = None,
                  content: str = "asr_wer", min_content_weight_fraction: float = 0.5, **columns) -> list[float | None]:
    """The gated composite of registered speech rewards (module docstring)."""
    weights, gates, penalties = _settings(weights, gates, penalties, mos, mos_weight, mos_gate, content,
                                          min_content_weight_fraction)
    scores = {}
    for name in weights:
        args = dict((components or {}).get(name, {}))
        scores[name] = get_reward(name)(prompts, completions, **columns, **args)
    out: list[float | None] = []
    for i in range(len(completions)):
        row = {name: scores[name][i] for name in weights}
        if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in row.values()):
            out.append(None)
            continue
        out.append(gated_total(row, weights, gates, penalties))
    return out
