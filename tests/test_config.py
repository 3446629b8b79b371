"""Recipes: YAML -> typed dataclasses, dotted overrides, errors that name the key."""

import pytest

from mmrl.config.parse import ConfigError, load_recipe, parse_config
from mmrl.config.sections import TrainConfig


def test_overrides_reach_nested_fields_with_types():
    cfg = parse_config({"algorithm": {"beta": 0.0}}, ["algorithm.beta=0.04", "optim.lora.r=16", "seed=3",
                                                      "sampling.dynamic=true", "algorithm.chunks=[2,3]"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.algorithm.beta == 0.04 and cfg.optim.lora.r == 16 and cfg.seed == 3
    assert cfg.sampling.dynamic is True and cfg.algorithm.chunks == [2, 3]


def test_ints_are_accepted_for_floats_but_not_the_reverse():
    assert parse_config({"optim": {"lr": 1}}).optim.lr == 1.0
    with pytest.raises(ConfigError, match="max_steps"):
        parse_config({"max_steps": 1.5})


def test_unknown_keys_are_named_with_their_path():
    with pytest.raises(ConfigError, match="'algorithm.betta'"):
        parse_config({}, ["algorithm.betta=0.1"])
    with pytest.raises(ConfigError, match="'nonsense'"):
        parse_config({"nonsense": 1})


def test_an_override_that_is_not_yaml_is_named_not_a_traceback():
    with pytest.raises(ConfigError, match=r"override 'algorithm.group_size=\[1,2'.*not valid YAML"):
        parse_config({}, ["algorithm.group_size=[1,2"])


def test_wrong_types_and_choices_are_named():
    with pytest.raises(ConfigError, match="algorithm.std"):
        parse_config({}, ["algorithm.std=sometimes"])
    with pytest.raises(ConfigError, match="resume"):
        parse_config({}, ["resume=maybe"])
    with pytest.raises(ConfigError, match="rewards.accuracy.weight"):
        parse_config({"rewards": {"accuracy": {"weight": "heavy"}}})
    with pytest.raises(ConfigError, match="key=value"):
        parse_config({}, ["algorithm.beta"])


def test_a_data_path_override_replaces_the_recipes_data_set_and_the_reverse(tmp_path):
    """The t2v / i2v headers' `data.path=prompts.jsonl` over a recipe naming `data.name`: the file
    replaces the registered set (and its builder's args), whichever one the recipe gave."""
    from mmrl.config.recipes import resolve_recipe
    for recipe in ("t2v_wan", "i2v_wan"):
        cfg = load_recipe(resolve_recipe(recipe), ["data.path=prompts.jsonl"])
        assert (cfg.data.name, cfg.data.path, cfg.data.args) == (None, "prompts.jsonl", {})
    named = {"data": {"name": "arithmetic", "args": {"n_train": 8}}}
    assert parse_config(named, ["data.path=a.jsonl", "data.args={n: 1}"]).data.args == {"n": 1}  # given: kept
    assert parse_config(named, ["data.path=null"]).data.name == "arithmetic"  # clearing the path replaces nothing
    cfg = parse_config({"data": {"path": "a.jsonl"}}, ["data.name=arithmetic"])
    assert (cfg.data.name, cfg.data.path) == ("arithmetic", None)
    assert parse_config(named).data.name == "arithmetic"  # only an override replaces
    # a recipe that gives both is still refused, naming both
    from mmrl.train.plan.validate import validate
    rows = tmp_path / "a.jsonl"
    rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    both = parse_config({**named, "rewards": {"accuracy": {}}}, [f"data.path={rows}", "data.name=arithmetic"])
    with pytest.raises(ConfigError, match=r"give exactly one of data.name .* or data.path \(got name='arithmetic'"):
        validate(both)


def test_overrides_do_not_mutate_the_loaded_mapping():
    raw = {"algorithm": {"beta": 0.0}}
    parse_config(raw, ["algorithm.beta=1.0"])
    assert raw["algorithm"]["beta"] == 0.0


def test_shipped_recipes_parse():
    """Every shipped recipe parses, and every name in it resolves: the adapter (whose Config takes
    the policy section), the rewards, the estimator, objective, aggregation and KL estimator."""
    from mmrl.config.parse import from_dict
    from mmrl.core.estimators import ADVANTAGE_ESTIMATORS
    from mmrl.core.objectives import AGGREGATIONS, OBJECTIVES
    from mmrl.core.regularisers import CLOSED_FORM_KL, KL_ESTIMATORS
    from mmrl.core.scoring import REWARDS
    from mmrl.registry import ADAPTERS, RECIPES
    names = RECIPES.names()
    assert {"text_demo", "grounding", "t2i_demo", "dlm_demo"} <= set(names)
    for name in names:
        cfg = load_recipe(RECIPES.get(name))
        assert cfg.task in ADAPTERS, (name, cfg.task)
        policy_cfg = from_dict(ADAPTERS.get(cfg.task).Config, cfg.policy, "policy")
        models = [getattr(policy_cfg, "model", "")] if cfg.task != "composite" else [
            cfg.policy[part].get("model") for part in ("thinker", "generator")]  # a composite: each part's
        assert all(models), f"recipe {name} names no policy.model"
        assert cfg.rewards, f"recipe {name} has no reward"
        assert not cfg.reward_modules, f"shipped recipe {name} needs a user module"
        for reward in cfg.rewards:
            assert reward in REWARDS, (name, reward)
        algo = cfg.algorithm
        assert algo.estimator in ADVANTAGE_ESTIMATORS and algo.objective in OBJECTIVES, name
        assert algo.aggregation in AGGREGATIONS, name
        assert algo.kl_estimator in KL_ESTIMATORS or algo.kl_estimator == CLOSED_FORM_KL, name
        assert (cfg.data.name is None) != (cfg.data.path is None), f"recipe {name}: data.name or data.path"


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_recipe(tmp_path / "nope.yaml")


def test_a_section_given_twice_is_refused_naming_file_key_and_both_lines(tmp_path):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("task: causal_lm\nalgorithm:\n  group_size: 2\n  beta: 0.04\nmax_steps: 3\n"
                      "algorithm:\n  eps_high: 0.3\n")
    with pytest.raises(ConfigError) as e:
        load_recipe(recipe)
    assert str(e.value) == f"{recipe}: key 'algorithm' is given twice, on line 2 and on line 6; give it once"


def test_a_key_given_twice_deep_inside_a_stage_is_named_by_its_path(tmp_path):
    recipe = tmp_path / "stages.yaml"
    recipe.write_text("stages:\n  - steps: 2\n  - steps: 3\n    policy:\n      max_new_tokens: 8\n"
                      "      max_new_tokens: 16\n")
    with pytest.raises(ConfigError, match=r"key 'stages\[1\].policy.max_new_tokens' is given twice, "
                                          r"on line 5 and on line 6"):
        load_recipe(recipe)


def test_distinct_keys_anchors_and_merges_still_load():
    from mmrl.config.yaml_files import load_yaml
    text = "a: &x {b: 1}\nc: {<<: *x, d: 2}\ne: {1: one, '1': text}\n"
    assert load_yaml(text) == {"a": {"b": 1}, "c": {"b": 1, "d": 2}, "e": {1: "one", "1": "text"}}


def test_an_override_value_that_gives_a_key_twice_is_refused():
    with pytest.raises(ConfigError, match=r"override 'stages=\[\{steps: 2, steps: 3\}\]': key 'stages\[0\].steps' is given twice"):
        parse_config({}, ["stages=[{steps: 2, steps: 3}]"])


@pytest.mark.parametrize("override, expected", [
    ("num_generations=8", "unknown config key 'num_generations': num_generations is TRL's name; mmrl's is "
                          "algorithm.group_size (docs/from-trl-verl.md)"),
    ("algorithm.loss_type=dapo", "loss_type is TRL's name; mmrl's is algorithm.aggregation"),
    ("learning_rate=1e-6", "learning_rate is TRL's name; mmrl's is optim.lr"),
    ("actor_rollout_ref.rollout.n=8", "unknown config key 'actor_rollout_ref': actor_rollout_ref.rollout.n is verl's "
                                      "name; mmrl's is algorithm.group_size"),
    ("data.max_prompt_length=512", "data.max_prompt_length is verl's name; mmrl's is policy.max_prompt_length"),
    ("actor_rollout_ref.actor.clip_ratio=0.2", "mmrl's is algorithm.eps_low (and algorithm.eps_high)"),
])
def test_trl_and_verl_names_are_answered_with_mmrl_keys(override, expected):
    with pytest.raises(ConfigError) as e:
        parse_config({}, [override])
    assert expected in str(e.value)


def test_verl_sections_name_every_known_setting_in_them():
    recipe = {"actor_rollout_ref": {"actor": {"kl_loss_coef": 0.04, "ppo_epochs": 2}}}
    with pytest.raises(ConfigError) as e:
        parse_config(recipe)
    assert ("actor_rollout_ref.actor.kl_loss_coef is verl's name; mmrl's is algorithm.beta; "
            "actor_rollout_ref.actor.ppo_epochs is verl's name; mmrl's is algorithm.mu") in str(e.value)


def test_other_unknown_keys_point_to_the_table():
    with pytest.raises(ConfigError) as e:
        parse_config({}, ["algorithm.grup_size=3"])
    assert "(did you mean 'group_size'?); TRL's and verl's names: docs/from-trl-verl.md" in str(e.value)
