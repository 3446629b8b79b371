"""The prompt_enhancer reward: a frozen tiny pipeline draws each completion and an image reward
scores the drawing; the recipe trains a tiny language policy on it on a CPU."""

import pytest
import torch
import yaml

from mmrl.config.parse import ConfigError, load_recipe
from mmrl.config.recipes import resolve_recipe
from mmrl.core.scoring import get_reward
from mmrl.rewards.colour_shape import colour_shape_score
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.prompt_enhancer import text_seed
from mmrl.train.loop.trainer import Trainer


def recipe_args():
    data = yaml.safe_load(resolve_recipe("prompt_enhancer").read_text())
    return data["rewards"]["prompt_enhancer"]["args"]


def test_the_reward_is_the_image_rewards_score_of_the_frozen_pipelines_drawing():
    args = recipe_args()
    texts = ["red circle, bold", "a blue square", "zz"]
    columns = {"colour": ["red", "blue", "green"], "shape": ["circle", "square", "circle"]}
    got = get_reward("prompt_enhancer")(["p"] * 3, texts, **args, **columns)
    pipe = DiffusionPolicy(DiffusionConfig(**args["generator"]))  # a second copy, drawn one text at a time
    expected = []
    for text, colour, shape in zip(texts, columns["colour"], columns["shape"]):
        image = pipe.rollout([text], 1, [text_seed(0, text)], greedy=True).completions[0]
        expected.append(colour_shape_score(image, colour, shape, area=tuple(args["image_reward_args"]["area"])))
    assert got == pytest.approx(expected, abs=1e-6)
    alone = get_reward("prompt_enhancer")(["p"], texts[1:2], **args, colour=["blue"], shape=["square"])
    assert alone == pytest.approx(got[1:2], abs=1e-6)  # the same image in any batch


def test_an_unknown_generator_setting_is_named():
    args = recipe_args()
    args["generator"]["num_step"] = 3
    with pytest.raises(ConfigError, match="rewards.prompt_enhancer.args.generator.num_step"):
        get_reward("prompt_enhancer")(["p"], ["x"], **args, colour=["red"], shape=["circle"])


def test_the_recipe_trains_a_language_policy_on_a_cpu(tmp_path):
    cfg = load_recipe(resolve_recipe("prompt_enhancer"), [f"output_dir={tmp_path}", "max_steps=2",
                                                          "logging.progress=false"])
    t = Trainer(cfg)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    rewards = [t.train_step()["reward/prompt_enhancer"] for _ in range(2)]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())
