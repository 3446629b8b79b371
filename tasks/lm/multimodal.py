"""Multimodal language models as policies (shared by the vision and audio adapters): one unit
per completion token, images or audio in the prompt.

Each prompt is processed on its own (chat template with one slot per image or clip, then the
model's processor), so a row's inputs never depend on the other rows of a batch; the
per-token processor outputs (``mm_token_type_ids``, ``token_type_ids``) are left-padded with the
ids, the others (``pixel_values``, ``image_grid_thw``, ...) are kept per prompt and joined for each
batch. Generation and the completion log-probs see exactly the same processor outputs; the
multimodal rotary positions are computed by the model from ids, grids and attention mask.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.data.chat import split_placeholders
from mmrl.errors import UserError

from ..model_loading import DTYPES, load_tiny
from .causal_lm import CausalLMConfig, CausalLMPolicy
from .chat_prompts import with_system_prompt
from .prefix_sharing import SharedLayout
from .vllm_engine import VLLMEngine

TOKEN_KEYS = ("input_ids", "attention_mask")
# times, not features: kept in fp32 (in bf16, 0.8 s per grid becomes 0.8008 and shifts Qwen2.5-VL's
# rotary time positions away from what the model was trained with)
FP32_KEYS = ("second_per_grid_ts",)
# the processor inputs of `_media` that vLLM rollouts pass on (an audio input is not among them)
VLLM_MEDIA = ("images", "videos", "video_metadata", "videos_kwargs")


class MultimodalPolicy(CausalLMPolicy):
    """Subclasses say how a model is loaded (`_load_pretrained`) and what media a row carries
    (`_media`)."""
    rollout_engines = ("hf",)  # vLLM rollouts: text models and the vlm adapter (tasks/lm/vllm_engine.py)

    @classmethod
    def prompt_check(cls, cfg: CausalLMConfig):
        """None: the processor's chat template (not the tokenizer's) writes every prompt."""
        return None

    @classmethod
    def memory_model(cls, cfg: CausalLMConfig, prompt_length: int):
        """Refused unless a subclass models its media encoder (the vlm's, the audio LM's): the causal
        LM's formula it inherits would leave out the encoder's activations and the media tokens."""
        raise UserError(f"mmrl plan: the adapter {cls.__name__} (a decoder with a media encoder) has no memory "
                        "formula yet; its memory is not planned")

    def _load(self, cfg: CausalLMConfig) -> None:
        if cfg.model.startswith("tiny:"):
            self.model, self.processor = load_tiny(cfg.model, cfg.tiny_args, cfg.dtype, cfg.attn_implementation)
        else:
            self._load_pretrained(cfg)
        self.tokenizer = self.processor.tokenizer

    @abstractmethod
    def _load_pretrained(self, cfg: CausalLMConfig) -> None:
        """Set `model` and `processor` with `from_pretrained(cfg.model)`."""

    @abstractmethod
    def _media(self, row: Any) -> tuple[list[dict], dict[str, Any]]:
        """(chat content items, one per image or clip; keyword inputs of the processor)."""

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)
        self.processor.save_pretrained(path)

    def suppressed_tokens(self) -> list[int]:
        """The multimodal placeholder tokens (image / video / audio pads, vision start and end):
        sampled inside a completion they would be read as slots for features that do not exist."""
        cfg = self.model.config
        names = [k for k in cfg.to_dict() if k.endswith(("_token_id", "_token_index")) and
                 any(m in k for m in ("image", "video", "vision", "audio"))]
        return sorted({int(getattr(cfg, k)) for k in names if isinstance(getattr(cfg, k), int)})

    def _prompt_parts(self, prompts: Sequence[Any]) -> list[tuple[str, dict[str, Any]]]:
        """Each prompt's chat text and media, read and decoded once (`_chat_and_media`)."""
        return [self._chat_and_media(row) for row in prompts]

    def _encode_parts(self, parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        return encode_prompt_parts(self.processor, self.tokenizer.pad_token_id, parts)

    def _chat_and_media(self, row: Any) -> tuple[str, dict[str, Any]]:
        """A row's prompt as chat text (one slot per medium) and the processor's media inputs."""
        content, media = self._media(row)
        messages = with_system_prompt(place_media(self.prompt_of(row), content), self.cfg.system_prompt)
        tools = self._episodes.schemas if self._episodes else None
        return self.processor.apply_chat_template(messages, tools=tools, tokenize=False,
                                                  add_generation_prompt=True), media

    def _vllm_engine(self) -> VLLMEngine:
        cfg = self.cfg
        return VLLMEngine(cfg.vllm, self.model, DTYPES[cfg.dtype], self.device, processor=self.processor,
                          parallel=self.parallel)

    def _vllm_prompts(self, parts: list[tuple[str, dict[str, Any]]], prompt_ids: list[list[int]]) -> list:
        """vLLM prompts: each row's chat text with its images and videos, which vLLM's copy of the
        processor expands as the policy's does (the engine checks the token ids agree). A video is
        its sampled frames with their metadata (source fps and frame indices, from which Qwen2.5-VL
        takes its time positions), and the processor gets the policy's video options (no second
        frame sampling, the frame size bounds)."""
        requests = []
        for chat, media in parts:
            others = sorted(k for k, v in media.items() if v is not None and k not in VLLM_MEDIA)
            if others:
                raise ValueError(f"policy.rollout_engine=vllm takes images and videos; a row has {', '.join(others)}")
            limits = self.cfg.vllm
            for key, most, setting in (("images", limits.max_images_per_prompt, "max_images_per_prompt"),
                                       ("videos", limits.max_videos_per_prompt, "max_videos_per_prompt")):
                if len(media.get(key) or ()) > most:
                    raise ValueError(f"a prompt has {len(media[key])} {key}, more than policy.vllm.{setting}={most} "
                                     f"(vLLM plans for that many per prompt): raise it (prompt ending {chat[-120:]!r})")
            data: dict[str, Any] = {}
            if media.get("images"):
                data["image"] = media["images"]
            if media.get("videos"):
                data["video"] = [(frames, asdict(meta)) for frames, meta in zip(media["videos"], media["video_metadata"])]
            request: dict[str, Any] = {"prompt": chat}
            if data:
                request["multi_modal_data"] = data
            if media.get("videos_kwargs"):
                request["mm_processor_kwargs"] = {"videos_kwargs": media["videos_kwargs"]}
            requests.append(request)
        return requests

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """As the text adapter's; a part whose prompts lack a per-prompt input that another part
        has (no video among them) gets 0 rows of it for each row."""
        empty = {k: v[0][:0] for p in parts for k, v in p.extras.items() if isinstance(v, list) and v}
        filled = [replace(p, extras={**{k: [e] * len(p) for k, e in empty.items()}, **p.extras}) for p in parts]
        return super().concat(filled)

    def _model_inputs(self, rows: dict[str, Any], completion_ids: Tensor | None = None,
                      completion_mask: Tensor | None = None) -> dict[str, Tensor]:
        inputs = super()._model_inputs(rows, completion_ids, completion_mask)
        inputs.pop("position_ids", None)  # multimodal rotary positions come from ids, grids and mask
        width = 0 if completion_ids is None else completion_ids.shape[1]
        for key, value in rows.items():
            if key.startswith("prompt_") and key not in ("prompt_ids", "prompt_mask"):
                name = key[len("prompt_"):]
                tail = rows.get(f"completion_{name}")  # an episode's tool turns: their own values
                tail = value.new_zeros(value.shape[0], width) if tail is None else tail[:, :width]
                inputs[name] = torch.cat([value, tail.to(value.dtype)], 1).to(self.device)
        inputs.update(self._joined(rows))
        return inputs

    def _joined(self, prefix: dict[str, Any]) -> dict[str, Tensor]:
        """The per-prompt processor outputs of `prefix` (one entry per prompt) joined for a batch."""
        device, dtype = self.device, next(self.model.parameters()).dtype
        out = {}
        for key, value in prefix.items():
            if key.startswith(("prompt_", "completion_")):
                continue
            joined = torch.cat(list(value), dim=0).to(device)
            if len(joined):  # else no row of the batch has this input
                out[key] = joined.to(dtype) if joined.is_floating_point() and key not in FP32_KEYS else joined
        return out

    def _shared_model_inputs(self, prefix: dict[str, Any], layout: SharedLayout) -> dict[str, Tensor]:
        inputs = super()._shared_model_inputs(prefix, layout)
        for key, value in prefix.items():
            if key.startswith("prompt_") and key not in ("prompt_ids", "prompt_mask"):
                inputs[key[len("prompt_"):]] = layout.place(value).to(self.device)
        inputs.update(self._joined(prefix))
        return inputs

    def _prefix_positions(self, prefix: dict[str, Any]) -> Tensor:
        """Multimodal rotary positions [3, S, W + 1] from the model's own `get_rope_index` (Qwen2-VL,
        Qwen2.5-VL, Qwen3-VL: images and videos alike) over each prompt plus one text token;
        text positions for models without one."""
        rope_index = next((m.get_rope_index for m in self.model.modules() if hasattr(m, "get_rope_index")), None)
        if rope_index is None or "prompt_mm_token_type_ids" not in prefix:
            return super()._prefix_positions(prefix)
        device = self.device
        extend = lambda x, v: torch.cat([x, torch.full_like(x[:, :1], v)], 1).to(device)  # noqa: E731
        per_token = {k[len("prompt_"):]: extend(v, 0) for k, v in prefix.items()
                     if k.startswith("prompt_") and k not in ("prompt_ids", "prompt_mask")}
        positions, _ = rope_index(extend(prefix["prompt_ids"], self.tokenizer.pad_token_id),
                                  attention_mask=extend(prefix["prompt_mask"], 1), **per_token,
                                  **self._joined(prefix))
        return positions


def encode_prompt_parts(processor: Any, pad_token_id: int, parts: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Each prompt's chat text and media through `processor` on its own, joined: ids and mask
    (`prompt_ids`, `prompt_mask`) and the per-token outputs (`prompt_<key>`) left-padded, the
    per-prompt outputs (pixel values, grids) as one tensor per prompt (0 rows for a prompt without)."""
    per_token: dict[str, list[Tensor]] = {}
    per_prompt: dict[str, dict[int, Tensor]] = {}
    ids = []
    for i, (chat, media) in enumerate(parts):
        enc = processor(text=[chat], return_tensors="pt", **media)
        ids.append(enc["input_ids"][0])
        for key, value in enc.items():
            if key in TOKEN_KEYS:
                continue
            if value.dim() == 2 and value.shape == enc["input_ids"].shape:
                per_token.setdefault(key, []).append(value[0])
            else:
                per_prompt.setdefault(key, {})[i] = value
    width = max(len(x) for x in ids)
    left_pad = lambda xs, v: torch.stack([nn.functional.pad(x, (width - len(x), 0), value=v)  # noqa: E731
                                          for x in xs])
    out: dict[str, Any] = {
        "prompt_ids": left_pad(ids, pad_token_id),
        "prompt_mask": left_pad([torch.ones_like(x) for x in ids], 0),
    }
    out.update({f"prompt_{k}": left_pad(v, 0) for k, v in per_token.items()})
    for key, values in per_prompt.items():  # a prompt without this input (no video, ...) gets 0 rows of it
        empty = next(iter(values.values()))[:0]
        out[key] = [values.get(i, empty) for i in range(len(parts))]
    return out


def column_values(row: Any, column: str) -> list:
    """A row's value(s) in `column` as a list (none when absent)."""
    if not isinstance(row, dict) or row.get(column) is None:
        return []
    value = row[column]
    return list(value) if isinstance(value, (list, tuple)) else [value]


def place_media(prompt: Any, media: list[dict]) -> list[dict]:
    """Chat messages for a prompt (a string, or a list of {"role", "content"} messages) and its
    media items ({"type": "image"}, ...): each ``<image>`` / ``<video>`` / ``<audio>`` placeholder
    (LLaVA-style data) takes the row's next item of its kind, where the text puts it; items
    without a placeholder go before the first user turn's text (where Qwen-VL's template
    expects them). More placeholders than media is an error."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    queues: dict[str, list[dict]] = {}
    for item in media:
        queues.setdefault(item["type"], []).append(item)
    for m in messages:
        if isinstance(m["content"], str):
            items = split_placeholders(m["content"])
            for k, item in enumerate(items):
                if item["type"] != "text":
                    if not queues.get(item["type"]):
                        raise ValueError(f"the prompt has more <{item['type']}> placeholders than the row has "
                                         f"{item['type']}s: {m['content'][:80]!r}")
                    items[k] = queues[item["type"]].pop(0)
            m["content"] = items
    first_user = next(k for k, m in enumerate(messages) if m["role"] == "user")
    rest = [item for queue in queues.values() for item in queue]
    messages[first_user]["content"] = rest + messages[first_user]["content"]
    return messages
