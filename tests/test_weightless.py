"""Models built from their configuration without weights, as `mmrl plan` builds them
(tasks/model_loading.py `weightless`, `Policy.model_configuration`)."""

from __future__ import annotations

from pathlib import Path

from mmrl.config.parse import from_dict, load_recipe
from mmrl.registry import ADAPTERS

RECIPES = Path(__file__).resolve().parents[1] / "tasks" / "recipes"


def text_policy_config():
    cfg = load_recipe(RECIPES / "text_demo.yaml")
    adapter = ADAPTERS.get(cfg.task)
    return adapter, from_dict(adapter.Config, cfg.policy, "policy")


def test_the_configuration_comes_without_weights():
    """The tiny text model's configuration is the one its recipe asks for (hidden 128, 2 layers)."""
    adapter, policy_cfg = text_policy_config()
    config = adapter.model_configuration(policy_cfg)
    assert (config.hidden_size, config.num_hidden_layers) == (128, 2)


def test_a_weightless_policy_holds_its_parameters_on_the_meta_device():
    """Every parameter of the weightless build is on meta, with the shapes of the real build."""
    from mmrl.tasks.model_loading import weightless
    adapter, policy_cfg = text_policy_config()
    real = adapter(policy_cfg)
    with weightless():
        meta = adapter(policy_cfg)
    real_shapes = {name: p.shape for name, p in real.model.named_parameters()}
    meta_shapes = {name: p.shape for name, p in meta.model.named_parameters()}
    assert meta_shapes == real_shapes
    assert all(p.is_meta for p in meta.model.parameters())
