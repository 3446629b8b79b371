"""LTX-2's guidance beyond CFG, combined as the stock `LTX2Pipeline` / `LTX2ImageToVideoPipeline`
call combines it (diffusers 0.42.1), and the checks of its settings. Per stream (the video over all
the model's video tokens, an image's conditioning frame included; the sound), with x0 = x - sigma v
the clean-sample estimate of a velocity v at the step's sigma:

    x0_g = x0_c + (g - 1) (x0_c - x0_u) + s (x0_c - x0_stg) + (m - 1) (x0_c - x0_iso)
    x0   = phi x0_g std(x0_c) / std(x0_g) + (1 - phi) x0_g       (std over one row's dims, torch's unbiased)
    v    = (x - x0) / sigma

c: the prompt's forward, u: the empty negative prompt's (CFG, g = `policy.guidance_scale`),
stg: the prompt's forward with the self-attention of the blocks `policy.stg_blocks` skipped (their
value projection in its place; spatio-temporal guidance, s = `policy.stg_scale`, on where s > 0),
iso: the prompt's forward without the audio-to-video and video-to-audio cross-attention (modality
isolation, m = `policy.modality_scale`, on where m > 1), phi = `policy.guidance_rescale` (Lin et
al. 2023's guidance rescale, on where phi > 0). One value of each for both streams: the stock call with
its `audio_*` settings None. The terms are part of the guided velocity: a caller asking for the
model's own velocity (the warm start, DiffusionNFT) gets it without them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from torch import Tensor


@dataclass(frozen=True)
class GuidanceTerms:
    """The guidance settings beyond CFG (`policy.stg_scale`, `stg_blocks`, `modality_scale`,
    `guidance_rescale`); their defaults switch each off."""

    stg_scale: float = 0.0
    stg_blocks: tuple[int, ...] = ()
    modality_scale: float = 1.0
    rescale: float = 0.0

    @classmethod
    def of(cls, cfg: Any) -> GuidanceTerms:
        return cls(cfg.stg_scale, tuple(cfg.stg_blocks), cfg.modality_scale, cfg.guidance_rescale)

    @property
    def on(self) -> bool:
        return self.stg_scale > 0 or self.modality_scale > 1 or self.rescale > 0


def settings_problem(cfg: Any) -> str | None:
    """What is wrong in the settings whatever the model (None: nothing)."""
    terms = GuidanceTerms.of(cfg)
    if terms.stg_scale < 0 or terms.modality_scale < 1 or not 0 <= terms.rescale <= 1:
        return (f"policy.stg_scale={terms.stg_scale}, policy.modality_scale={terms.modality_scale}, "
                f"policy.guidance_rescale={terms.rescale}: need stg_scale >= 0 (0 off), modality_scale >= 1 (1 off) "
                "and guidance_rescale in [0, 1] (0 off)")
    if (terms.stg_scale > 0) != bool(terms.stg_blocks):
        return (f"policy.stg_scale={terms.stg_scale} with policy.stg_blocks={list(terms.stg_blocks)}: spatio-temporal "
                "guidance needs both a scale above 0 and the blocks whose self-attention it skips (the stock call's "
                "spatio_temporal_guidance_blocks, e.g. [28] for LTX-2.3)")
    if terms.on and not cfg.classifier_free_guidance:
        return ("policy.stg_scale, policy.modality_scale and policy.guidance_rescale are terms of the guided velocity; "
                "policy.classifier_free_guidance is false (set it true; guidance_scale 1 gives them without CFG)")
    return None


def blocks_problem(terms: GuidanceTerms, transformer: dict) -> str | None:
    """What in `terms` the transformer of config `transformer` cannot take (None: nothing)."""
    if terms.stg_scale <= 0:
        return None
    layers = transformer.get("num_layers")
    if layers is not None and (bad := [b for b in terms.stg_blocks if not 0 <= b < layers]):
        return (f"policy.stg_blocks={list(terms.stg_blocks)}: block(s) {bad} out of range: the transformer has "
                f"{layers} blocks (0 to {layers - 1}); the stock call would skip none of them silently")
    if not transformer.get("perturbed_attn", False):
        return (f"policy.stg_scale={terms.stg_scale}: the transformer's config has perturbed_attn false, so no block's "
                "self-attention can be skipped and spatio-temporal guidance would change nothing (a checkpoint "
                "built with perturbed_attn true takes it)")
    return None


def rescaled(guided: Tensor, cond: Tensor, phi: float) -> Tensor:
    """Guided estimates [B, ...] rescaled toward the std of the conditional ones [B, ...] (each row's
    over its dims), mixed with themselves at 1 - phi."""
    dims = list(range(1, guided.dim()))
    ratio = cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True)
    return phi * ratio * guided + (1 - phi) * guided


def guided_streams(x: Sequence[Tensor], cond: Sequence[Tensor], uncond: Sequence[Tensor] | None,
                   stg: Sequence[Tensor] | None, isolated: Sequence[Tensor] | None, sigma: float | Tensor,
                   guidance_scale: float, terms: GuidanceTerms) -> list[Tensor]:
    """The guided velocity of each stream (module docstring) from its latents x [B, ...] and the
    velocities [B, ...] of the forwards: the prompt's, the negative prompt's (None: no CFG), the
    STG forward's and the isolated forward's (None: off)."""
    out = []
    for i, latents in enumerate(x):
        x0_c = latents - sigma * cond[i]
        x0 = x0_c
        if uncond is not None:
            x0 = x0 + (guidance_scale - 1) * (x0_c - (latents - sigma * uncond[i]))
        if stg is not None:
            x0 = x0 + terms.stg_scale * (x0_c - (latents - sigma * stg[i]))
        if isolated is not None:
            x0 = x0 + (terms.modality_scale - 1) * (x0_c - (latents - sigma * isolated[i]))
        if terms.rescale > 0:
            x0 = rescaled(x0, x0_c, terms.rescale)
        out.append((latents - x0) / sigma)
    return out
