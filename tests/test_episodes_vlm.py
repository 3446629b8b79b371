"""Episodes of vision-language policies whose tools return images (tasks/lm/episodes.py).

TRL #6274: an image a tool returns crashed Qwen VLMs there (pixel_values cut per sample, not per
image grid). Here a tiny Qwen2.5-VL and Qwen3-VL are taught to call `show` (which returns an
image) for one prompt and to answer the other at once, so the rows of one batch carry different
numbers of returned images; each row keeps its own pixels and grids, and the training forward
scores the model's tokens as the sampler drew them."""

from pathlib import Path

import pytest
import torch
from mmrl.tasks.lm.episodes import EpisodeConfig
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy

TOOLS = str(Path(__file__).parent / "episode_tools.py")
CALL = '<tool_call>{"name": "show", "arguments": {"colour": "red"}}</tool_call>'


def taught_vlm(model: str) -> VLMPolicy:
    """A tiny VLM that calls show for the prompt "r" and answers "n" with "n"."""
    policy = VLMPolicy(VLMConfig(model=model, tiny_args={"hidden": 64, "layers": 2, "heads": 2},
                                 max_new_tokens=80, temperature=0.5,
                                 episode=EpisodeConfig(tools=[f"{TOOLS}:show"], max_turns=3, max_tokens=400)))
    replies = (("r", CALL + "<eos>"), ("n", "n<eos>"))
    texts = [policy._chat_and_media(p)[0] + t for p, t in replies]
    enc = policy.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    target = mask.clone()  # the replies only
    for row, (_, reply) in enumerate(replies):
        target[row, :-len(policy.tokenizer(reply, add_special_tokens=False)["input_ids"])] = 0
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=1e-2)
    for _ in range(150):
        logits = policy.model(input_ids=ids, attention_mask=mask).logits
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * target[:, 1:]).sum() / target[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


@pytest.mark.parametrize("model", ["tiny:qwen2.5-vl-char", "tiny:qwen3-vl-char"])
def test_rows_with_different_numbers_of_returned_images_keep_their_own_grids(model):
    policy = taught_vlm(model)
    batch = policy.rollout(["r", "n"], 1, seeds=[1, 2])
    returned = [sum(c["images"] for c in calls) for calls in batch.columns["tool_calls"]]
    assert returned[0] >= 1 and returned[1] == 0 and batch.columns["tool_calls"][0][0]["name"] == "show"
    grids, pixels = batch.extras["image_grid_thw"], batch.extras["pixel_values"]
    assert [len(g) for g in grids] == returned
    merge = policy.processor.image_processor.merge_size ** 2
    pad = policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    for row in range(2):  # each row's pixels are its images' patches; its completion holds their slots
        assert len(pixels[row]) == int(grids[row].prod(-1).sum())
        slots = int((batch.extras["completion_ids"][row] == pad).sum())
        assert slots == int(grids[row].prod(-1).sum()) // merge
        assert (batch.extras["completion_mm_token_type_ids"][row] > 0).sum() == slots
    assert (batch.unit_mask * (batch.extras["completion_ids"] == pad)).sum() == 0  # image slots never train
    # the whole batch and each row alone give the sampler's log-probs on the model's tokens
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, batch)
        alone, _ = policy.logprobs(policy.model, batch.select([0]))
    assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-4)
    assert torch.allclose(alone[0], logp[0], atol=1e-5)
    # the episode's own image size columns still describe the prompt's image (none here)
    assert batch.columns["original_size"] == [None, None]
