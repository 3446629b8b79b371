"""The whole recipe is checked before any model, data set or reward model loads; every problem
names its dotted key, and all of them are reported together."""

import pytest
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import ConfigError, parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.plan.validate import validate


def problems(tmp_path, *overrides):
    with pytest.raises(ConfigError) as info:
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "run") + list(overrides)))
    return str(info.value)


BAD = [  # override, what the message must say
    ("policy.modle=x", r"'policy.modle' \(did you mean 'model'\?\)"),
    ("policy.temprature=0.7", r"'policy.temprature' \(did you mean 'temperature'\?\)"),
    ("policy.temperature=0", r"policy.temperature=0.0 must be > 0"),  # the adapter's own check, before loading
    ("policy.model=./no/such/model", r"policy.model: local path './no/such/model' does not exist"),
    ("rewards.accuracy.args.tolerence=0.1",
     r"rewards.accuracy.args.tolerence=0.1: reward 'accuracy' takes no argument 'tolerence' \(did you mean 'tolerance'\?\)"),
    ("rewards.acuracy.weight=1", r"rewards.acuracy: 'acuracy' is not a registered reward \(did you mean 'accuracy'\?\)"),
    ("task=causal", r"task: 'causal' is not a registered task adapter"),
    ("data.name=arithmetik", r"data.name: 'arithmetik' is not a registered dataset \(did you mean 'arithmetic'\?\)"),
    ("algorithm.estimator=grpoo", r"algorithm.estimator: 'grpoo' is not a registered advantage estimator"),
    ("algorithm.objective=clipp", r"algorithm.objective: 'clipp' is not a registered objective"),
    ("algorithm.aggregation=mean", r"algorithm.aggregation: 'mean' is not a registered loss aggregation"),
    ("algorithm.kl_estimator=k4", r"algorithm.kl_estimator: 'k4' is not a registered KL estimator"),
    ("optim.schedule=cosin", r"optim.schedule: 'cosin' is not a registered LR schedule \(did you mean 'cosine'\?\)"),
    ("algorithm.group_size=1", r"algorithm.group_size=1 must be >= 2"),
    ("algorithm.group_size=0", r"algorithm.group_size=0 must be >= 2"),
    ("optim.prompts_per_step=0", r"optim.prompts_per_step=0 must be >= 1"),
    ("max_steps=-1", r"max_steps=-1 must be >= 1"),
    ("optim.micro_batch_size=0", r"optim.micro_batch_size=0 must be >= 1"),
    ("optim.lr=-1e-5", r"optim.lr=-1e-05 must be >= 0"),  # 0 is allowed (tests freeze the weights with it)
    ("algorithm.eps_low=-0.2", r"algorithm.eps_low=-0.2 must be >= 0"),
    ("algorithm.dual_clip=0.5", r"algorithm.dual_clip=0.5 must be > 1"),
    ("optim.betas=[0.9,1.5]", r"optim.betas=\[0.9, 1.5\] must be two numbers in \[0, 1\)"),
    ("optim.lr=.nan", r"optim.lr=nan must be a finite number"),
    ("logging.report_to=[tensorbord]", r"logging.report_to: 'tensorbord' is not one of"),
    ("data.path=nowhere.jsonl", r"data.path: 'nowhere.jsonl' does not exist"),  # replacing the recipe's data.name
    ("algorithm.estimator=median", r"algorithm.group_size=\d+: the median estimator \(MC-GRPO\) draws G\+1 rollouts"),
    ("algorithm.train_extremes=-1", r"algorithm.train_extremes=-1 must be >= 0"),
    ("algorithm.train_extremes=9", r"algorithm.train_extremes=9: the k highest and k lowest rows of a group of "
                                   r"algorithm.group_size=\d+ overlap"),
    ("distributed.shard_modules=[]", r"distributed.shard_modules=\[\]: name at least one block class"),
]


@pytest.mark.parametrize("override, message", BAD, ids=[b[0] for b in BAD])
def test_each_problem_is_named_before_a_model_loads(tmp_path, no_model, override, message):
    import re
    assert re.search(message, problems(tmp_path, override))


def test_all_problems_are_reported_together(tmp_path, no_model):
    text = problems(tmp_path, "algorithm.group_size=1", "optim.micro_batch_size=0", "algorithm.estimator=nope",
                    "rewards.accuracy.args.tolerence=1", "max_steps=-1")
    assert text.startswith("5 problems in the recipe:")
    for key in ("algorithm.group_size", "optim.micro_batch_size", "algorithm.estimator",
                "rewards.accuracy.args.tolerence", "max_steps"):
        assert key in text, key


def test_unknown_keys_are_reported_together_when_parsed():
    with pytest.raises(ConfigError) as info:
        parse_config(TINY_RECIPE, ["policy.x=1", "algorithm.grup_size=2", "optim.lr=fast", "sampling.stratgy=x"])
    text = str(info.value)
    assert "'algorithm.grup_size' (did you mean 'group_size'?)" in text
    assert "optim.lr: expected a number, got 'fast'" in text
    assert "'sampling.stratgy' (did you mean 'strategy'?)" in text


def test_a_good_recipe_passes(tmp_path):
    validate(parse_config(TINY_RECIPE, tiny_overrides(tmp_path)))


def test_a_stage_is_checked_like_the_recipe(tmp_path, no_model):
    """A stage's overrides meet the same ranges, named with the stage's index."""
    message = problems(tmp_path, "stages=[{steps: 2}, {steps: 2, algorithm: {group_size: 1}}]", "max_steps=4")
    assert "stages[1].algorithm.group_size=1 must be >= 2" in message
    assert "stages[0]" not in message


def test_plot_every_zero_draws_the_plot_only_at_the_end(tmp_path):
    """`logging.plot_every: 0` is accepted (the benchmarks' harness sets it) and draws no plot mid-run."""
    from mmrl.train.reporting.tracking import Tracker
    validate(parse_config({**TINY_RECIPE, "logging": {"plot_every": 0}}))
    tracker = Tracker(tmp_path, ["none"], plot_every=0, config={})
    tracker.log(1, {"reward_mean": 0.5})
    assert not (tmp_path / "plots" / "rewards.png").exists()
    tracker.close()
    assert (tmp_path / "plots" / "rewards.png").is_file()


def data_file(tmp_path, prompts):
    import json
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "4"}) + "\n" for p in prompts))
    return ["data.name=null", f"data.path={path}"]


def test_a_number_or_empty_prompt_is_named_by_row_before_the_model_loads(tmp_path, no_weights):
    from mmrl.data import DataError
    with pytest.raises(DataError) as info:
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "run") + data_file(tmp_path, ["2+2=", 42, "", " "])))
    text = str(info.value)
    assert "rows.jsonl: column 'prompt': a prompt is text or a list of chat messages, not int: 1 row(s): row 1 (42)" in text
    assert "rows.jsonl: column 'prompt': empty prompt: 2 row(s): row 2 (''), row 3 (' ')" in text


def test_message_prompts_without_a_chat_template_are_refused_before_the_weights(tmp_path, no_weights):
    from mmrl.data import DataError
    # a system and a user turn stay a message list (one user turn alone becomes its text);
    # tiny:qwen2-char's character tokenizer has no chat template
    messages = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2="}]]
    with pytest.raises(DataError, match=r"column 'prompt': goes through the chat template, and the tokenizer of "
                                        r"'tiny:qwen2-char' has none.*row 0"):
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "run") + data_file(tmp_path, messages)))
    with pytest.raises(DataError, match=r"a message list, but policy.chat_template is false"):
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "run") + data_file(tmp_path, messages)
                             + ["policy.chat_template=false"]))


@pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_a_reporter_whose_package_is_missing_is_refused(tmp_path, no_model):
    assert ("logging.report_to: 'wandb' needs the 'wandb' package, which is not installed"
            in problems(tmp_path, "logging.report_to=[wandb]"))


def test_an_output_dir_nothing_can_be_written_in_is_refused_before_the_data(tmp_path, no_model):
    from mmrl.errors import UserError
    with pytest.raises(UserError, match=r"output_dir '/proc/mmrl-run': '/proc' is not writable"):
        Trainer(parse_config(TINY_RECIPE, ["output_dir=/proc/mmrl-run"]))


def test_a_missing_tool_file_is_blamed_on_the_key_that_names_it(tmp_path, no_model):
    """Not on reward_modules (which the recipe may not even have): each key names its own file."""
    tools = ["policy.episode.tools=[python]", "policy.episode.max_turns=2"]
    text = problems(tmp_path, *tools, "policy.episode.tool_modules=[no_such_tools.py]")
    assert "policy.episode.tool_modules: file 'no_such_tools.py' does not exist" in text
    assert "reward_modules" not in text
    text = problems(tmp_path, "policy.episode.tools=[no_such_tools.py:lookup]")
    assert "policy.episode.tools: file 'no_such_tools.py' does not exist" in text and "reward_modules" not in text
    with pytest.raises(ConfigError, match="^reward_modules: file 'gone.py' does not exist"):
        validate(parse_config(TINY_RECIPE, ["reward_modules=[gone.py]"]))


def test_a_hub_data_set_id_is_not_looked_for_on_disk(tmp_path):
    """The gsm8k recipe names `openai/gsm8k` (docs/data.md: a hub id is a data.path); a missing local
    file or directory is still refused before anything loads."""
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    validate(load_recipe(resolve_recipe("gsm8k"), [f"output_dir={tmp_path}"]))
    for missing in ("nowhere.jsonl", "./nowhere", "data/train/shards"):
        with pytest.raises(ConfigError, match=f"data.path: '{missing}' does not exist"):
            validate(load_recipe(resolve_recipe("gsm8k"), [f"data.path={missing}"]))


def test_an_absurd_learning_rate_is_refused_and_a_large_one_warned_of(tmp_path, no_model, caplog):
    """1e6 (typed for 1e-6) is refused before anything loads unless optim.max_lr allows it; above
    1e-2 the run warns; the shipped recipes' rates are below both."""
    import logging

    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    from mmrl.registry import RECIPES, load_plugins
    from mmrl.train.plan.learning_rates import WARN_ABOVE, learning_rates
    from mmrl.train.plan.stages import StagePlan
    assert ("optim.lr=1000000.0 is above optim.max_lr=1.0: a learning rate this large diverges"
            in problems(tmp_path, "optim.lr=1e6"))
    assert "warm_start.lr=5.0 is above optim.max_lr=1.0" in problems(tmp_path, "warm_start.steps=2", "warm_start.lr=5")
    assert "stages[1].optim.lr=3.0 is above" in problems(tmp_path, "max_steps=2",
                                                         "stages=[{steps: 1}, {steps: 1, optim: {lr: 3}}]")
    warned = []
    validate(parse_config(TINY_RECIPE, ["optim.lr=1e6", "optim.max_lr=1e6"]), warn=warned.append)
    assert warned == ["optim.lr=1000000.0 is above 0.01: fine-tuning rates are 1e-6 to 1e-3 (the tiny CPU models' "
                      "at most 2e-3); a rate this large may train on noise"]
    caplog.set_level(logging.WARNING)
    validate(parse_config(TINY_RECIPE, ["optim.lr=0.05"]))  # the default: the run's log
    assert [r.getMessage()[:20] for r in caplog.records] == ["optim.lr=0.05 is abo"]
    validate(parse_config(TINY_RECIPE, ["optim.lr=2e-3", "warm_start.lr=0.5"]), warn=warned.append)  # no warm start
    assert len(warned) == 1
    load_plugins()
    for name in RECIPES.names():
        cfg = load_recipe(resolve_recipe(name))
        rates = learning_rates(cfg, [stage.config for stage in StagePlan(cfg).stages] if cfg.stages else [])
        assert all(rate <= WARN_ABOVE for rate in rates.values()), (name, rates)
