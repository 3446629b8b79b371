"""The memory plan's groundwork: models built from their configuration without weights
(tasks/model_loading.py `weightless`, `Policy.model_configuration`) and the tracer that counts the
bytes a step's tensors would take (mmrl/experiments/memory_trace.py), checked against the allocation
probe the benchmarks use (scripts/memory_probe.py) on the same work run for real."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mmrl.config.parse import from_dict, load_recipe
from mmrl.experiments.memory_trace import attention_of, tensor_bytes, traced_peak
from mmrl.registry import ADAPTERS

RECIPES = Path(__file__).resolve().parents[1] / "tasks" / "recipes"


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from memory_probe import peak_bytes
    return peak_bytes


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


def test_the_tracer_counts_what_the_probe_measures(probe):
    """A two-layer MLP's forward and backward on a batch: the tracer's peak on the meta device and
    the probe's peak of the same work on the CPU agree within 5%."""
    torch.manual_seed(0)

    def build():
        return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 512))

    real = build()
    x = torch.randn(512, 256)

    def work(model, inputs):
        return lambda: model(inputs).square().mean().backward()

    measured = probe(work(real, x))
    meta, x_meta = build().to("meta"), x.to("meta")
    traced, _, _ = traced_peak(work(meta, x_meta))
    assert traced == pytest.approx(measured, rel=0.05)


def test_attention_on_meta_counts_the_cpu_kernel(probe):
    """Scaled dot-product attention on meta tensors counts what the CPU's fused kernel returns (its
    output and log-sum-exp: 8.5 MB at 2,048 positions), not the [L, L] weights of the plain
    computation (268 MB). The kernel's own scratch is not counted: the probe measures 10-15% more
    (1.2 MB here), the bound this test allows."""
    torch.manual_seed(0)
    batch, heads, length, dim = 4, 4, 2048, 64
    q, k, v = (torch.randn(batch, heads, length, dim) for _ in range(3))
    measured = probe(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
    with attention_of("cpu"):
        traced, _, _ = traced_peak(lambda: torch.nn.functional.scaled_dot_product_attention(
            q.to("meta"), k.to("meta"), v.to("meta"), is_causal=True))
    assert traced == 4 * batch * heads * length * (dim + 1)
    assert traced <= measured <= 1.15 * traced


def test_tensor_bytes_counts_each_storage_once():
    """Two views of one [100, 10] fp32 tensor and a separate int64 [7] tensor: 4,000 + 56 bytes."""
    base = torch.zeros(100, 10)
    record = {"a": base, "b": [base[:5], torch.zeros(7, dtype=torch.long)]}
    assert tensor_bytes(record) == 4000 + 56
