"""The token sampler of the HF rollouts (`generation.py`, and the episodes' model turns in
`episode_engines.py`): `GroupSeededSampler`, a logits processor that draws each row's tokens from
its group's own generator and records the log-probs it drew with."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn
from transformers import LogitsProcessor


class GroupSeededSampler(LogitsProcessor):
    """Temperature / top-k / top-p sampling by inverse CDF, one uniform per row per step drawn
    from the row's group generator. Returns scores that are +inf at the drawn token, so greedy
    decoding in ``generate`` emits the sample. It also bans `eos_ids` for the first
    `min_new_tokens` tokens (the rule of generate's own min_new_tokens processor, applied here so
    that each decoding step runs one processor, not two).

    `sampled_logp` gives, per step, the fp32 log-prob [N] of the drawn token under the distribution it
    was drawn from: the scores as ``generate`` processed them (token bans) with the early-EOS ban,
    divided by the temperature, restricted to the top-k / top-p set and renormalised there."""

    def __init__(self, seeds: Sequence[int], group_size: int, temperature: float, top_k: int, top_p: float,
                 eos_ids: Sequence[int] = (), min_new_tokens: int = 0,
                 generators: Sequence[torch.Generator] | None = None):
        # `generators`: one per group, given instead of `seeds` (an episode's turn: one per row)
        self.generators = list(generators) if generators is not None else [
            torch.Generator().manual_seed(int(s)) for s in seeds]
        self.group_size = group_size
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.eos_ids = torch.tensor(list(eos_ids)) if len(eos_ids) else None  # banned while min_new_tokens lasts
        self.min_new_tokens = min_new_tokens
        self.prompt_width: int | None = None  # input_ids' width at the first step
        self.drawn: list[tuple[Tensor, Tensor]] = []  # per step: (drawn token's kept probability [N, 1], kept mass [N, 1])

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if self.prompt_width is None:
            self.prompt_width = input_ids.shape[1]
        logits = scores.float()
        if self.eos_ids is not None and input_ids.shape[1] - self.prompt_width < self.min_new_tokens:
            logits = logits.index_fill(1, self.eos_ids.to(logits.device), float("-inf"))
        if self.temperature != 1.0:
            logits = logits / self.temperature
        if self.top_k > 0:
            kth = torch.topk(logits, min(self.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > self.top_p
            probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
        u = torch.empty(probs.shape[0])
        for k, g in enumerate(self.generators):
            torch.rand(self.group_size, generator=g, out=u[k * self.group_size:(k + 1) * self.group_size])
        cdf = probs.cumsum(-1)
        total = cdf[:, -1:].clone()  # the kept (top-k / top-p) mass [N, 1]; a copy, not a view that keeps cdf [N, V]
        token = torch.searchsorted(cdf, u.to(probs.device)[:, None] * total, right=True).clamp(max=probs.shape[-1] - 1)
        # a token of zero probability is never drawn (u * total can equal a cdf plateau's value); its
        # probability and the kept mass [N, 1] each stay on the device until the rollout ends (`sampled_logp`)
        self.drawn.append((probs.gather(1, token), total))
        return scores.scatter_(1, token, float("inf"))  # generate's own fresh copy of the step's logits

    def sampled_logp(self, width: int) -> Tensor:
        """The drawn tokens' log-probs [N, width] on the CPU (steps after the last one are 0)."""
        if not self.drawn:
            return torch.zeros(self.group_size * len(self.generators), width)
        chosen, mass = (torch.cat(parts, 1) for parts in zip(*self.drawn))
        return nn.functional.pad((chosen / mass).log().cpu(), (0, width - chosen.shape[1]))
