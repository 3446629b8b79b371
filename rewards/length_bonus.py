"""Video-R1's length bonus (``len_control``, github.com/tulerfeng/Video-R1): reward correct
answers of a moderate length in groups that already answer correctly."""

from __future__ import annotations

import math

from mmrl.core.scoring import bind_reward, register_reward

from .outputs import TEXT


@register_reward("length_bonus", outputs=TEXT)
def length_bonus_reward(prompts, completions, group_id, auxiliary, completion_ids=None, bonus: float = 0.2,
                        min_length: int = 320, max_length: int = 512, min_correct: int = 2,
                        correct_above: float = 0.1, accuracy: str = "accuracy", accuracy_args: dict | None = None,
                        **columns) -> list[float | None]:
    """`bonus` for each completion that is correct (its `accuracy` reward > `correct_above`) and
    whose length L = len(completion_ids[i]) (tokens up to and including the first eos, as
    Video-R1 counts them with its completion mask) is in [`min_length`, `max_length`], in a
    group where at least `min_correct` rollouts are correct; 0 otherwise.

    Defaults are Video-R1's (both published run scripts set ``--len_control true``): +0.2 for
    320 <= L <= 512 when more than one rollout has accuracy > 0.1. Video-R1 counts the correct
    rollouts over the local batch (one prompt per device); here they are counted per prompt group.
    `accuracy` names the reward that scores correctness, called with `accuracy_args`. None for
    auxiliary rows (shuffled-frame rollouts) and rows whose accuracy is None.
    """
    n = len(completions)
    if completion_ids is None:
        raise ValueError("length_bonus: needs the column 'completion_ids' (token ids; the language-model adapters "
                         "pass it) to count tokens as Video-R1 does")
    if len(completion_ids) != n or len(group_id) != n or len(auxiliary) != n:
        raise ValueError(f"length_bonus: completion_ids / group_id / auxiliary have {len(completion_ids)} / "
                         f"{len(group_id)} / {len(auxiliary)} values for {n} completions")
    if not 0 <= min_length <= max_length:
        raise ValueError(f"length_bonus: need 0 <= min_length={min_length!r} <= max_length={max_length!r}")
    if isinstance(min_correct, bool) or not isinstance(min_correct, int) or min_correct < 1:
        raise ValueError(f"length_bonus: min_correct={min_correct!r} must be an integer >= 1")
    scores = bind_reward(accuracy, accuracy_args)(prompts=prompts, completions=completions, group_id=group_id,
                                                  auxiliary=auxiliary, completion_ids=completion_ids, **columns)
    correct = [s is not None and not math.isnan(float(s)) and float(s) > correct_above for s in scores]
    n_correct: dict = {}
    for g, aux, ok in zip(group_id, auxiliary, correct):
        if not aux:
            n_correct[g] = n_correct.get(g, 0) + ok
    out: list[float | None] = []
    for g, aux, s, ok, ids in zip(group_id, auxiliary, scores, correct, completion_ids):
        if aux or s is None or math.isnan(float(s)):
            out.append(None)
        else:
            paid = ok and n_correct[g] >= min_correct and min_length <= len(ids) <= max_length
            out.append(float(bonus) if paid else 0.0)
    return out
