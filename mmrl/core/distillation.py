"""On-policy distillation's signal (docs/methods.md, 'On-policy distillation'): the per-unit
divergence of the student from a teacher on the student's own rollouts, and the advantage it
gives, alone or added to the group-relative reward advantage.

Per unit u of row i (the student pi_s samples, the teacher pi_t scores the same units):
    sampled     d_iu = log pi_s(u) - log pi_t(u)          one-sample reverse KL (any family)
    closed_form d_iu = KL(pi_s(.|state) || pi_t(.|state))  the policy's exact per-unit KL (Gaussian steps)
    jsd         d_iu = JSD_beta(pi_s || pi_t) at the unit  GKD's generalised JSD over a finite vocabulary
    A_iu = [A_i] - weight * d_iu                           ([A_i]: the reward advantage, when kept)
A teacher equal to the student gives d = 0, so the signal is zero.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

DIVERGENCES = ("sampled", "closed_form", "jsd")


def sampled_reverse_kl(student_logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """log pi_s - log pi_t [B, u] (fp32) at the units the student sampled: an unbiased one-sample
    estimate of each unit's KL(pi_s || pi_t) (Thinking Machines' on-policy distillation)."""
    return student_logp.float() - teacher_logp.float()


def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, beta: float, temperature: float = 1.0) -> Tensor:
    """GKD's generalised JSD per unit [B, u] from logits [B, u, V] (Agarwal et al. 2024, Eq. 1, in
    TRL's convention): M = (1 - beta) S + beta T, JSD = beta KL(T || M) + (1 - beta) KL(S || M);
    beta = 0 is the forward KL(T || S) and beta = 1 the reverse KL(S || T), as TRL's special cases."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"algorithm.distill.beta={beta} must lie in [0, 1]")
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    if beta == 0.0:
        return kl_of_log_probs(t, s)
    if beta == 1.0:
        return kl_of_log_probs(s, t)
    m = torch.logsumexp(torch.stack([s + math.log1p(-beta), t + math.log(beta)]), dim=0)
    return beta * kl_of_log_probs(t, m) + (1 - beta) * kl_of_log_probs(s, m)


def kl_of_log_probs(p: Tensor, q: Tensor) -> Tensor:
    """KL(P || Q) = sum_v P_v (log P_v - log Q_v) over the last dim, from log-probs [..., V]."""
    return (p.exp() * (p - q)).sum(dim=-1)


def distilled_advantages(advantages: Tensor | None, divergence: Tensor, mask: Tensor, weight: float) -> Tensor:
    """A_iu = A_i (or A_iu) - weight * d_iu on the units in `mask` [N, U], 0 elsewhere; `advantages`
    [N] or [N, U], None for distillation alone (Tinker's per-token reverse-KL advantage, no discount)."""
    signal = -weight * divergence.float() * mask.float()
    if advantages is None:
        return signal
    base = advantages.float()
    return (base[:, None] if base.dim() == 1 else base) * mask.float() + signal
