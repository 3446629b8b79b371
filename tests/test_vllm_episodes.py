"""Episodes with the vLLM rollout engine (tasks/lm/episode_engines.py `VLLMTurns`) against the
training forward and against the hf engine's episodes. Needs vLLM: run in the venv of
scripts/make_vllm_env.sh as ``DIR/bin/python -m pytest -q -m vllm``.

Tiny models are first taught (supervised steps, as tests/test_episodes.py does) to call a tool for
one prompt and to answer another at once, so the episodes have known turns: a causal LM calls the
sandboxed calculator (`python`) for "2+3"; a Qwen2.5-VL calls `zoom` on its image for "z".
Tolerance: 1e-3 on |vLLM's processed log-prob - the training forward's| over every model token of
whole episodes (fp32), as tests/test_vllm.py."""

import pytest
import torch

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

import vllm_without_torchvision  # noqa: E402
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy  # noqa: E402
from mmrl.tasks.lm.episodes import EpisodeConfig  # noqa: E402
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy  # noqa: E402

vllm_without_torchvision.apply()

TOL = 1e-3
TINY = {"hidden": 256, "layers": 2, "heads": 4}  # vLLM's CPU attention takes head_dim 64
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
CALC = '<tool_call>{"name": "python", "arguments": {"code": "2+3"}}</tool_call>'
ZOOM = '<tool_call>{"name": "zoom", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'


def teach(policy, texts: list[str], replies: list[str], steps: int) -> None:
    """Supervised steps on `texts` (left-padded, position ids skip the padding), the loss on their
    last len(reply) tokens only."""
    enc = policy.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    target = mask.clone()
    for row, reply in enumerate(replies):
        target[row, :-len(policy.tokenizer(reply, add_special_tokens=False)["input_ids"])] = 0
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = policy.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        logp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * target[:, 1:]).sum() / target[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def calculator_policy(engine: str, state=None) -> CausalLMPolicy:
    policy = CausalLMPolicy(CausalLMConfig(
        model="tiny:qwen2-char", tiny_args=TINY, max_new_tokens=80, temperature=0.7, chat_template=True,
        rollout_engine=engine, episode=EpisodeConfig(tools=["python"], max_turns=3, max_tokens=200)))
    policy.tokenizer.chat_template = TEMPLATE
    if state is not None:
        policy.model.load_state_dict(state)
    return policy


@pytest.fixture(scope="module")
def calculator():
    """A vLLM episode policy that calls python("2+3") for "2+3", then answers 5; and answers "4+3" with 7."""
    policy = calculator_policy("vllm")
    replies = [CALC + "<eos>t:5\n<eos>a:5<eos>", "7<eos>"]
    teach(policy, [policy.prompt_text(p) + r for p, r in zip(["2+3", "4+3"], replies)], replies, 120)
    return policy


def gap(policy, batch) -> tuple[float, int]:
    """Max |vLLM's log-prob - the training forward's| over the model tokens, and their count."""
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert (batch.rollout_logp[mask] < -1e-4).any()  # not all certain: the comparison can fail
    return float((batch.rollout_logp - logp)[mask].abs().max()), int(mask.sum())


def test_a_vllm_calculator_episode_matches_the_training_forward_with_tool_tokens_masked(calculator):
    batch = calculator.rollout(["2+3", "4+3"], 2, seeds=[1, 2])
    assert calculator._vllm is not None  # the turns came from vLLM
    assert batch.columns["turns"] == [2, 2, 1, 1] and not batch.truncated.any()
    assert batch.columns["tool_calls"][0] == [{"turn": 0, "name": "python", "arguments": {"code": "2+3"},
                                               "result": "5\n", "images": 0, "error": None}]
    text = calculator.tokenizer.decode(batch.extras["completion_ids"][0], skip_special_tokens=False)
    assert text.startswith(CALC + "<eos>t:5\n<eos>a:")
    # the tool turn "t:5\n<eos>a:" (its eos is the model's) is context, not units
    call, tool = len(CALC) + 1, len("t:5\n<eos>a:") - len("<eos>") + 1
    mask, turn = batch.unit_mask[0], batch.extras["completion_turn"][0]
    assert mask[:call].all() and not mask[call:call + tool].any() and mask[call + tool:call + tool + 2].all()
    assert turn[call:call + tool].eq(-1).all() and turn[call + tool:call + tool + 2].eq(1).all()
    assert (batch.rollout_logp[batch.unit_mask == 0] == 0).all()
    worst, tokens = gap(calculator, batch)
    print(f"vLLM calculator episodes: max |vllm - forward| = {worst:.3g} over {tokens} model tokens")
    assert worst <= TOL, f"max |vllm - forward| = {worst} over {tokens} tokens"
    # the weights the engine used are the taught ones: an untaught model scores the episodes far apart
    with torch.no_grad():
        other, _ = calculator.logprobs(calculator_policy("hf").model, batch)
    assert float((batch.rollout_logp - other)[batch.unit_mask.bool()].abs().max()) > 100 * TOL


def test_greedy_vllm_episodes_are_the_hf_engines(calculator):
    """The same weights, greedy: vLLM's episodes are the hf engine's, token for token, with the
    same masks, turns and tool records."""
    hf = calculator_policy("hf", calculator.model.state_dict())
    ours, theirs = (p.rollout(["2+3", "4+3"], 1, seeds=[1, 2], greedy=True) for p in (calculator, hf))
    assert ours.columns["turns"] == theirs.columns["turns"] == [2, 1]
    assert ours.columns["tool_calls"] == theirs.columns["tool_calls"]
    for key in ("completion_ids", "completion_context_mask", "completion_turn"):
        assert torch.equal(ours.extras[key], theirs.extras[key]), key
    assert torch.equal(ours.unit_mask, theirs.unit_mask) and ours.completions == theirs.completions


@pytest.fixture(scope="module")
def zoomer():
    """A vLLM Qwen2.5-VL episode policy that zooms into its image for "z" and answers "n" with "n":
    taught row by row on the processor's inputs (the prompt's image expanded, its pixels given)."""
    policy = VLMPolicy(VLMConfig(model="tiny:qwen2.5-vl-char", tiny_args=TINY, max_new_tokens=120, temperature=0.5,
                                 rollout_engine="vllm",
                                 episode=EpisodeConfig(tools=["zoom"], max_turns=3, max_tokens=400)))
    vllm_without_torchvision.use_processor(policy.processor)
    rows, replies = vl_rows(), [ZOOM + "<eos>", "n<eos>"]
    inputs = [policy.processor(text=[policy._chat_and_media(r)[0] + t], images=[r["image"]], return_tensors="pt")
              for r, t in zip(rows, replies)]
    lengths = [len(policy.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in replies]
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=1e-3)
    for _ in range(300):
        loss = 0
        for enc, n in zip(inputs, lengths):
            logits = policy.model(**enc).logits[0, -n - 1:-1]
            loss = loss - logits.log_softmax(-1).gather(-1, enc["input_ids"][0, -n:, None]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy


def vl_rows() -> list[dict]:
    from PIL import Image
    gen = torch.Generator().manual_seed(0)
    picture = Image.fromarray((torch.rand(56, 56, 3, generator=gen) * 255).to(torch.uint8).numpy())
    return [{"prompt": "z", "image": picture}, {"prompt": "n", "image": picture}]


def test_a_vllm_zoom_episode_sees_the_returned_image_and_matches_the_training_forward(zoomer):
    batch = zoomer.rollout(vl_rows(), 2, seeds=[3, 4])
    calls = batch.columns["tool_calls"]
    assert [c[0]["name"] if c else None for c in calls] == ["zoom", "zoom", None, None]
    assert calls[0][0]["images"] == 1 and calls[0][0]["error"] is None
    grids = batch.extras["image_grid_thw"]
    assert [len(g) for g in grids] == [2, 2, 1, 1]  # the prompt's image, then the crop
    pad = zoomer.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert (batch.unit_mask * (batch.extras["completion_ids"] == pad)).sum() == 0  # the crop's slots never train
    assert (batch.extras["completion_ids"][0] == pad).sum() > 0
    worst, tokens = gap(zoomer, batch)
    print(f"vLLM zoom episodes: max |vllm - forward| = {worst:.3g} over {tokens} model tokens")
    assert worst <= TOL, f"max |vllm - forward| = {worst} over {tokens} tokens"
