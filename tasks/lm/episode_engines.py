"""The step of the episode loop (`episodes.py`) that differs between rollout engines: continue
each unfinished episode's whole context (prompt, earlier model turns, tool turns) with one model
turn. `HFTurns` runs one left-padded HF ``generate`` over the contexts, `VLLMTurns` one vLLM
``generate`` call (each context its own request); `turn_engine` picks the one of
`policy.rollout_engine`. Both sample each row from its own seed, stop at the policy's eos ids and
stop strings, and return the sampler's log-probs of the sampled tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch
from torch import nn
from transformers import GenerationConfig, LogitsProcessorList

from .episode_state import EpisodeState, joined_media
from .rollout_batches import eos_token_ids
from .seeded_sampler import GroupSeededSampler
from .vllm_engine import check_prompt_ids


@dataclass
class Continuation:
    """One model turn: its tokens (at most its room), their sampler log-probs (0 for greedy), and
    whether the turn ended (an eos or a stop string) within its room."""

    tokens: list[int]
    logp: list[float]
    ended: bool


class TurnEngine(Protocol):
    def continue_contexts(self, states: Sequence[EpisodeState], seeds: Sequence[int], rooms: Sequence[int],
                          greedy: bool) -> list[Continuation]:
        """The next model turn of each episode in `states`, row r sampled from `seeds[r]` with at
        most `rooms[r]` new tokens."""


def turn_engine(policy: Any) -> TurnEngine:
    return VLLMTurns(policy) if policy.cfg.rollout_engine == "vllm" else HFTurns(policy)


class HFTurns:
    """Model turns by the policy's own HF ``generate``: the contexts left-padded into one batch,
    each row drawing from a generator of its own seed (`GroupSeededSampler`)."""

    def __init__(self, policy: Any):
        self.policy = policy

    def continue_contexts(self, states: Sequence[EpisodeState], seeds: Sequence[int], rooms: Sequence[int],
                          greedy: bool) -> list[Continuation]:
        policy, cfg = self.policy, self.policy.cfg
        rows = self._context_rows(states)
        eos = policy.model.generation_config.eos_token_id or policy.tokenizer.eos_token_id
        gen_cfg = GenerationConfig(max_new_tokens=max(1, max(rooms)), do_sample=False,
                                   min_new_tokens=cfg.min_new_tokens if greedy else None,
                                   pad_token_id=policy.tokenizer.pad_token_id, eos_token_id=eos,
                                   stop_strings=cfg.stop_strings or None,
                                   suppress_tokens=policy.suppressed_tokens() or None)
        sampler = None
        if not greedy:
            sampler = GroupSeededSampler([], 1, cfg.temperature, cfg.top_k, cfg.top_p,
                                         eos_ids=[eos] if isinstance(eos, int) else list(eos or []),
                                         min_new_tokens=cfg.min_new_tokens or 0,
                                         generators=[torch.Generator().manual_seed(s) for s in seeds])
        was_training = policy.model.training
        policy.model.eval()
        with torch.inference_mode():
            sequences = policy.model.generate(
                **policy._model_inputs(rows), generation_config=gen_cfg,
                logits_processor=LogitsProcessorList([sampler] if sampler else []),
                tokenizer=policy.tokenizer if cfg.stop_strings else None)
        policy.model.train(was_training)
        new = sequences[:, rows["prompt_ids"].shape[1]:].clone().cpu()
        mask, running = policy._completion_mask(new)
        ends = torch.where(running, new.shape[1] + 1, mask.sum(1).long())  # 1 + the last token; W + 1: no end
        logp = sampler.sampled_logp(new.shape[1]) if sampler else torch.zeros(new.shape, dtype=torch.float32)
        out = []
        for r, room in enumerate(rooms):
            n = min(int(ends[r]), room)
            out.append(Continuation(new[r, :n].tolist(), logp[r, :n].tolist(), int(ends[r]) <= room))
        return out

    def _context_rows(self, states: Sequence[EpisodeState]) -> dict[str, Any]:
        """The policy's prompt inputs for each episode's whole context (prompt and turns so far),
        left-padded; per-row media joined in order."""
        ids = [torch.tensor(s.prompt_ids + s.ids) for s in states]
        width = max(len(x) for x in ids)
        left = lambda xs, v: torch.stack([nn.functional.pad(x, (width - len(x), 0), value=v) for x in xs])  # noqa: E731
        rows: dict[str, Any] = {"prompt_ids": left(ids, self.policy.tokenizer.pad_token_id),
                                "prompt_mask": left([torch.ones(len(x), dtype=torch.long) for x in ids], 0)}
        for key in states[0].prompt_keys:
            rows[f"prompt_{key}"] = left([torch.tensor(s.prompt_keys[key] + s.token_keys.get(key, [0] * len(s.ids)))
                                          for s in states], 0)
        rows.update(joined_media(list(states)))
        return rows


class VLLMTurns:
    """Model turns by the policy's colocated vLLM engine (`vllm_engine.py`, built on first use and
    sent the current weights before each call): one request per context, seeded with the row's
    seed, its token limit the row's room. A text model's context is its token ids; a vision-language
    model's is its chat text and its images (the prompt's, `EpisodeState.context_text`,
    `view.images`), which vLLM's processor expands, checked against the policy's own token ids."""

    def __init__(self, policy: Any):
        self.policy = policy

    def continue_contexts(self, states: Sequence[EpisodeState], seeds: Sequence[int], rooms: Sequence[int],
                          greedy: bool) -> list[Continuation]:
        policy, cfg = self.policy, self.policy.cfg
        if policy._vllm is None:
            policy._vllm = policy._vllm_engine()
        multimodal = hasattr(policy, "processor")
        requests = [self._request(s) if multimodal else {"prompt_token_ids": s.prompt_ids + s.ids} for s in states]
        samples = policy._vllm.complete(
            policy.model, requests, seeds, greedy=greedy, temperature=cfg.temperature, top_k=cfg.top_k,
            top_p=cfg.top_p, max_new_tokens=list(rooms), min_new_tokens=cfg.min_new_tokens,
            stop_token_ids=eos_token_ids(policy.model, policy.tokenizer), stop_strings=cfg.stop_strings,
            banned_token_ids=policy.suppressed_tokens())
        if multimodal:
            check_prompt_ids(samples, [s.prompt_ids + s.ids for s in states])
        return [Continuation(x.token_ids, x.logp, x.stopped) for x in samples]

    def _request(self, state: EpisodeState) -> dict[str, Any]:
        """The prompt's vLLM request (its chat text and media, `_vllm_prompts`) with the turns' text
        appended and the images the tools returned after the prompt's."""
        limit = self.policy.cfg.vllm.max_images_per_prompt
        if len(state.view.images) > limit:
            raise ValueError(f"an episode holds {len(state.view.images)} images, more than "
                             f"policy.vllm.max_images_per_prompt={limit} (vLLM plans for that many per prompt): raise "
                             f"it to at least the prompt's images plus policy.episode.max_images")
        request = self.policy._vllm_prompts([state.part], [state.prompt_ids])[0]
        request["prompt"] += "".join(state.context_text)
        if state.view.images:
            request["multi_modal_data"] = {**request.get("multi_modal_data", {}), "image": list(state.view.images)}
        return request
