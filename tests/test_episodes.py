"""Episodes (tasks/lm/episodes.py): multi-turn rollouts with tool turns masked out of the loss.

A tiny causal LM is first taught (a few hundred supervised steps) to call `add` for "2+3" and to
answer "4+3" at once, so its episodes have known turns."""

from pathlib import Path

import pytest
import torch
from mmrl.tasks.lm.causal_lm import CausalLMConfig, CausalLMPolicy
from mmrl.tasks.lm.episodes import EpisodeConfig, tool_turn_text
from mmrl.tasks.lm.tools import parse_tool_calls

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.objectives import AGGREGATIONS, policy_loss

TOOLS = str(Path(__file__).parent / "episode_tools.py")
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def episode_policy(**episode) -> CausalLMPolicy:
    cfg = CausalLMConfig(model="tiny:qwen2-char", tiny_args={"hidden": 64, "layers": 2, "heads": 2},
                         max_new_tokens=80, temperature=0.7, chat_template=True,
                         episode=EpisodeConfig(**{"tools": [f"{TOOLS}:add"], "max_turns": 3, "max_tokens": 200,
                                                  **episode}))
    policy = CausalLMPolicy(cfg)
    policy.tokenizer.chat_template = TEMPLATE
    return policy


@pytest.fixture(scope="module")
def taught():
    """A policy that calls add(2, 3) for "2+3", then answers 5; and answers "4+3" with 7."""
    policy = episode_policy()
    texts = [policy.prompt_text("2+3") + CALL + "<eos>t:5<eos>a:5<eos>", policy.prompt_text("4+3") + "7<eos>"]
    enc = policy.tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    optimizer = torch.optim.Adam(policy.model.parameters(), lr=1e-2)
    for _ in range(120):
        out = policy.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        logp = out.logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy.model.state_dict()


def taught_policy(state, **episode) -> CausalLMPolicy:
    policy = episode_policy(**episode)
    policy.model.load_state_dict(state)
    return policy


def test_an_episode_alternates_model_and_tool_turns_with_tool_tokens_masked(taught):
    policy = taught_policy(taught)
    batch = policy.rollout(["2+3", "4+3"], 2, seeds=[1, 2])
    text = policy.tokenizer.decode(batch.extras["completion_ids"][0], skip_special_tokens=False)
    assert text.startswith(CALL + "<eos>t:5<eos>a:5<eos>")
    assert batch.columns["turns"] == [2, 2, 1, 1] and batch.completions == ["5", "5", "7", "7"]
    assert batch.columns["tool_calls"][0] == [{"turn": 0, "name": "add", "arguments": {"a": 2, "b": 3},
                                               "result": "5", "images": 0, "error": None}]
    assert not batch.truncated.any()
    assert set(batch.columns) == set(CausalLMPolicy.rollout_columns(policy.cfg))  # as declared before loading
    assert CausalLMPolicy.output_kind(policy.cfg) == "episode"
    # units: the model's tokens; the tool turn "t:5<eos>a:" is context, not units
    call = len(CALL) + 1
    tool = len("t:5<eos>a:") - len("<eos>") + 1
    mask, context, turn = batch.unit_mask[0], batch.extras["completion_context_mask"][0], batch.extras["completion_turn"][0]
    assert mask[:call].all() and not mask[call:call + tool].any() and mask[call + tool:call + tool + 2].all()
    assert context[:call + tool + 2].all() and not context[call + tool + 2:].any()
    assert turn[:call].eq(0).all() and turn[call:call + tool].eq(-1).all() and turn[call + tool:call + tool + 2].eq(1).all()
    assert policy.pop_metrics() == {"episodes": 4.0, "episode_turns": 6.0, "truncated_episodes": 0.0,
                                    "tool_calls/add": 2.0, "tool_errors": 0.0}


def test_rollout_logp_equals_the_training_forward_on_model_tokens(taught):
    policy = taught_policy(taught)
    batch = policy.rollout(["2+3", "4+3"], 2, seeds=[3, 4])
    assert batch.columns["turns"][0] == 2
    with torch.no_grad():
        logp, _ = policy.logprobs(policy.model, batch)
    mask = batch.unit_mask.bool()
    assert (batch.rollout_logp[mask] < -1e-4).any()  # not all certain: the comparison can fail
    assert torch.allclose(logp[mask], batch.rollout_logp[mask], atol=1e-4)
    assert (batch.rollout_logp[~mask] == 0).all()


def test_a_tool_token_gets_no_gradient_and_its_output_moves_only_later_tokens(taught):
    batch = taught_policy(taught).rollout(["2+3"], 1, seeds=[5])
    policy = episode_policy()  # scored by the untaught model, whose log-probs are far from certain
    mask = batch.unit_mask
    logp, _ = policy.logprobs(policy.model, batch)
    logp.retain_grad()
    cfg = AlgorithmConfig(beta=0.1)
    weights = AGGREGATIONS.get("token_mean")(mask, float(mask.sum()), 1.0, mask.shape[1])
    terms = policy_loss(logp, logp.detach() - 0.1, torch.tensor([1.0]), mask, weights, cfg,
                        ref_logp=logp.detach() + 0.2)
    terms.loss.backward()
    assert (logp.grad[mask == 0] == 0).all() and (logp.grad[mask == 1] != 0).all()
    # the tool's output "5" becomes "6": the tokens before it keep their log-probs, later ones move
    ids = batch.extras["completion_ids"]
    at = len(CALL) + 1 + len("t:")
    assert policy.tokenizer.decode(ids[0, at]) == "5"
    changed = batch.select([0])
    changed.extras = {**changed.extras, "completion_ids": ids.clone()}
    changed.extras["completion_ids"][0, at] = policy.tokenizer.convert_tokens_to_ids("6")
    with torch.no_grad():
        before, _ = policy.logprobs(policy.model, batch)
        after, _ = policy.logprobs(policy.model, changed)
    assert torch.equal(before[0, :at], after[0, :at])
    later = mask[0].bool() & (torch.arange(mask.shape[1]) > at)
    assert (before[0, later] - after[0, later]).abs().max() > 1e-3


@pytest.mark.parametrize("budget, turns", [({"max_turns": 1}, 1), ({"max_tokens": 70}, 1), ({"max_tokens": 60}, 1)])
def test_the_budgets_stop_an_episode_and_mark_it_truncated(taught, budget, turns):
    policy = taught_policy(taught, **budget)
    batch = policy.rollout(["2+3", "4+3"], 1, seeds=[1, 2])
    assert batch.truncated.tolist() == [True, False]
    assert batch.columns["turns"] == [turns, 1]
    assert batch.extras["completion_context_mask"][0].sum() <= budget.get("max_tokens", 200)
    assert batch.unit_mask[0, batch.extras["completion_context_mask"][0].sum():].eq(0).all()


def test_tool_call_errors_are_fed_back_and_counted():
    calls = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call> '
                             '<tool_call>[1]</tool_call><tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>')
    assert [c.error is not None for c in calls] == [True, True, False]
    assert "not JSON" in calls[0].error and calls[2].arguments == {"a": 1, "b": 2}


def test_the_tool_turn_is_what_the_template_writes_between_assistant_turns():
    policy = episode_policy()
    render = policy.tokenizer.apply_chat_template
    text = tool_turn_text(render, [{"role": "tool", "content": "5"}], "<eos>")
    assert text == "t:5<eos>a:"
    assert tool_turn_text(render, [{"role": "tool", "content": "5"}], None) == "<eos>t:5<eos>a:"
