"""Episodes: rollouts that alternate model turns and tool turns (docs/episodes.md).

An episode is still one `Rollout` row. Its completion is every token after the prompt: the
model's turns and the tool turns between them, in order. The units are those tokens; the tool
turns' have unit_mask 0, so they are context the model reads but take no part in the loss, the
KL or the aggregation. `extras["completion_context_mask"]` [N, T] marks every episode token
(attended to), `extras["completion_turn"]` [N, T] the model turn of each unit (-1: a tool token
or padding). A multimodal policy's per-token processor outputs of the tool turns are
`extras["completion_<key>"]`, and the images tools returned join the row's own per-row media
(pixel_values, image_grid_thw): each row keeps its images with their own grids.

Each turn, the unfinished episodes of the batch continue with one call of the rollout engine
over their whole contexts (`episode_engines.py`: a left-padded HF ``generate``, or one vLLM
``generate`` with a request per context); each row samples from its own seed (from its group's
seed, its place in the group and the turn), so a group's episodes depend on its prompt and seed only.
An episode ends when the model answers (a turn without a tool call), and is truncated when a
turn reaches policy.max_new_tokens, or the turn, token or image budget runs out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.core.seeding import derive_seed
from mmrl.rewards.box_frames import FRAMES

from .episode_engines import turn_engine
from .episode_state import EpisodeState, joined_media
from .rollout_batches import eos_token_ids
from .tools import EpisodeView, ToolCall, parse_tool_calls, resolve_tools, run_tool, tool_schema

EPISODE_SALT = 0xE915
TURN_MARK = "MMRL_TURN_CONTENT"  # a stand-in assistant message, to find what a template writes around it


EPISODE_COLUMNS = ("completion_ids", "tool_calls", "turns", "turn_texts")  # what an episode hands the rewards


@dataclass
class EpisodeConfig:
    tools: list[str] = field(default_factory=list, metadata={"help": (
        "Tools the model may call (episodes are on when this is not empty): built-in or registered names "
        "(zoom, crop, select_frames, python), or FILE.py:FUNCTION / module:FUNCTION for a plain typed function "
        "with a docstring. See docs/episodes.md.")})
    tool_modules: list[str] = field(default_factory=list, metadata={"help": (
        "Python files or modules imported first, whose @register_tool functions tools may then name.")})
    max_turns: int = field(default=4, metadata={"help": (
        "The most model turns of an episode; an episode still calling tools in its last turn is truncated.")})
    max_tokens: int = field(default=1024, metadata={"help": (
        "The most tokens after the prompt (model and tool turns together); reaching it truncates the episode.")})
    max_images: int = field(default=8, metadata={"help": (
        "The most images tools may return in an episode; a call that would exceed it truncates the episode.")})
    box_frame: str = field(default="image", metadata={"help": (
        "The frame the crop / zoom tools read boxes in: image (the original image's pixels), input (pixels of the "
        "image as the processor resized it, Qwen2.5-VL), normalized_1000 (0-1000, Qwen3-VL); as the iou reward's "
        "frame.")})


def episode_config_problems(cfg: EpisodeConfig) -> list[str]:
    problems = [f"policy.episode.{name}={getattr(cfg, name)} must be at least 1"
                for name in ("max_turns", "max_tokens") if getattr(cfg, name) < 1]
    if cfg.max_images < 0:
        problems.append(f"policy.episode.max_images={cfg.max_images} must be >= 0")
    if cfg.box_frame not in FRAMES:
        problems.append(f"policy.episode.box_frame={cfg.box_frame!r} is not one of {', '.join(FRAMES)}")
    return problems


class EpisodeRunner:
    """Runs the episodes of a token policy (`TokenRollouts`): it reads the policy's `cfg`,
    `model`, `tokenizer` (and `processor` for a multimodal one) and its prompt encoding."""

    def __init__(self, policy: Any):
        self.policy = policy
        cfg = policy.cfg.episode
        self.cfg = cfg
        self.tools = resolve_tools(cfg.tools, cfg.tool_modules)
        self.schemas = [tool_schema(fn, name) for name, fn in self.tools.items()]
        self.counts: Counter = Counter()
        self.engine = turn_engine(policy)

    # ----- the episode loop ------------------------------------------------------------------
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int], greedy: bool) -> Rollout:
        """1. encode the prompts; 2. run model turns and tool turns until every episode ends;
        3. the Rollout record."""
        policy = self.policy
        if policy.parallel.lockstep:
            raise ValueError(f"policy.episode: episodes do not run on sharded parameters yet "
                             f"({policy.parallel.description})")
        parts = policy._prompt_parts(prompts)
        encoded = policy._encode_parts(parts)
        policy._check_prompt_lengths(encoded["prompt_mask"], prompts)
        states = [self._start(parts[g], encoded, g, prompts[g]) for g in range(len(prompts)) for _ in range(group_size)]
        row_seeds = [derive_seed(seeds[g], EPISODE_SALT, j) for g in range(len(prompts)) for j in range(group_size)]
        for turn in range(self.cfg.max_turns):
            active = [i for i, s in enumerate(states) if not s.done]
            if not active:
                break
            self._model_turn([states[i] for i in active], [row_seeds[i] for i in active], turn, greedy)
        for s in states:
            if not s.done:
                s.stop(truncated=True)
        self._count(states)
        return self._record(prompts, group_size, policy._expand(encoded, group_size), states, greedy)

    def _start(self, part: Any, encoded: dict[str, Any], g: int, row: Any) -> EpisodeState:
        keep = encoded["prompt_mask"][g].bool()
        keys = {k[len("prompt_"):]: v[g][keep].tolist() for k, v in encoded.items()
                if k.startswith("prompt_") and k not in ("prompt_ids", "prompt_mask")}
        media = {k: [v[g]] for k, v in encoded.items() if isinstance(v, list)}
        decoded = part[1] if isinstance(part, tuple) else {}
        images = list(decoded.get("images") or [])
        view = EpisodeView(images=images, input_sizes=self._input_sizes(media.get("image_grid_thw", [None])[0], images),
                           videos=list(decoded.get("videos") or []),
                           video_metadata=list(decoded.get("video_metadata") or []),
                           row=row if isinstance(row, dict) else {}, box_frame=self.cfg.box_frame)
        return EpisodeState(encoded["prompt_ids"][g][keep].tolist(), keys, media, view, part)

    def _model_turn(self, states: list[EpisodeState], row_seeds: list[int], turn: int, greedy: bool) -> None:
        """One model turn of the unfinished episodes (by the rollout engine's `TurnEngine`), then
        their tool turns. Each row samples from a seed of its own and the turn, so no other row's
        turn lengths change its draws."""
        rooms = [min(self.policy.cfg.max_new_tokens, self.cfg.max_tokens - len(s.ids)) for s in states]
        turns = self.engine.continue_contexts(states, [derive_seed(seed, turn) for seed in row_seeds], rooms, greedy)
        tokenizer, eos_ids = self.policy.tokenizer, eos_token_ids(self.policy.model, self.policy.tokenizer)
        for s, new in zip(states, turns):
            s.append(new.tokens, 1, turn, new.logp, {})
            s.context_text.append(tokenizer.decode(new.tokens, skip_special_tokens=False))
            text = tokenizer.decode(new.tokens, skip_special_tokens=True)
            s.turn_texts.append(text)
            if not new.ended:  # the turn did not end within policy.max_new_tokens or the token budget
                s.stop(truncated=True)
                continue
            calls = parse_tool_calls(text)
            if not calls:
                s.stop(truncated=False)
            elif turn == self.cfg.max_turns - 1:
                s.stop(truncated=True)  # no turn is left to read the results
            else:
                eos_text = tokenizer.decode(new.tokens[-1:]) if new.tokens and new.tokens[-1] in eos_ids else None
                self._tool_turn(s, calls, turn, eos_text)

    def _input_sizes(self, grids: Tensor | None, images: list) -> list[list[int] | None]:
        """Each image's [width, height] as the processor resized it: its patch grid times the patch
        size (Qwen2-VL, Qwen2.5-VL, Qwen3-VL); None where the processor has no grid."""
        patch = getattr(getattr(getattr(self.policy, "processor", None), "image_processor", None), "patch_size", None)
        if grids is None or not patch or len(grids) != len(images):
            return [None] * len(images)
        return [[int(w) * patch, int(h) * patch] for _, h, w in grids.tolist()]

    # ----- tool turns ----------------------------------------------------------------------
    def _tool_turn(self, s: EpisodeState, calls: list[ToolCall], turn: int, eos_text: str | None) -> None:
        """Run the calls, then append their tool turn (mask 0) unless a budget ends the episode."""
        for call in calls:
            run_tool(call, self.tools, s.view)
            if call.images and not hasattr(self.policy, "processor"):
                call.error, call.images = "the policy takes no images", []
            s.calls.append(call.record(turn))
        images = [im for c in calls for im in c.images]
        if s.images_returned + len(images) > self.cfg.max_images:
            s.stop(truncated=True)
            return
        text, ids, keys, media = self._encode_tool_turn(calls, images, eos_text)
        if len(s.ids) + len(ids) >= self.cfg.max_tokens:
            s.stop(truncated=True)
            return
        s.append(ids, 0, -1, [0.0] * len(ids), keys)
        s.context_text.append(text)
        s.images_returned += len(images)
        s.view.images.extend(images)
        s.view.input_sizes.extend(self._input_sizes(media.get("image_grid_thw"), images))
        for key, value in media.items():
            s.media.setdefault(key, []).append(value)

    def _encode_tool_turn(self, calls: list[ToolCall], images: list, eos_text: str | None
                          ) -> tuple[str, list[int], dict[str, list[int]], dict[str, Tensor]]:
        """(text, ids, per-token processor outputs, per-row media) of the text between the model's turn and
        its next one: the end of its turn (less the eos it sampled), the tool messages, the
        generation prompt, as the chat template writes them."""
        policy = self.policy
        processor = getattr(policy, "processor", None)
        messages = [tool_message(c, processor is not None) for c in calls]
        text = tool_turn_text(processor.apply_chat_template if processor else policy.tokenizer.apply_chat_template,
                              messages, eos_text)
        if processor is None:
            return text, policy.tokenizer(text, add_special_tokens=False)["input_ids"], {}, {}
        enc = processor(text=[text], images=images or None, return_tensors="pt")
        ids = enc["input_ids"][0].tolist()
        keys = {k: v[0].tolist() for k, v in enc.items()
                if k not in ("input_ids", "attention_mask") and v.dim() == 2 and v.shape == enc["input_ids"].shape}
        media = {k: v for k, v in enc.items() if k not in keys and k not in ("input_ids", "attention_mask")}
        return text, ids, keys, media

    # ----- the record ----------------------------------------------------------------------
    def _record(self, prompts: Sequence[Any], group_size: int, rows: dict[str, Any], states: list[EpisodeState],
                greedy: bool) -> Rollout:
        policy = self.policy
        width = max(1, max(len(s.ids) for s in states))
        pad = lambda xs, v, dtype=torch.long: torch.stack([  # noqa: E731
            nn.functional.pad(torch.tensor(x, dtype=dtype), (0, width - len(x)), value=v) for x in xs])
        completion_ids = pad([s.ids for s in states], policy.tokenizer.pad_token_id)
        unit_mask = pad([s.units for s in states], 0, torch.float32)
        if policy.cfg.mask_truncated:
            unit_mask = unit_mask * torch.tensor([not s.truncated for s in states])[:, None]
        extras = {**rows, "completion_ids": completion_ids,
                  "completion_context_mask": pad([[1] * len(s.ids) for s in states], 0),
                  "completion_turn": pad([s.turn for s in states], -1)}
        for key in set(states[0].prompt_keys) | {k for s in states for k in s.token_keys}:
            extras[f"completion_{key}"] = pad([s.token_keys.get(key, [0] * len(s.ids)) for s in states], 0)
        extras.update(joined_media(states))
        return Rollout(
            group_id=torch.arange(len(prompts)).repeat_interleave(group_size),
            prompts=[policy.prompt_of(p) for p in prompts for _ in range(group_size)],
            completions=[s.turn_texts[-1] if s.turn_texts else "" for s in states],
            unit_mask=unit_mask,
            truncated=torch.tensor([s.truncated for s in states]),
            columns={"completion_ids": [[t for t, u in zip(s.ids, s.units) if u] for s in states],
                     "tool_calls": [s.calls for s in states], "turns": [len(s.turn_texts) for s in states],
                     "turn_texts": [s.turn_texts for s in states]},
            extras=extras,
            rollout_logp=None if greedy else pad([s.logp for s in states], 0.0, torch.float32) * unit_mask,
        )

    def _count(self, states: list[EpisodeState]) -> None:
        self.counts["episodes"] += len(states)
        self.counts["episode_turns"] += sum(len(s.turn_texts) for s in states)
        self.counts["truncated_episodes"] += sum(s.truncated for s in states)
        for s in states:
            for call in s.calls:
                self.counts[f"tool_calls/{call['name'] or '<unreadable>'}"] += 1
                self.counts["tool_errors"] += call["error"] is not None

    def pop_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.counts.items()}
        self.counts.clear()
        return out


def tool_message(call: ToolCall, with_media: bool) -> dict[str, Any]:
    """The chat message of one call's result (or its error)."""
    text = f"error: {call.error}" if call.error is not None else call.result
    if not with_media:
        return {"role": "tool", "content": text}
    return {"role": "tool", "content": [{"type": "image"} for _ in call.images] + [{"type": "text", "text": text}]}


def tool_turn_text(render: Callable[..., str], messages: list[dict], eos_text: str | None) -> str:
    """What the chat template writes after an assistant turn's content up to the next assistant
    turn's content, given the tool `messages` between them; less `eos_text` where the model
    sampled it as its turn's last token."""
    head = [{"role": "user", "content": "MMRL_USER"}, {"role": "assistant", "content": TURN_MARK}]
    before = render(head, tokenize=False)
    after = render(head + messages, tokenize=False, add_generation_prompt=True)
    if not after.startswith(before):
        raise ValueError("the chat template writes the turns before a tool message differently once it follows; "
                         "episodes need a template that appends each turn")
    closing = before[before.rindex(TURN_MARK) + len(TURN_MARK):]
    if eos_text and closing.startswith(eos_text):
        closing = closing[len(eos_text):]
    return closing + after[len(before):]
