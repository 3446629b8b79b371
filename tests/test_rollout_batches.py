"""The token adapters' shared rollout plumbing (tasks/lm/rollout_batches.py): completion ends,
joining rollouts of different widths, scoring only the used columns."""

import torch
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.rollout_batches import concat_padded, first_eos_ends, full_width, units_before, used_width

from mmrl.core.rollout import Rollout

EOS, PAD = 2, 0


def test_completion_ends_at_the_first_eos_of_any_eos_id():
    ids = torch.tensor([[5, EOS, 7, 9], [5, 6, 7, 8], [9, 3, 3, EOS]])
    end = first_eos_ends(ids, [EOS, 9])
    assert end.tolist() == [2, 5, 1]  # row 2 ends at its first token, 9; row 1 has no eos
    mask, truncated = units_before(end, ids.shape[1])
    assert mask.dtype == torch.float32
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def _rollout(prompt_ids: list[list[int]], completion_ids: list[list[int]], lengths: list[int]) -> Rollout:
    completion = torch.tensor(completion_ids)
    return Rollout(group_id=torch.zeros(len(prompt_ids), dtype=torch.long), prompts=["p"] * len(prompt_ids),
                   completions=["c"] * len(prompt_ids),
                   unit_mask=(torch.arange(completion.shape[1])[None, :] < torch.tensor(lengths)[:, None]).float(),
                   extras={"prompt_ids": torch.tensor(prompt_ids), "prompt_mask": torch.ones(len(prompt_ids),
                           len(prompt_ids[0]), dtype=torch.long),
                           "prompt_token_type_ids": torch.full((len(prompt_ids), len(prompt_ids[0])), 3),
                           "completion_ids": completion, "mask_pass": 0})


def test_joined_rollouts_pad_prompts_left_and_completions_right():
    a = _rollout([[11, 12]], [[21, 22, 23]], [3])
    b = _rollout([[31, 32, 33, 34]], [[41]], [1])
    joined = concat_padded([a, b], PAD)
    ex = joined.extras
    assert ex["prompt_ids"].tolist() == [[PAD, PAD, 11, 12], [31, 32, 33, 34]]
    assert ex["prompt_mask"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert ex["prompt_token_type_ids"].tolist() == [[0, 0, 3, 3], [3, 3, 3, 3]]
    assert ex["completion_ids"].tolist() == [[21, 22, 23], [41, PAD, PAD]]
    assert joined.unit_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert ex["mask_pass"] == 0 and len(joined) == 2


def test_used_columns_are_given_back_at_full_width():
    mask = torch.tensor([[1.0, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    assert used_width(mask) == 2
    assert used_width(torch.zeros(2, 5)) == 1
    logp, ent = torch.tensor([[-1.0, -2], [-3, -4]]), torch.tensor([[0.5, 0.6], [0.7, 0.8]])
    full, full_ent = full_width(logp, ent, 5, slice(1, None))
    assert full.tolist() == [[-2, 0, 0, 0], [-4, 0, 0, 0]]
    assert torch.allclose(full_ent, torch.tensor([[0.6, 0, 0, 0], [0.8, 0, 0, 0]]))
    assert full_width(logp, None, 5, slice(None))[1] is None


def test_joined_causal_rollouts_score_as_drawn():
    policy = CausalLMPolicy(CausalLMConfig(model="tiny:qwen2-char", max_new_tokens=6))
    short, long = policy.rollout(["5+6="], 2, seeds=[1]), policy.rollout(["123+456="], 2, seeds=[2])
    joined = policy.concat([short, long])
    with torch.no_grad():
        both = policy.logprobs(policy.model, joined)[0]
        alone = [policy.logprobs(policy.model, r)[0] for r in (short, long)]
    for rows, part in zip((slice(0, 2), slice(2, 4)), alone):
        assert torch.allclose(both[rows, :part.shape[1]], part, atol=1e-5)
        assert both[rows, part.shape[1]:].abs().sum() == 0
