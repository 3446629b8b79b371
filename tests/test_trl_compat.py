"""TRL users at home: TRL's own reward functions named in a recipe as FILE.py:FUNCTION, TRL's
conversational data (prompts as message lists always go through the chat template, completions
reach TRL-convention rewards as assistant messages)."""

import json
import re
import textwrap
from pathlib import Path

import pytest
from helpers import TINY_RECIPE

from mmrl.config.help import lookup
from mmrl.config.parse import ConfigError, parse_config
from mmrl.config.peer_names import TRL, VERL
from mmrl.config.sections import DataConfig
from mmrl.data import load_data
from mmrl.errors import UserError
from mmrl.tasks.demos.tiny_models import chat_template, qwen2_char
from mmrl.train.loop.parts import build_policy
from mmrl.train.loop.trainer import Trainer
from mmrl.train.plan.validate import validate

# TRL's documented reward functions, as the TRL docs write them: the GRPO quick start's
# `reward_len` (standard format), "Example 2: Reward completions with a specific format"
# (conversational) and "Example 3: Reward completions based on a reference" (standard format).
TRL_REWARDS = textwrap.dedent('''
    import re

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]

    def format_reward_func(completions, **kwargs):
        """Reward function that checks if the completion has a specific format."""
        pattern = r"^<think>.*?</think><answer>.*?</answer>$"
        completion_contents = [completion[0]["content"] for completion in completions]
        matches = [re.match(pattern, content) for content in completion_contents]
        return [1.0 if match else 0.0 for match in matches]

    def reward_func(completions, ground_truth, **kwargs):
        # Regular expression to capture content inside \\boxed{}
        matches = [re.search(r"\\\\boxed\\{(.*?)\\}", completion) for completion in completions]
        contents = [match.group(1) if match else "" for match in matches]
        # Reward 1 if the content is the same as the ground truth, 0 otherwise
        return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
''')

CHAT_ROWS = [  # TRL's conversational format: `prompt` is a message list (one with a system message)
    {"prompt": [{"role": "user", "content": "Say 12."}], "ground_truth": "12"},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say 7."}],
     "ground_truth": "7"},
]


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny Qwen2 with a chat template, saved as a local model folder."""
    folder = tmp_path_factory.mktemp("model")
    model, tokenizer = qwen2_char(hidden=32, layers=1, heads=2)
    tokenizer.chat_template = chat_template()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def recipe(tmp_path, model, data, rewards, **extra):
    return {**TINY_RECIPE, "policy": {"model": str(model), "max_new_tokens": 12},
            "data": {"path": str(data)}, "rewards": rewards, "reward_modules": [],
            "optim": {**TINY_RECIPE["optim"], "prompts_per_step": 2}, "output_dir": str(tmp_path / "run"),
            **extra}


def train_and_capture(cfg):
    """Train `cfg`; return its metrics records and the rollouts each step drew (recorded from the
    policy's own rollout calls)."""
    trainer = Trainer(parse_config(cfg))
    rollouts, rollout = [], trainer.policy.rollout

    def recording(*args, **kwargs):
        rollouts.append(rollout(*args, **kwargs))
        return rollouts[-1]

    trainer.policy.rollout = recording
    trainer.train()
    records = [json.loads(line) for line in (trainer.output_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "reward_mean" in r], rollouts


def mean(values):
    return sum(values) / len(values)


def test_message_list_prompts_always_get_the_chat_template(tmp_path, chat_model):
    folder, tokenizer = chat_model
    rows = load_data(DataConfig(path=str(write_jsonl(tmp_path / "chat.jsonl", CHAT_ROWS))))[0]
    assert [row["prompt"] for row in rows] == [r["prompt"] for r in CHAT_ROWS]  # message lists stay lists
    policy = build_policy(parse_config({"task": "causal_lm", "policy": {"model": str(folder)}}))
    for row, raw in zip(rows, CHAT_ROWS):
        expected = tokenizer.apply_chat_template(raw["prompt"], tokenize=False, add_generation_prompt=True)
        assert policy.prompt_text(row["prompt"]) == expected
        assert expected.startswith("<|im_start|>")


def test_trl_documented_rewards_train_on_conversational_data(tmp_path, chat_model):
    folder, _ = chat_model
    module = tmp_path / "trl_rewards.py"
    module.write_text(TRL_REWARDS)
    names = {fn: f"{module}:{fn}" for fn in ("reward_len", "format_reward_func")}
    data = write_jsonl(tmp_path / "chat.jsonl", CHAT_ROWS)
    records, rollouts = train_and_capture(recipe(tmp_path, folder, data, {n: {"weight": 1.0} for n in names.values()}))
    assert len(records) == 2 == len(rollouts)
    for record, rollout in zip(records, rollouts):
        texts = rollout.completions
        # conversational: each completion is one assistant message, so len(completion) is 1 in reward_len
        assert record[f"reward/{names['reward_len']}"] == pytest.approx(-19.0)
        expected_format = mean([1.0 if re.match(r"^<think>.*?</think><answer>.*?</answer>$", t) else 0.0
                                for t in texts])
        assert record[f"reward/{names['format_reward_func']}"] == pytest.approx(expected_format)


def test_trl_documented_rewards_train_on_standard_data(tmp_path, chat_model):
    folder, _ = chat_model
    module = tmp_path / "trl_rewards.py"
    module.write_text(TRL_REWARDS)
    names = {fn: f"{module}:{fn}" for fn in ("reward_len", "reward_func")}
    rows = [{"prompt": "Say 12: \\boxed{", "ground_truth": "12"}, {"prompt": "Say 7:", "ground_truth": "7"}]
    data = write_jsonl(tmp_path / "plain.jsonl", rows)
    records, rollouts = train_and_capture(recipe(tmp_path, folder, data, {n: {"weight": 1.0} for n in names.values()}))
    assert len(records) == 2 == len(rollouts)
    for record, rollout in zip(records, rollouts):
        texts, truths = rollout.completions, rollout.columns["ground_truth"]
        assert all(isinstance(t, str) for t in texts)
        assert record[f"reward/{names['reward_len']}"] == pytest.approx(mean([-abs(20 - len(t)) for t in texts]))
        boxed = [re.search(r"\\boxed\{(.*?)\}", t) for t in texts]
        expected = mean([float(b is not None and b.group(1) == truth) for b, truth in zip(boxed, truths)])
        assert record[f"reward/{names['reward_func']}"] == pytest.approx(expected)


def test_an_unregistered_name_says_how_to_register_and_how_to_name_a_plain_function(tmp_path):
    module = tmp_path / "trl_rewards.py"
    module.write_text(TRL_REWARDS)
    cfg = parse_config({**TINY_RECIPE, "reward_modules": [str(module)], "rewards": {"reward_len": {"weight": 1.0}}})
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    message = str(e.value)
    assert "'reward_len' is not a registered reward" in message
    assert "@register_reward('reward_len')" in message
    assert f"did you mean '{module}:reward_len'?" in message


def test_a_plain_function_that_cannot_be_found_is_named(tmp_path):
    module = tmp_path / "trl_rewards.py"
    module.write_text(TRL_REWARDS)
    for name, expected in [(f"{tmp_path}/missing.py:f", "does not exist"),
                           (f"{module}:reward_lenn", "has no function 'reward_lenn'; its functions: "
                                                     "format_reward_func, reward_func, reward_len")]:
        cfg = parse_config({**TINY_RECIPE, "rewards": {name: {"weight": 1.0}}})
        with pytest.raises(ConfigError, match=re.escape(expected)):
            validate(cfg)


# ---- prompt length (TRL's max_prompt_length, verl's data.max_prompt_length) ------------------------

def tiny_policy(**policy):
    return build_policy(parse_config({"task": "causal_lm", "policy": {
        "model": "tiny:qwen2-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2}, "max_new_tokens": 8,
        **policy}}))


def test_a_prompt_longer_than_the_model_positions_is_refused():
    policy = tiny_policy()  # 512 positions (tasks/demos/tiny_models.py), 8 of them for the completion
    policy.rollout([{"prompt": "7" * 504}], 2, [0])  # fits exactly
    with pytest.raises(UserError, match=r"a prompt has 505 tokens, more than the 504 the model's 512 positions"):
        policy.rollout([{"prompt": "7" * 505}], 2, [0])


def test_max_prompt_length_keeps_the_last_tokens_as_trl():
    policy = tiny_policy(max_prompt_length=5)
    rollout = policy.rollout([{"prompt": "abcdefghij"}, {"prompt": "xyz"}], 2, [0, 1])
    ids, mask = rollout.extras["prompt_ids"], rollout.extras["prompt_mask"]
    assert ids.shape[1] == 5
    assert ids[0].tolist() == policy.tokenizer("fghij", add_special_tokens=False)["input_ids"]
    assert mask[2].tolist() == [0, 0, 1, 1, 1]  # the short prompt (row 2: group 2's first) is not cut
    assert policy.tokenizer.decode(ids[2][mask[2].bool()]) == "xyz"


# ---- TRL's and verl's names (docs/from-trl-verl.md) ----------------------------------------------

def doc_table(heading):
    """name -> (mmrl key, note) of the table under `heading` in docs/from-trl-verl.md."""
    text = (Path(__file__).parents[1] / "docs" / "from-trl-verl.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| (.*?) ?\|$", section, re.M)
    return {name: (mmrl, note) for name, mmrl, note in rows}


@pytest.mark.parametrize("heading, names", [("TRL", TRL), ("verl", VERL)])
def test_the_docs_table_is_the_mapping_in_code(heading, names):
    assert doc_table(heading) == {name: (peer.mmrl, peer.note) for name, peer in names.items()}


@pytest.mark.parametrize("peer", [*TRL.values(), *VERL.values()], ids=lambda p: p.mmrl)
def test_every_mmrl_key_of_the_mapping_is_a_setting(peer):
    name, field, _, section = lookup(peer.mmrl, "causal_lm")
    assert name == peer.mmrl and field is not None and section is None  # a leaf setting, not a section
