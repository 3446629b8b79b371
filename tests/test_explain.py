"""Every config field documents itself (help metadata), and `mmrl explain KEY` prints it."""

import dataclasses

import pytest

from mmrl.cli.main import main
from mmrl.config.help import allowed_values, config_classes, explain
from mmrl.config.parse import ConfigError
from mmrl.config.sections import TrainConfig
from mmrl.registry import ADAPTERS


def all_config_classes() -> list[type]:
    return list(config_classes([TrainConfig, *(ADAPTERS.get(n).Config for n in ADAPTERS.names())]))


def fields_without_help(classes) -> list[str]:
    return [f"{cls.__module__}.{cls.__qualname__}.{f.name}" for cls in classes for f in dataclasses.fields(cls)
            if not str(f.metadata.get("help", "")).strip()]


def test_every_config_field_has_help():
    classes = all_config_classes()
    names = {c.__name__ for c in classes}
    # nested sections are reached: a dict value, a section, an adapter's nested dataclass, a base class
    assert {"RewardSpec", "LoraConfig", "StepSchedule", "DLMConfig", "VLMConfig", "AudioLMConfig"} <= names
    assert fields_without_help(classes) == []


def test_missing_help_is_reported():
    @dataclasses.dataclass
    class Inner:
        documented: int = dataclasses.field(default=1, metadata={"help": "a number"})
        bare: int = 2

    @dataclasses.dataclass
    class Outer:
        inner: Inner = dataclasses.field(default_factory=Inner, metadata={"help": "a section"})

    assert fields_without_help(config_classes([Outer])) == [f"{__name__}.{Inner.__qualname__}.bare"]


def test_every_choices_spec_resolves():
    for cls in all_config_classes():
        hints = __import__("typing").get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if "choices" in f.metadata:
                assert allowed_values(f, hints[f.name]), f"{cls.__name__}.{f.name}"


def test_explain_algorithm_key():
    text = explain("algorithm.mu")
    assert text.splitlines()[0] == "algorithm.mu"
    assert "Update passes" in text and "type: int" in text and "default: 1" in text
    std = explain("algorithm.std")
    assert "allowed: group, batch, none" in std
    est = explain("algorithm.estimator")
    allowed = est.split("allowed: ")[1].split(", ")
    assert {"grpo", "dr_grpo", "rloo", "median", "pairwise", "ngrpo", "step"} <= set(allowed)
    assert "closed_form" in explain("algorithm.kl_estimator")


def test_explain_policy_key_of_a_task():
    text = explain("policy.p_mask", task="dlm")
    assert "(task: dlm)" in text and "default: 0.15" in text and "type: float" in text
    kind = explain("policy.schedule.kind", task="diffusion")
    assert "allowed: all_but_last, random_fraction, window, random_window, sliding_window, chunks" in kind
    with pytest.raises(ConfigError, match="policy.p_mask"):
        explain("policy.p_mask")  # causal_lm has no such key


def test_explain_sections_and_dict_entries():
    lora = explain("optim.lora")
    assert "section LoraConfig" in lora and "    r: LoRA rank" in lora
    assert "default: 1.0" in explain("rewards.iou.weight")
    with pytest.raises(ConfigError, match="unknown config key 'algorithm.nope'.*group_size"):
        explain("algorithm.nope")


def test_explain_cli(capsys):
    assert main(["explain", "policy.p_mask", "--task", "dlm"]) == 0
    assert "default: 0.15" in capsys.readouterr().out
    assert main(["explain", "algorithm.nope"]) == 2
    assert "algorithm.nope" in capsys.readouterr().err
