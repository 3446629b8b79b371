"""The adapter contract: a model seen as a policy over action units (docs/architecture.md)."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import torch
from torch import Tensor, nn

from mmrl.config.parse import from_dict
from mmrl.config.rollouts import adapter_policy
from mmrl.config.sections import TrainConfig
from mmrl.core.media import Medium, medium
from mmrl.core.memory_model import MemoryModel
from mmrl.core.parallel import ParallelView
from mmrl.core.rollout import Rollout
from mmrl.core.score_hooks import ScoreHooks
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS


class Policy(ScoreHooks, ABC):
    """A task adapter. Subclasses set `Config` (a dataclass typed from the recipe's `policy:`
    section) and `model` (the module the optimizer trains), and implement `rollout` and
    `logprobs`. The engine applies LoRA, keeps the reference, and does everything else."""

    Config: ClassVar[type]
    # `Config` fields a training stage may change between steps (see `apply_stage_settings`)
    stage_fields: ClassVar[frozenset[str]] = frozenset()
    model: nn.Module
    prompt_column: str = "prompt"  # set by the engine from `data.prompt_column`
    # what the adapter may know of the distribution, set by the engine (`use_parallel`): with
    # `parallel.lockstep` every process must run as many forward passes as the others in a rollout
    # (sharded parameters are gathered layer by layer from all processes in every forward), so an
    # adapter whose number of forwards depends on its samples (generation that stops at eos) keeps
    # running forwards until every process is done (transformers' `synced_gpus`)
    parallel: ParallelView = ParallelView()

    def use_parallel(self, view: ParallelView) -> None:
        """Called once by the engine before the first rollout."""
        self.parallel = view

    @property
    def rollout_runs_model(self) -> bool:
        """Whether `rollout` runs `model` itself (True), or an engine of its own that is sent the
        weights (a vLLM engine). Under a strategy that shards the parameters, the engine gathers them
        for the rollouts only for the former: the latter's weight sync gathers one shard unit at a time."""
        return True

    @abstractmethod
    def rollout(self, prompts: Sequence[Any], group_size: int, seeds: Sequence[int],
                greedy: bool = False) -> Rollout:
        """Sample `group_size` completions for each prompt (a data-set row, a dict the adapter reads
        `prompt_column` and its media from, or the bare prompt), under no grad. Group `g` must be a
        function of `prompts[g]` and `seeds[g]` alone (rollouts do not depend on how groups are spread
        over processes). Rows are ordered group by group (a group's block may hold auxiliary rows,
        `Rollout.auxiliary`); `Rollout.prompts` holds the prompt as the rewards should see it."""

    @classmethod
    def unit_terms(cls, cfg: Any) -> str:
        """What a unit gives the objective under adapter config `cfg` (`Objective.unit_terms`):
        'logprobs', 'implicit_velocity' (DiffusionNFT's units, `implicit_velocity_losses`) or
        'logprob_bounds' (a lower and an upper bound of each unit's log-likelihood term, SPG's,
        `logprob_bounds`)."""
        return "logprobs"

    def logprob_bounds(self, model: nn.Module, batch: Rollout,
                       units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """A lower and an upper bound term [B, u] (fp32, under grad) of each unit's log-likelihood
        (an adapter whose `unit_terms` is 'logprob_bounds' implements it)."""
        raise NotImplementedError(f"{type(self).__name__} has no log-likelihood bounds")

    def unit_weights(self, batch: Rollout, units: slice = slice(None)) -> Tensor | None:
        """Monte Carlo weights [B, u] of the units the batch's current update pass trains, for an
        adapter that trains a random sample of its units per pass (a masked diffusion LM's AGRPO
        draws denoising steps): each unit's loss is multiplied by its weight, and a weight of 0 leaves
        the unit out of the pass (its log-prob is not computed). None: every unit, weight 1."""
        return None

    def implicit_velocity_losses(self, model: nn.Module, batch: Rollout, units: slice, beta: float,
                                 reference: Callable[[], AbstractContextManager[nn.Module]] | None = None
                                 ) -> tuple[Tensor, Tensor, Tensor | None]:
        """DiffusionNFT's positive and negative losses [B, u] of each unit under grad, the old
        policy being `model` at the step's start, and with `reference` the velocity KL [B, u]
        (an adapter whose `unit_terms` is 'implicit_velocity' implements it)."""
        raise NotImplementedError(f"{type(self).__name__} has no implicit-velocity units")

    @classmethod
    def step_scale_problem(cls, cfg: Any) -> str | None:
        """Why the adapter under config `cfg` has no `step_scales` (None: it has them)."""
        return f"the {cls.__name__} adapter has no per-step scales"

    def step_scales(self, batch: Rollout, units: slice) -> tuple[Tensor, Tensor]:
        """(ratio scale, loss scale) [B, u] of each unit for `algorithm.ratio_norm: grpo_guard`: a
        denoising step's std and 1 / |dt|."""
        raise NotImplementedError(f"{type(self).__name__} has no per-step scales")

    @classmethod
    def model_configuration(cls, cfg: Any) -> Any:
        """The model's configuration without its weights (a transformers config, a pipeline's component
        configurations: from the tiny builder, a path's or hub id's config files), for `mmrl plan`."""
        raise UserError(f"{cls.__name__} gives no model configuration without loading its weights")

    @classmethod
    def memory_model(cls, cfg: Any, prompt_length: int) -> MemoryModel:
        """The memory formula of this adapter's model for `mmrl plan` (mmrl/core/memory_model.py), its
        prompts at most `prompt_length` long (tokens); an adapter without one is refused by name."""
        raise UserError(f"mmrl plan: the adapter {cls.__name__} has no memory formula yet; its memory is not planned")

    @classmethod
    def config_problems(cls, cfg: Any) -> list[str]:
        """What is wrong with `cfg` (this adapter's `Config`) that is known without loading a model,
        one message per problem naming ``policy.<field>``; the engine checks it with the whole recipe
        before anything loads."""
        return []

    # whether the engine may build this adapter in another process to generate (a rollout worker or server)
    runs_in_rollout_worker: bool = False
    # whether one backward may leave some trained parameters without a gradient (a model routing each input to one of its parts)
    partial_backward: bool = False
    # why `optim.lora` may not wrap this adapter's whole model (None: it may), refused before anything loads
    engine_lora_refused: str | None = None

    @classmethod
    def rollout_worker_problem(cls, policy: dict) -> str | None:
        """What in the policy section keeps the rollouts out of a rollout worker or server (None: nothing)."""
        return None

    @classmethod
    def group_size_problems(cls, cfg: Any, group_size: int) -> list[str]:
        """What in `cfg` (this adapter's `Config`) does not fit `algorithm.group_size`, known without
        a model (e.g. a tree of rollouts whose leaves are the group); checked with `config_problems`."""
        return []

    def parameter_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]] | None:
        """`model`'s optimizer groups ``{"params", "lr"}`` for parts trained at their own rates (`lr`: optim.lr;
        the schedule scales each alike); None (default): every trained parameter at `lr`."""
        return None

    def unit_clip(self, batch: Rollout, units: slice, eps: tuple[float, float]) -> tuple[Tensor, Tensor] | None:
        """(eps_low, eps_high) [B, u] of each unit for units clipped at their own ranges (a composite's
        parts), `eps` the recipe's; None (default): every unit at `eps`."""
        return None

    @property
    def max_units(self) -> int | None:
        """The most units a rollout can have (Dr. GRPO's constant normaliser); None if unbounded."""
        return None

    @classmethod
    def media_columns(cls, cfg: Any) -> dict[str, Callable[[Any], None]]:
        """The data columns that hold media under adapter config `cfg`, each with a check that
        raises `mmrl.data.RowError` when a value cannot be read (reading as little as it can:
        headers). Before the model loads, the engine makes relative paths in these columns
        absolute (`data.media_root` or the data file's directory) and checks every row with them."""
        return {}

    @classmethod
    def required_columns(cls, cfg: Any) -> dict[str, str]:
        """The data columns every row must have under adapter config `cfg` (column -> what needs
        it, e.g. the image a prompt is conditioned on), checked with the data before the model loads."""
        return {}

    @classmethod
    def output_kind(cls, cfg: Any) -> str | None:
        """What a completion is under adapter config `cfg` (a name such as those of `Medium.kind`, or
        'episode'), matched before anything loads against the kinds each reward declares it scores
        (`register_reward(..., outputs=...)`); None: not known, so not checked."""
        return None

    @classmethod
    def rollout_columns(cls, cfg: Any) -> tuple[str, ...]:
        """The columns a rollout under adapter config `cfg` hands the rewards beside the data's
        (`Rollout.columns`: token ids, a video's frame rate); a reward may need them of no data row."""
        return ()

    @classmethod
    def prompt_check(cls, cfg: Any) -> Callable[[Any], str | None] | None:
        """A check of each row's prompt under adapter config `cfg` (the prompt's problem, or None),
        run with the data validation before the model loads; it may read what it needs (a
        tokenizer), never the weights. None: no check beyond the engine's (text or a message list)."""
        return None

    def prompt_of(self, row: Any) -> Any:
        """The prompt of a data-set row (a row that is not a dict is the prompt itself)."""
        return row[self.prompt_column] if isinstance(row, dict) else row

    @abstractmethod
    def logprobs(self, model: nn.Module, batch: Rollout, units: slice = slice(None),
                 with_entropy: bool = False) -> tuple[Tensor, Tensor | None]:
        """fp32 log-probs [B, u] of the batch's units (and their entropies when asked), with
        `model` (the training-wrapped module, or the reference). Called under grad."""

    def unit_logits(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> Tensor:
        """fp32 logits [B, u, V] of each unit over a finite vocabulary, as the sampler draws from them
        (temperature applied, never-sampled tokens at a large negative value), for
        `algorithm.distill.divergence: jsd`; adapters with such units implement it."""
        raise NotImplementedError(f"{type(self).__name__} has no unit logits")

    def logprobs_and_kl(self, model: nn.Module, reference: Callable[[], AbstractContextManager[nn.Module]],
                        batch: Rollout, units: slice = slice(None),
                        with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """`logprobs` plus the closed-form per-unit KL(pi_theta || pi_ref) [B, u] under grad, for
        families whose units have one (`algorithm.kl_estimator: closed_form`, e.g. Gaussian
        denoising steps). `reference()` enters a context that yields the reference module."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form KL; "
                                  "choose algorithm.kl_estimator among k1, k2, k3")

    @classmethod
    def divergence_problem(cls, cfg: Any) -> str | None:
        """Why this adapter under config `cfg` gives no exact per-unit divergence from the old policy
        (`algorithm.trust_region: dppo`), or None where it does."""
        return f"the {cls.__name__} adapter computes no exact per-unit divergence from the old policy"

    def logprobs_and_means(self, model: nn.Module, batch: Rollout, units: slice = slice(None)) -> tuple[Tensor, Tensor]:
        """`logprobs` [B, u] and each unit's distribution mean [B, u, ...] under `model`: the old
        policy's, taken before the first update pass and kept for `algorithm.trust_region: dppo`."""
        raise NotImplementedError(f"{type(self).__name__}: {self.divergence_problem(self.cfg)}")

    def logprobs_and_divergence(self, model: nn.Module, batch: Rollout, units: slice, old_means: Tensor,
                                reference: Callable[[], AbstractContextManager[nn.Module]] | None = None,
                                with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
        """(log-probs, entropies when asked, the closed-form KL to the reference when `reference` is
        given, each unit's KL(pi_old || pi_theta) [B, u] from the old means `old_means` [B, u, ...]
        of `logprobs_and_means`), under grad."""
        raise NotImplementedError(f"{type(self).__name__}: {self.divergence_problem(self.cfg)}")

    def apply_stage_settings(self, changes: dict[str, Any]) -> None:
        """Take a training stage's new values of `stage_fields` (typed, by field name) without
        reloading the model. The default replaces them in `self.cfg`, the adapter's `Config`;
        an adapter that derives state from them at construction overrides this."""
        self.cfg = dataclasses.replace(self.cfg, **changes)

    def set_training_step(self, step: int) -> None:
        """Told by the trainer before each step's rollouts (schedules that move with training,
        e.g. a sliding window of trained steps); evaluation does not change it."""

    def step_rewards(self, batch: Rollout, score: Callable[[list[int], list[Any]], dict[str, Tensor]]
                     ) -> dict[str, Tensor] | None:
        """Per-unit rewards {name: [N, U]} (step-level credit, e.g. TP-GRPO's intermediate states), or None.
        `score(rows, completions)` scores extra completions, completion j standing for row rows[j], with
        every reward: {name: [len(rows)]}. In training only; the result replaces the rollout rewards."""
        return None

    def unit_rewards(self, batch: Rollout, rewards: dict[str, Tensor]) -> dict[str, Tensor] | None:
        """Per-unit rewards {name: [N, U]} derived from the rollouts' own rewards {name: [N]} (e.g.
        BranchGRPO's tree: a step's reward is the mean over the leaves under its node), or None.
        Called in training after `step_rewards` returned None; the result replaces the rewards."""
        return None

    def sample_medium(self, completion: Any, columns: dict[str, Any]) -> Medium:
        """What one completion is for the users who look at it (held-out samples in TensorBoard and
        W&B): text, an image, a video or audio (`columns`: its row's column values, e.g. a video's
        `fps`). The default tells it by the completion's type (mmrl/core/media.py)."""
        return medium(completion, columns)

    def pop_metrics(self) -> dict[str, float]:
        """Counts the adapter reports about its last rollouts (summed over processes), logged as
        ``policy/<key>``; reading them resets them."""
        return {}

    def pass_view(self, batch: Rollout, pass_index: int) -> Rollout | None:
        """The batch as update pass `pass_index` (0 .. mu-1) scores it, for log-probs that are Monte Carlo
        estimates redrawn each pass (a masked diffusion LM's fresh masks, d1), or None (every pass alike);
        each pass's old and reference log-probs are then taken from its view before the first update."""
        return None

    def unit_slices(self, batch: Rollout) -> list[slice]:
        """How a micro-batch's units are split for backprop (one pass; a diffusion adapter: one per step)."""
        return [slice(None)]

    def concat(self, parts: Sequence[Rollout]) -> Rollout:
        """Join rollouts drawn separately (dynamic sampling); adapters with padding override."""
        return Rollout.concat(parts)

    def supervised_loss(self, model: nn.Module, rows: Sequence[dict], target_column: str) -> Tensor:
        """Negative log-likelihood of each row's `target_column` given its prompt (warm start)."""
        raise NotImplementedError(f"{type(self).__name__} has no supervised warm start")

    def save_pretrained(self, model: nn.Module, path: Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """Write the weights (or the LoRA adapter) in the family's own `from_pretrained` format.
        `state_dict`: the whole weights when `model` is sharded (its own state dict then holds
        this process's shards), saved in place of `model.state_dict()`."""
        model.save_pretrained(path, state_dict=state_dict, safe_serialization=True)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def build_policy(cfg: TrainConfig, policy_cfg: Any = None) -> Policy:
    """The adapter of `cfg.task` built from its typed ``policy:`` section (typed here if not given)."""
    adapter = ADAPTERS.get(cfg.task)
    if policy_cfg is None:  # a served engine's name is the engine's, not the adapter's
        policy_cfg = from_dict(adapter.Config, adapter_policy(cfg.policy), "policy")
    return adapter(policy_cfg)
