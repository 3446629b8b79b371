"""Prefix Grouper (github.com/johncaged/PrefixGrouper): the log-prob forward of a group's
completions runs the shared prompt prefix once instead of once per completion.

The rows of a micro-batch that share a prompt (same `group_id`, same prompt ids, both auxiliary or
neither: T-GRPO's auxiliary rows see the group's video with its frames shuffled) become one
sequence ``[prefix; c_1; ...; c_k]`` (each completion cut to its unit count). A 4D attention mask
lets a prefix token see the prefix causally and completion token t of c_i see the whole prefix
and c_i[:t+1] only, and each completion's positions continue from the prefix (the position the
model gives the token after the prefix: text positions, or a multimodal rotary index such as
Qwen2.5-VL's). Every completion token then sees exactly the keys, values and positions it sees in
its own row of the plain forward, so log-probs and gradients are the plain path's (up to float
summation order), while the prefix's activations are computed and stored once per group:
tokens run drop from ``k (P + C)`` to ``P + k C``.

The mask goes through the model's own attention (SDPA: boolean, eager: additive float; a
``{"full_attention", "sliding_attention"}`` dict when the model has sliding-window layers);
attention implementations that take no dense mask (flash attention, flex attention) are not
supported, nor are models whose prompts attend bidirectionally in places (Gemma 3's image
blocks, PaliGemma's prefix): for those the adapters fall back to the plain forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PREFIX, PADDING = -1, -2  # segment ids of prefix tokens and of padding; completions use their row
SHARED_ATTENTION = ("sdpa", "eager")
AUTO_TOKEN_RATIO = 0.5


def prompt_groups(group_id: Tensor, prompt_ids: Tensor, auxiliary: Tensor | None = None) -> list[list[int]]:
    """Row indices of each prompt in a micro-batch, in order of first appearance: rows with the
    same group id and the same prompt ids (a micro-batch may hold several groups or part of one),
    and the same `auxiliary` flag (`Rollout.auxiliary`: a group's auxiliary rows share their own
    media, not the group's, under the same prompt ids)."""
    flags = auxiliary.tolist() if auxiliary is not None else [False] * len(group_id)
    groups: dict[tuple, list[int]] = {}
    for i, (g, ids, aux) in enumerate(zip(group_id.tolist(), prompt_ids.tolist(), flags)):
        groups.setdefault((g, aux, tuple(ids)), []).append(i)
    return list(groups.values())


def completion_lengths(completion_mask: Tensor) -> Tensor:
    """Units per row; the mask must mark a prefix of each completion (ones up to the end)."""
    lengths = completion_mask.sum(1).long()
    width = completion_mask.shape[1]
    expected = (torch.arange(width, device=completion_mask.device)[None, :] < lengths[:, None])
    if not torch.equal(completion_mask.bool(), expected):
        raise ValueError("unit_mask must mark a prefix of each completion (ones, then zeros) for "
                         "prefix sharing")
    return lengths


def token_counts(prompt_mask: Tensor, lengths: Tensor, groups: list[list[int]]) -> tuple[int, int]:
    """(tokens of the plain forward, tokens of the shared forward) for a micro-batch whose
    prompts are left-padded to the same width and whose completions are cut to the longest."""
    width = int(prompt_mask.any(0).sum())
    longest = max(int(lengths.max()), 1)
    plain = len(lengths) * (width + longest)
    region = max(sum(max(int(lengths[r]), 1) for r in rows) for rows in groups)
    return plain, len(groups) * (width + region)


def worth_sharing(prompt_mask: Tensor, lengths: Tensor, groups: list[list[int]]) -> bool:
    """`prefix_sharing: auto`: share when the shared forward runs at most AUTO_TOKEN_RATIO of the
    plain forward's tokens. Measured by scripts/bench_prefix.py (tiny Qwen2, G 8, completions of
    64, CPU): the shared training pass breaks even at a token ratio of about 0.6-0.7 (prompts of
    32-64 tokens) and takes 0.63-0.75 of the plain time at 0.42 (128 tokens; three runs). 0.5
    keeps a margin for what the token count leaves out: the dense mask's attention over all of a
    group's completions, and plain rows' access to mask-free (flash) attention kernels on GPU."""
    plain, shared = token_counts(prompt_mask, lengths, groups)
    return shared <= AUTO_TOKEN_RATIO * plain


@dataclass
class SharedLayout:
    """Where every token of the shared sequences sits. S sequences (one per prompt group) of
    T = W + R tokens: the prefixes, left-padded to W, then each group's completions, right-padded
    to R."""

    input_ids: Tensor    # [S, T]
    valid: Tensor        # [S, T] a real token (a key others may attend to)
    segment: Tensor      # [S, T] PREFIX, PADDING, or the micro-batch row the completion token belongs to
    offset: Tensor       # [S, T] index of a completion token within its completion (0 for prefix / padding)
    plain_index: Tensor  # [S, T] the token's index in its row of the plain forward (sliding windows)
    row_group: Tensor    # [N] the sequence each micro-batch row sits in
    gather: Tensor       # [N, C] for units t >= 1: index into the flattened [S, R] predictions of the region
    width: int           # W
    region: int          # R

    @classmethod
    def build(cls, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, lengths: Tensor,
              groups: list[list[int]], pad_id: int) -> "SharedLayout":
        """`prompt_ids` / `prompt_mask` [S, W] hold one left-padded prompt per group;
        `completion_ids` [N, C] and `lengths` [N] the micro-batch's rows."""
        s, width = prompt_ids.shape
        n, c = completion_ids.shape
        spans = [max(int(lengths[r]), 1) for r in range(n)]  # an empty completion keeps one masked slot
        region = max(sum(spans[r] for r in rows) for rows in groups)
        total = width + region
        input_ids = torch.full((s, total), pad_id, dtype=completion_ids.dtype)
        input_ids[:, :width] = prompt_ids
        valid = torch.zeros(s, total, dtype=torch.bool)
        valid[:, :width] = prompt_mask.bool()
        segment = torch.full((s, total), PADDING, dtype=torch.long)
        segment[:, :width] = PREFIX
        offset = torch.zeros(s, total, dtype=torch.long)
        plain_index = torch.arange(total).repeat(s, 1)
        row_group = torch.zeros(n, dtype=torch.long)
        gather = torch.zeros(n, c, dtype=torch.long)
        for g, rows in enumerate(groups):
            start = width
            for r in rows:
                span, t = spans[r], torch.arange(spans[r])
                cols = slice(start, start + span)
                input_ids[g, cols] = completion_ids[r, :span]
                valid[g, cols] = t < lengths[r]
                segment[g, cols] = r
                offset[g, cols] = t
                plain_index[g, cols] = width + t
                # unit t >= 1 is predicted at the completion's token t - 1 (region column start - W + t - 1);
                # unit 0 at the prefix's last token, shared by the group
                row_group[r] = g
                gather[r, 1:span] = g * region + start - width + t[1:] - 1
                start += span
        return cls(input_ids, valid, segment, offset, plain_index, row_group, gather, width, region)

    def next_ids(self) -> Tensor:
        """[S, R] the token after each region token (what its logit predicts; 0 past the end)."""
        after = self.input_ids[:, self.width + 1:]
        return torch.cat([after, after.new_zeros(after.shape[0], 1)], dim=1)

    def place(self, prefix_values: Tensor) -> Tensor:
        """A per-token prefix input [S, W] laid out over the shared sequences [S, T] (0 after it)."""
        out = prefix_values.new_zeros((prefix_values.shape[0], self.width + self.region))
        out[:, :self.width] = prefix_values
        return out

    def positions(self, prefix_positions: Tensor) -> Tensor:
        """Position ids [..., S, T] from the prefix's positions [..., S, W + 1] (the last column:
        the position the model gives the token that follows the prefix, so completion token t of
        every completion sits at that position + t)."""
        after = prefix_positions[..., self.width:self.width + 1]
        out = after + self.offset.to(prefix_positions.device)
        return torch.cat([prefix_positions[..., :self.width], out[..., self.width:]], dim=-1)

    def attention_mask(self, text_config, dtype: torch.dtype, device: torch.device) -> Tensor | dict:
        """The 4D mask [S, 1, T, T] in the form the model's attention implementation takes."""
        seg, valid = self.segment.to(device), self.valid.to(device)
        total = seg.shape[1]
        pos = torch.arange(total, device=device)
        causal = pos[None, :] <= pos[:, None]
        keys = (seg[:, None, :] == PREFIX) | (seg[:, None, :] == seg[:, :, None])
        allowed = causal[None] & valid[:, None, :] & keys
        allowed |= torch.eye(total, dtype=torch.bool, device=device)[None]  # no query row fully masked
        masks = {"full_attention": allowed}
        layer_types = set(getattr(text_config, "layer_types", None) or ["full_attention"])
        if "sliding_attention" in layer_types:
            index = self.plain_index.to(device)
            near = (index[:, :, None] - index[:, None, :]) < text_config.sliding_window
            masks["sliding_attention"] = allowed & near
        if text_config._attn_implementation == "eager":
            masks = {k: torch.zeros(m.shape, dtype=dtype, device=device).masked_fill(~m, torch.finfo(dtype).min)
                     for k, m in masks.items()}
        masks = {k: m[:, None] for k, m in masks.items()}
        return masks if len(masks) > 1 else masks["full_attention"]


# model families whose prompts attend bidirectionally in places (image blocks, the whole prefix):
# transformers builds their masks with block ids / `or_mask_function`, which a custom 4D mask
# replaces, so they keep the plain forward
BIDIRECTIONAL_PROMPT_MODELS = frozenset({"gemma3", "gemma4", "gemma4_unified", "paligemma", "molmo2", "git",
                                         "hrm_text", "deepseek_ocr2", "unlimited_ocr"})


def unsupported_reason(config) -> str | None:
    """Why a model (its top-level config) cannot take the shared-prefix mask (None when it can)."""
    text_config = config.get_text_config(decoder=True)
    if getattr(config, "model_type", None) in BIDIRECTIONAL_PROMPT_MODELS:
        return f"{config.model_type} attends bidirectionally inside prompts, which the shared-prefix mask does not"
    if getattr(text_config, "use_bidirectional_attention", False) or not getattr(text_config, "is_causal", True):
        return "the model's attention is not causal"
    impl = getattr(text_config, "_attn_implementation", None)
    if impl not in SHARED_ATTENTION:
        return f"attention implementation {impl!r} takes no dense 4D mask (supported: {SHARED_ATTENTION})"
    other = set(getattr(text_config, "layer_types", None) or []) - {"full_attention", "sliding_attention"}
    if other:
        return f"layer types {sorted(other)} have no shared-prefix mask"
    return None
