"""DeepSpeed ZeRO-3 (`distributed.strategy: zero3`) over 2 CPU processes (gloo) against one process:
the same rewards, loss and updated weights (a frozen partitioned reference, LoRA, every family);
exact resume after kill -9; a non-finite gradient skips the step; bf16 compute with fp32 master
weights, optimizer state and log-probs. Skipped where DeepSpeed is not installed
(`pip install -e '.[deepspeed]'`).

Tolerances as in test_sharding.py (2e-5 absolute): one process sums each gradient in one backward,
ZeRO-3 sums partial gradients in a reduce-scatter (fp32), so they differ by rounding that AdamW
carries into the weights at about lr x 1e-4; a lost partition, an unaveraged gradient or a wrong
reference moves them by 1e-3 or more.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_distributed import free_port
from test_sharding import FAMILY_RECIPES, HERE, LM, assert_same, check_resumes_exactly_after_kill_9, exported, launch, write

from mmrl.config.parse import ConfigError, load_recipe
from mmrl.distributed import zero3 as zero
from mmrl.train.plan.validate import validate

needs_deepspeed = pytest.mark.skipif(not zero.available(), reason="DeepSpeed is not installed (pip install deepspeed)")
ZERO3 = "distributed.strategy=zero3"


def run_script(tmp_path: Path, source: str, *args: str) -> dict:
    """`source` as a script over 2 processes; the JSON line the main process prints."""
    script = tmp_path / "check.py"
    script.write_text(source)
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), str(script), *args]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads([x for x in done.stdout.splitlines() if x.startswith("{")][0])


@needs_deepspeed
def test_zero3_matches_one_process_with_a_partitioned_reference(tmp_path):
    """Full fine-tune with a KL term (the reference is a frozen ZeRO-3 copy), mu=2 (old log-probs
    from no-grad passes), micro-batches of 3 over groups of 4 (uneven between the processes)."""
    recipe = write(tmp_path, LM)
    one = launch(recipe, tmp_path / "one", processes=1)
    two = launch(recipe, tmp_path / "two", ZERO3)
    assert any(r["kl"] > 0 for r in two)
    assert_same(one, two, exported(tmp_path / "one", 3), exported(tmp_path / "two", 3))
    checkpoint = tmp_path / "two" / "checkpoints" / "step-000003"
    assert sorted(p.name for p in (checkpoint / "pytorch_model").glob("*optim_states.pt")) == [
        "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    from transformers import AutoModelForCausalLM
    loaded = AutoModelForCausalLM.from_pretrained(checkpoint / "model")
    weights = exported(tmp_path / "two", 3)
    assert all(torch.equal(p, weights[f"model.safetensors:{n}"]) for n, p in loaded.state_dict().items()
               if f"model.safetensors:{n}" in weights)


@pytest.mark.slow  # 19 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
@needs_deepspeed
def test_zero3_with_lora_matches_one_process(tmp_path):
    cfg = dict(LM, optim={**LM["optim"], "lr": 1e-2, "lora": {"r": 4, "alpha": 8}})
    recipe = write(tmp_path, cfg)
    one = launch(recipe, tmp_path / "one", "max_steps=2", processes=1)
    two = launch(recipe, tmp_path / "two", ZERO3, "max_steps=2")
    assert_same(one, two, exported(tmp_path / "one", 2), exported(tmp_path / "two", 2))
    assert (tmp_path / "two" / "checkpoints" / "step-000002" / "model" / "adapter_config.json").is_file()


@pytest.mark.slow  # 68 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
@needs_deepspeed
def test_zero3_resumes_exactly_after_kill_9(tmp_path):
    check_resumes_exactly_after_kill_9(tmp_path, "zero3")


NONFINITE_CHECK = r"""
import json, math, sys
from mmrl.config.parse import load_recipe
from mmrl.train.loop.trainer import Trainer
t = Trainer(load_recipe(sys.argv[1], sys.argv[2:]))
param = next(p for p in t.unwrapped.parameters() if p.requires_grad)
param.register_hook(lambda g: g * math.inf if t.step == 1 else g)  # step 2's gradients are not finite
t.train()
if t.accelerator.is_main_process:
    print(json.dumps({"skipped": [json.loads(x)["nonfinite_skipped"] for x in open(sys.argv[3].split("=", 1)[1] + "/metrics.jsonl")]}))
from mmrl.cli.main import exit_without_teardown
exit_without_teardown(0)
"""


@needs_deepspeed
def test_zero3_skips_a_step_with_a_nonfinite_gradient(tmp_path):
    recipe = write(tmp_path, dict(LM, max_steps=3, save_every=1, max_bad_steps=2))
    out = tmp_path / "run"
    report = run_script(tmp_path, NONFINITE_CHECK, str(recipe), ZERO3, f"output_dir={out}")
    assert report["skipped"] == [0.0, 1.0, 0.0]
    w1, w2, w3 = (exported(out, s) for s in (1, 2, 3))
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # step 2 changed nothing
    assert not all(torch.equal(w2[k], w3[k]) for k in w2)  # step 3 trained again


ZERO3_BF16_CHECK = r"""
import json, sys, torch
from mmrl.config.parse import load_recipe
from mmrl.train.loop.trainer import Trainer
t = Trainer(load_recipe(sys.argv[1], sys.argv[2:]))
batch = t.prepare_batch(1)
chunks = t.updater.micro_batches(batch)
old = t.updater.no_grad_logprobs(batch, chunks, reference=False)
ref = t.updater.no_grad_logprobs(batch, chunks, reference=True)
metrics = t.updater.update(batch)
inner = t.model.optimizer
master = inner.fp32_partitioned_groups_flat
state = [v for s in inner.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
whole = sum(p.ds_numel for p in t.unwrapped.parameters())
report = {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "old_dtype": str(old.dtype),
          "ref_dtype": str(ref.dtype), "param_dtypes": sorted({str(p.dtype) for p in t.unwrapped.parameters()}),
          "master_dtypes": sorted({str(p.dtype) for p in master}), "state_dtypes": sorted({str(v.dtype) for v in state}),
          "policy_local": sum(p.ds_tensor.numel() for p in t.unwrapped.parameters()),
          "reference_local": sum(p.ds_tensor.numel() for p in t.reference.parameters()), "whole": whole}
if t.accelerator.is_main_process:
    print(json.dumps(report))
from mmrl.cli.main import exit_without_teardown
exit_without_teardown(0)
"""


@needs_deepspeed
@pytest.mark.slow  # 9.5 s on quiet cores (2026-11-30); fsdp's bf16 test stays in the default run
def test_bf16_under_zero3_computes_in_bf16_with_fp32_master_weights_state_and_logprobs(tmp_path):
    recipe = write(tmp_path, LM)
    report = run_script(tmp_path, ZERO3_BF16_CHECK, str(recipe), f"output_dir={tmp_path / 'run'}", ZERO3,
                        "policy.dtype=bfloat16")
    assert report["param_dtypes"] == ["torch.bfloat16"]  # what forward and backward run in
    assert report["master_dtypes"] == report["state_dtypes"] == ["torch.float32"]  # what the optimizer updates
    assert report["old_dtype"] == report["ref_dtype"] == "torch.float32"
    # each process holds about half of the policy and of the reference (partitions are padded)
    assert report["policy_local"] <= report["whole"] / 2 + 64 and report["reference_local"] <= report["whole"] / 2 + 64
    assert math.isfinite(report["loss"]) and math.isfinite(report["grad_norm"]) and report["grad_norm"] > 0


@needs_deepspeed
@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY_RECIPES))
def test_every_family_trains_under_zero3_as_on_one_process(tmp_path, family):
    cfg = {"rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": [str(HERE / "digit_reward.py")],
           "algorithm": {"group_size": 3, "beta": 0.04}, "logging": {"report_to": ["none"], "progress": False},
           "max_steps": 2, **FAMILY_RECIPES[family]}
    recipe = write(tmp_path, cfg)
    one = launch(recipe, tmp_path / "one", processes=1)
    two = launch(recipe, tmp_path / "two", ZERO3)
    assert any(r["loss"] != 0 for r in one)
    assert_same(one, two, exported(tmp_path / "one", 2), exported(tmp_path / "two", 2))


@pytest.mark.parametrize("override,message", [
    ("warm_start.steps=5", "warm_start.steps=5 with distributed.strategy=zero3"),
    ("policy.dtype=float16", "policy.dtype='float16' with distributed.strategy=zero3"),
    ("policy.rollout_engine=vllm", "policy.rollout_engine='vllm' with distributed.strategy=zero3"),
])
def test_zero3_recipe_problems_are_named_before_anything_loads(tmp_path, override, message):
    recipe = write(tmp_path, LM)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate(load_recipe(recipe, [ZERO3, override]))


@pytest.mark.slow  # 44 s in the default run on 2 cores beside two demos (2026-11-29); the default run stays under 15 min
@needs_deepspeed
def test_accelerate_zero3_launcher_config_trains_the_same(tmp_path):
    """`accelerate launch --config_file scripts/accelerate/zero3.yaml` runs the recipe under ZeRO-3:
    the same metrics and weights as `distributed.strategy=zero3` under torchrun."""
    import yaml
    recipe = write(tmp_path, dict(LM, max_steps=2))
    config = yaml.safe_load((HERE.parent / "scripts" / "accelerate" / "zero3.yaml").read_text())
    config.update(num_processes=2, main_process_port=free_port())
    (tmp_path / "zero3.yaml").write_text(yaml.safe_dump(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(tmp_path / "zero3.yaml"),
           "-m", "mmrl", "train", str(recipe), f"output_dir={tmp_path / 'acc'}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    via_accelerate = [json.loads(x) for x in (tmp_path / "acc" / "metrics.jsonl").read_text().splitlines()]
    via_torchrun = launch(recipe, tmp_path / "torchrun", ZERO3)
    assert_same(via_torchrun, via_accelerate, exported(tmp_path / "torchrun", 2), exported(tmp_path / "acc", 2))
    assert (tmp_path / "acc" / "checkpoints" / "step-000002" / "pytorch_model").is_dir()


def test_an_accelerate_deepspeed_launcher_config_becomes_the_recipe_settings():
    from mmrl.distributed.launcher import launcher_settings
    from mmrl.errors import UserError
    env = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3",
           "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "none", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "none"}
    assert launcher_settings(env) == {"distributed.strategy": "zero3"}
    assert launcher_settings({**env, "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}) == {
        "distributed.strategy": "zero3", "distributed.offload": True}
    with pytest.raises(UserError, match="zero_stage 2"):
        launcher_settings({**env, "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"})
    with pytest.raises(UserError, match="deepspeed_config_file"):
        launcher_settings({**env, "ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds.json"})
