"""LLaDA's semi-autoregressive block decoding of a masked diffusion LM, seeded per group.

The completion starts as `gen_length` mask tokens, split into blocks of `block_length` decoded
left to right (Nie et al. 2025, LLaDA, appendix B). Within a block, step s predicts every masked
position at once, x0 = argmax(z / T + Gumbel) (sampling at temperature T through the Gumbel-max
trick; T = 0 is greedy), and commits the k_s positions of highest confidence; the rest stay masked:

* ``low_confidence`` remasking: confidence = p(x0) under softmax(z);
* ``random`` remasking: confidence ~ U(0, 1).

k_s comes from the step schedule: ``uniform`` spreads the block's masks evenly over
`steps / num_blocks` steps (LLaDA). CJ-GRPO's Ascending Step-Size scheduler (Yang et al. 2025,
yjyddq/EOSER-ASS-RL) commits 1, 2, 4, ... tokens: ``ascending`` as the authors' code, S =
floor(log2 B) steps for a block of B masks, 2^s tokens at step s < S - 1 and the remainder
B - (2^(S-1) - 1) at the last; ``ascending_paper`` 1, 2, 4, ... until the block is full
(ceil(log2(B + 1)) steps, the last taking what is left), the paper's B = 2^k - 1 case exactly
(one more forward per block than the code from B = 16 on). The authors' multi-block ASS sizes its
blocks 2^p so that the global step s commits 2^s tokens; mmrl applies the schedule inside each
block of `block_length` (identical for one block, their default).

With EOS early rejection (CJ-GRPO's EOSER) the confidence of an EOS prediction is multiplied by
gamma = g + (1 - g) tau (g = `eos_min_gamma`), so the model does not close the answer early;
`eos_gamma_rule` sets tau at step s of a block:

* ``cj_grpo`` (the authors' code): under ``uniform``, tau = s / (steps - 1) with `steps` the
  completion's total, so with several blocks gamma never reaches 1 inside a block; under the
  ascending schedules, tau = (2^(s+1) - 1) / 2^S (geometric) with S the block's steps; gamma = 1
  when there is a single step;
* ``block_linear`` (mmrl's earlier rule): tau = s / (S - 1), from g at a block's first step to 1
  at its last.

The authors apply EOSER under low-confidence remasking only; mmrl also scales the random
confidences under ``random`` remasking. Classifier-free guidance (LLaDA): z = z_u + (w + 1)
(z_c - z_u), z_u from the same canvas with the prompt masked.

All noise is drawn from one generator per group (seeded from the group's seed), so a group's
completions depend on its prompt and seed only; the global RNG is never touched. Greedy decoding
(no seeds, or T = 0) takes the argmax; greedy ``random`` remasking commits left to right.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch
from torch import Tensor

REMASKING = ("low_confidence", "random")
SCHEDULES = ("uniform", "ascending", "ascending_paper")
EOS_GAMMA_RULES = ("cj_grpo", "block_linear")

# (canvas ids [B, L], attention mask [B, L], positions whose logits are wanted [K]) -> logits [B, K, V]
LogitsFn = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass
class DecodeConfig:
    gen_length: int = field(default=32, metadata={"help": (
        "Completion length in tokens (LLaDA block decoding; d1 uses 256); a multiple of block_length.")})
    block_length: int = field(default=32, metadata={"help": (
        "Tokens per semi-autoregressive block, decoded left to right (d1: 32).")})
    steps: int = field(default=32, metadata={"help": (
        "Denoising steps per completion, split evenly over the blocks with schedule uniform (d1: 128).")})
    temperature: float = field(default=1.0, metadata={"help": (
        "Sampling temperature through Gumbel noise (0: greedy).")})
    remasking: str = field(default="low_confidence", metadata={"help": (
        "Which predictions a step commits: low_confidence (the most probable, LLaDA) or random."),
        "choices": "mmrl.tasks.dlm.generation:REMASKING"})
    schedule: str = field(default="uniform", metadata={"help": (
        "Tokens committed per step: uniform (LLaDA), ascending (CJ-GRPO's code: floor(log2 B) steps of 2^s tokens, "
        "the last the remainder) or ascending_paper (the paper's 1, 2, 4, ...)."),
        "choices": "mmrl.tasks.dlm.generation:SCHEDULES"})
    cfg_scale: float = field(default=0.0, metadata={"help": (
        "Classifier-free guidance w (LLaDA): z = z_u + (w + 1)(z_c - z_u), the unconditional pass with the prompt "
        "masked; 0: off.")})
    eos_early_rejection: bool = field(default=False, metadata={"help": (
        "CJ-GRPO's EOS early rejection: an EOS prediction's confidence is scaled by gamma rising from "
        "eos_min_gamma (see eos_gamma_rule), so answers do not close early.")})
    eos_min_gamma: float = field(default=0.4, metadata={"help": (
        "EOS early rejection's scale at a block's first step, in (0, 1].")})
    eos_gamma_rule: Literal["cj_grpo", "block_linear"] = field(default="cj_grpo", metadata={"help": (
        "how the EOS early-rejection factor rises from eos_min_gamma: cj_grpo = the CJ-GRPO authors' code "
        "(linear over the completion's steps under uniform, so it stays below 1 in a block when there are "
        "several; geometric (2^(s+1) - 1) / 2^S under the ascending schedules); block_linear = linear to 1 "
        "at each block's last step (mmrl's earlier rule)")})

    def check(self) -> None:
        if self.gen_length < 1 or self.block_length < 1 or self.gen_length % self.block_length:
            raise ValueError(f"policy.gen_length={self.gen_length} must be a positive multiple of "
                             f"policy.block_length={self.block_length}")
        blocks = self.gen_length // self.block_length
        if self.schedule == "uniform" and (self.steps < blocks or self.steps % blocks):
            raise ValueError(f"policy.steps={self.steps} must be a positive multiple of the {blocks} blocks "
                             f"(gen_length / block_length)")
        if self.remasking not in REMASKING:
            raise ValueError(f"policy.remasking={self.remasking!r} is not one of {REMASKING}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"policy.schedule={self.schedule!r} is not one of {SCHEDULES}")
        if self.temperature < 0:
            raise ValueError(f"policy.temperature={self.temperature} must be >= 0")
        if not 0 < self.eos_min_gamma <= 1:
            raise ValueError(f"policy.eos_min_gamma={self.eos_min_gamma} must be in (0, 1]")
        if self.eos_gamma_rule not in EOS_GAMMA_RULES:
            raise ValueError(f"policy.eos_gamma_rule={self.eos_gamma_rule!r} is not one of {EOS_GAMMA_RULES}")


def transfer_counts(masked: int, steps: int, schedule: str) -> list[int]:
    """Tokens committed at each step of a block with `masked` masks: ``uniform`` gives
    masked // steps each, the remainder to the first steps (LLaDA); ``ascending`` 2^s at step s
    of S = floor(log2 masked) steps, the last taking the remainder (CJ-GRPO's code);
    ``ascending_paper`` 1, 2, 4, ... with the last step taking what is left."""
    if schedule == "uniform":
        base, extra = divmod(masked, steps)
        return [base + (1 if s < extra else 0) for s in range(steps)]
    if schedule == "ascending":
        n = max(masked.bit_length() - 1, 1)  # floor(log2 masked), at least one step
        return [2 ** s for s in range(n - 1)] + [masked - (2 ** (n - 1) - 1)]
    counts, left, size = [], masked, 1
    while left > 0:
        counts.append(min(size, left))
        left -= counts[-1]
        size *= 2
    return counts


def eos_gamma(cfg: DecodeConfig, step: int, block_steps: int) -> float:
    """The EOS early-rejection factor at `step` of a block decoded in `block_steps` steps."""
    low = cfg.eos_min_gamma
    if cfg.eos_gamma_rule == "block_linear":
        return low + (1 - low) * (step / max(block_steps - 1, 1))
    if cfg.schedule == "uniform":
        total = cfg.steps
        return low + (1 - low) * (min(step, total - 1) / (total - 1)) if total > 1 else 1.0
    return low + (1 - low) * (2 ** (step + 1) - 1) / 2 ** block_steps if block_steps > 1 else 1.0


def gumbel_argmax(logits: Tensor, temperature: float, uniforms: Tensor | None) -> Tensor:
    """argmax(z / T - log(-log u)) in float64 (low-precision Gumbel noise degrades MDLM samples,
    Zheng et al. 2024); plain argmax at T = 0."""
    if temperature == 0 or uniforms is None:
        return logits.argmax(dim=-1)
    z = logits.double() / temperature
    return (z - torch.log(-torch.log(uniforms.clamp_min(1e-300)))).argmax(dim=-1)


@dataclass
class DecodeTrace:
    """What block decoding drew for B rows of `gen_length` tokens (the rollout's record of its
    trajectory, which TraceRL's and AGRPO's estimators replay)."""

    ids: Tensor      # [B, W] long: the completion
    logp: Tensor     # [B, W] fp32: log softmax(z / T) of each token at the step that committed it (0: greedy)
    step: Tensor     # [B, W] long: that step's index, counted over the whole completion (block after block)
    entropy: Tensor  # [B, W] fp32: the entropy of softmax(z / T) at that step (0: greedy)

    def record(self, commit: Tensor, rows: slice, span: slice, logits: Tensor, tokens: Tensor, temperature: float,
               step: int, greedy: bool) -> None:
        """Note the tokens a step commits ([b, block] bool) in the rows `rows` and the completion's
        columns `span`."""
        self.step[rows, span] = torch.where(commit, step, self.step[rows, span])
        if greedy:
            return
        drawn = torch.log_softmax(logits.double() / temperature, dim=-1)
        logp = drawn.gather(-1, tokens[..., None]).squeeze(-1)
        self.logp[rows, span] = torch.where(commit, logp, self.logp[rows, span])
        entropy = -(drawn.exp() * drawn).sum(-1)
        self.entropy[rows, span] = torch.where(commit, entropy, self.entropy[rows, span])


@torch.no_grad()
def block_decode(logits_fn: LogitsFn, prompt_ids: Tensor, prompt_mask: Tensor, cfg: DecodeConfig,
                 mask_id: int, eos_id: int | None, seeds: Sequence[int] | None, group_size: int,
                 traced: bool = False) -> Tensor | DecodeTrace:
    """Completion ids [B, gen_length] for left-padded prompts [B, P] (rows grouped by
    `group_size`, group g drawing from `seeds[g]`; `seeds=None` decodes greedily). With `traced`,
    the `DecodeTrace`: also each token's decoding log-prob (fp32): log softmax(z / T) of the token
    at the step that committed it, z the (guided) logits of that step's canvas, i.e. the
    probability the Gumbel-max draw gave it (the choice of which positions to commit is not in
    it; 0 when decoding greedily), that step's index and its distribution's entropy."""
    cfg.check()
    device = prompt_ids.device
    rows, plen = prompt_ids.shape
    greedy = seeds is None or cfg.temperature == 0
    generators = None if seeds is None else [torch.Generator().manual_seed(int(s)) for s in seeds]
    x = torch.cat([prompt_ids, torch.full((rows, cfg.gen_length), mask_id, dtype=prompt_ids.dtype,
                                          device=device)], dim=1)
    attention = torch.cat([prompt_mask, torch.ones(rows, cfg.gen_length, dtype=prompt_mask.dtype,
                                                   device=device)], dim=1)
    prompt_tokens = prompt_mask.bool() if cfg.cfg_scale > 0 else None  # masked in CFG's unconditional pass
    num_blocks = cfg.gen_length // cfg.block_length
    zeros = torch.zeros(rows, cfg.gen_length, dtype=torch.float64, device=device)
    trace = DecodeTrace(x[:, plen:], zeros, zeros.long(), zeros.clone())
    step = 0
    for b in range(num_blocks):
        start, stop = plen + b * cfg.block_length, plen + (b + 1) * cfg.block_length
        positions = torch.arange(start, stop, device=device)
        counts = transfer_counts(cfg.block_length, cfg.steps // num_blocks, cfg.schedule)
        for s, k in enumerate(counts):
            logits = _guided_logits(logits_fn, x, attention, positions, prompt_tokens, cfg.cfg_scale, mask_id)
            for rows_of, drawing in _group_slices(rows, group_size, generators):  # the sampler's work, group by group
                group = StepGroup(rows_of, drawing, (s, len(counts)), k)
                commit, x0 = _commit(cfg, logits[rows_of], x, (start, stop), positions, group, mask_id, eos_id, greedy)
                if traced:
                    trace.record(commit, rows_of, slice(start - plen, stop - plen), logits[rows_of], x0,
                                 cfg.temperature, step, greedy)
            step += 1
    if not traced:
        return x[:, plen:]
    trace.ids, trace.logp, trace.entropy = x[:, plen:], trace.logp.float(), trace.entropy.float()
    return trace


@dataclass
class StepGroup:
    """One group's rows at a decoding step: the sampler's work is done a group at a time, so its
    float64 buffers are one group's [group_size, block, V], not the call's."""

    rows: slice                                # the group's rows of the canvas
    generators: list[torch.Generator] | None   # the group's generator (None: greedy without seeds)
    step: tuple[int, int]                      # (the step in its block, the block's steps)
    commits: int                               # tokens each row commits at this step


def _group_slices(rows: int, group_size: int, generators: list[torch.Generator] | None,
                  ) -> list[tuple[slice, list[torch.Generator] | None]]:
    """Each group's rows and generator (all rows at once where they are not in groups of `group_size`)."""
    if rows % group_size:
        return [(slice(0, rows), generators)]
    return [(slice(r, r + group_size), None if generators is None else generators[i:i + 1])
            for i, r in enumerate(range(0, rows, group_size))]


def _commit(cfg: DecodeConfig, logits: Tensor, x: Tensor, block_span: tuple[int, int], positions: Tensor,
            group: StepGroup, mask_id: int, eos_id: int | None, greedy: bool) -> tuple[Tensor, Tensor]:
    """Draw one group's predictions x0 [b, block] from its `logits` [b, block, V], commit the
    `group.commits` most confident still-masked ones into the canvas `x` (in place); (commit mask, x0)."""
    per = logits.shape[0] // (len(group.generators) if group.generators else 1)  # rows per generator
    uniforms = None if greedy else _group_uniforms(group.generators, per, logits.shape, x.device)
    x0 = gumbel_argmax(logits, cfg.temperature, uniforms)
    confidence = _confidence(cfg, logits, x0, positions, group.generators, per, group.step, eos_id)
    start, stop = block_span
    block = x[group.rows, start:stop]
    still = block == mask_id
    chosen = confidence.masked_fill(~still, float("-inf")).topk(group.commits, dim=-1).indices
    commit = torch.zeros_like(still).scatter_(1, chosen, True) & still
    x[group.rows, start:stop] = torch.where(commit, x0, block)
    return commit, x0


def _confidence(cfg: DecodeConfig, logits: Tensor, x0: Tensor, positions: Tensor,
                generators: list[torch.Generator] | None, group_size: int, step: tuple[int, int],
                eos_id: int | None) -> Tensor:
    """The remasking confidence [B, block] of the predictions `x0` at step `step` = (s, block's steps)."""
    rows = x0.shape[0]
    if cfg.remasking == "low_confidence":
        probs = torch.softmax(logits.double(), dim=-1)
        confidence = probs.gather(-1, x0[..., None]).squeeze(-1)
    elif generators is None:  # greedy random remasking: left to right
        confidence = -positions.double().expand(rows, -1).clone()
    else:
        confidence = _group_uniforms(generators, group_size, (rows, cfg.block_length), x0.device)
    if cfg.eos_early_rejection and eos_id is not None:
        gamma = eos_gamma(cfg, *step)
        confidence = torch.where(x0 == eos_id, confidence * gamma, confidence)
    return confidence


def _guided_logits(logits_fn: LogitsFn, x: Tensor, attention: Tensor, positions: Tensor,
                   prompt: Tensor | None, scale: float, mask_id: int) -> Tensor:
    if prompt is None:
        return logits_fn(x, attention, positions)
    bare = x.clone()
    bare[:, :prompt.shape[1]] = bare[:, :prompt.shape[1]].masked_fill(prompt, mask_id)
    both = logits_fn(torch.cat([x, bare]), torch.cat([attention, attention]), positions)
    cond, uncond = both.chunk(2)
    return uncond + (scale + 1) * (cond - uncond)


def _group_uniforms(generators: list[torch.Generator], group_size: int, shape: Sequence[int],
                    device: torch.device) -> Tensor:
    """U(0, 1) of `shape` (rows first), each group's rows drawn from its own generator."""
    per = (group_size, *shape[1:])
    u = torch.cat([torch.rand(per, generator=g, dtype=torch.float64) for g in generators])
    return u.to(device)
