"""LoRA in the rollout worker's modes (docs/async.md#lora-in-the-worker): the worker wraps its copy of
the policy's model with the engine's LoRA (`mmrl.core.lora.with_lora`), as the trainer wraps its own,
takes the whole state dict once, then the adapter's tensors alone after each update; at staleness 0
a LoRA run with the worker is the synchronous run, exactly, and the worker's rollouts equal the
trainer's policy's with the same adapter, bit for bit. Every shipped recipe with a LoRA overlaps."""

import json
import multiprocessing.queues
import pickle
from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE
from test_async import AUDIO_RECIPE, DIFFUSION_RECIPE, DLM_RECIPE, VLM_RECIPE, draws_after_an_update, run

from mmrl.config.parse import ConfigError, load_recipe, parse_config
from mmrl.registry import ADAPTERS, load_plugins, shipped_recipes
from mmrl.train.loop.trainer import Trainer
from mmrl.serving.weights_broadcast import TRAINED, WHOLE
from mmrl.train.plan.validate import validate

LORA = ["optim.lora.r=4", "optim.lora.alpha=8", "optim.lr=0.05"]


@pytest.fixture
def weights_messages(monkeypatch):
    """The ("weights", version, part) messages the trainer puts on the worker's queue."""
    sent, put = [], multiprocessing.queues.Queue.put
    monkeypatch.setattr(multiprocessing.queues.Queue, "put", lambda queue, message, *args: (
        sent.append(message) if message[0] == "weights" else None, put(queue, message, *args))[1])
    return sent


def lora_tensors(trainer) -> dict[str, torch.Tensor]:
    return {name: p for name, p in trainer.unwrapped.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("recipe, keys", [
    (TINY_RECIPE, ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss")),
    (DIFFUSION_RECIPE, ("reward_mean", "reward/mean_red", "loss")),
    pytest.param(DLM_RECIPE, ("reward_mean", "loss"), marks=pytest.mark.slow),  # 25 s
    pytest.param(VLM_RECIPE, ("reward_mean", "completion_length", "loss"), marks=pytest.mark.slow),  # 20 s
    pytest.param(AUDIO_RECIPE, ("reward_mean", "completion_length", "loss"), marks=pytest.mark.slow)],  # 20 s
    ids=["causal_lm", "diffusion", "dlm", "vlm", "audio_lm"])
def test_a_lora_worker_at_staleness_0_is_the_synchronous_run_exactly(tmp_path, recipe, keys, weights_messages,
                                                                     one_torch_thread):
    """one_step_off at max_staleness 0 with a LoRA: the same rollouts, rewards and losses at every step
    and the same adapter, bit for bit; the worker was sent the whole state dict once, then the adapter's
    tensors alone after each update."""
    steps = 2
    sync, sync_lines = run(tmp_path, "sync", *LORA, recipe=recipe, steps=steps)
    weights_messages.clear()
    worker, worker_lines = run(tmp_path, "worker", *LORA, "rollout.mode=one_step_off", "rollout.max_staleness=0",
                               recipe=recipe, steps=steps)
    for a, b in zip(sync_lines, worker_lines, strict=True):
        assert {key: a[key] for key in keys} == {key: b[key] for key in keys}
        assert b["rollout/staleness_max"] == 0.0
    trained = lora_tensors(sync)
    assert trained and all(".lora_" in name for name in trained)
    assert any("lora_B" in name and p.abs().max() > 0 for name, p in trained.items())  # B starts at 0: it trained
    for (name, p), q in zip(sync.unwrapped.state_dict().items(), worker.unwrapped.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    assert weights_messages == [("weights", 0, WHOLE), *[("weights", step, TRAINED) for step in range(1, steps + 1)]]
    layouts = worker.collector.worker.sender.layouts
    buffers = [name for name, _ in worker.unwrapped.named_buffers() if name in worker.unwrapped.state_dict()]
    assert sorted(name for name, _, _ in layouts[TRAINED]) == sorted([*trained, *buffers])


@pytest.mark.parametrize("recipe", [TINY_RECIPE, DIFFUSION_RECIPE], ids=["causal_lm", "diffusion"])
def test_the_lora_worker_draws_as_the_trainers_policy_with_the_same_adapter(tmp_path, recipe, one_torch_thread):
    """Sent the adapter after an update, the worker draws what the trainer's own policy draws with it on
    the same seeds: the same completions and log-probs, bit for bit; the initial adapter draws other
    log-probs, so a transfer that missed the update would fail."""
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}", "rollout.mode=async", *LORA]))
    try:
        initial, drawn, trained, worker = draws_after_an_update(t)
    finally:
        t.release_output_dir()
    assert worker.part == TRAINED and drawn.weights_version.tolist() == [1] * 6
    assert pickle.dumps(drawn.completions) == pickle.dumps(trained.completions)
    assert torch.equal(drawn.rollout_logp, trained.rollout_logp)
    assert not torch.equal(initial.rollout_logp, trained.rollout_logp)


def lora_recipes() -> dict:
    load_plugins()
    recipes = {name: load_recipe(path) for name, path in sorted(shipped_recipes().items())}
    return {name: cfg for name, cfg in recipes.items() if cfg.optim.lora.r > 0}


LORA_RECIPES = lora_recipes()
# refused by the worker for what their policy does, not for their LoRA (docs/async.md#what-the-worker-runs)
FORWARD_PROCESS = {name for name, cfg in LORA_RECIPES.items() if cfg.policy.get("units") == "forward_process"}
# and those whose adapter the worker does not run (Emu3: untested there)
NOT_IN_WORKER = {name for name, cfg in LORA_RECIPES.items() if not ADAPTERS.get(cfg.task).runs_in_rollout_worker}


def test_every_shipped_lora_recipe_validates_with_the_worker(tmp_path, no_model):
    """Each shipped recipe with a LoRA validates with rollout.mode=one_step_off, except DiffusionNFT's
    forward-process units (no behaviour log-probs) and the adapters the worker does not run, each
    refused for that alone."""
    assert {"t2i_flowgrpo", "t2v_wan", "i2v_wan"} <= set(LORA_RECIPES) and "t2i_nft" in FORWARD_PROCESS
    assert NOT_IN_WORKER == {"t2i_emu3"}
    for name in LORA_RECIPES:
        recipe = load_recipe(shipped_recipes()[name], [f"output_dir={tmp_path / name}", "rollout.mode=one_step_off"])
        if name in NOT_IN_WORKER:
            with pytest.raises(ConfigError, match=rf"^rollout.mode=one_step_off with task='{recipe.task}' \(the rollout "
                                                  r"worker runs [a-z_, ]+\)$"):
                validate(recipe)
        elif name in FORWARD_PROCESS:
            with pytest.raises(ConfigError, match=r"^rollout.mode=one_step_off with policy.units=forward_process "
                                                  r"\(no behaviour log-probs to correct stale rows with\)$"):
                validate(recipe)
        else:
            validate(recipe)


# what a two-step smoke run of a recipe may make cheaper, leaving what the worker runs as shipped
SMALLER = ["optim.prompts_per_step=2", "max_steps=2", "save_every=0", "eval.every=0", "logging.progress=false",
           "logging.report_to=[none]"]
SPEECH_JUDGES = Path(__file__).parent / "speech_judges.py"  # tiny CLAP and Whisper in place of hub judges (offline)
DIGIT_REWARDS = Path(__file__).parent / "digit_reward.py"  # the test rewards (loudness: an audio completion's RMS)
SMALLER_FOR = {"dlm_d1": ["policy.gen_length=32", "policy.steps=16", "algorithm.mu=2"],  # 256 tokens, 128 steps, mu 12
               "t2a_stable_audio3": [f"reward_modules=[{SPEECH_JUDGES}]", "rewards.clap.args.model=tiny-clap"],
               "t2a_audioldm2": [f"reward_modules=[{SPEECH_JUDGES}]", "rewards.clap.args.model=tiny-clap"],
               "t2av_ltx2": [f"reward_modules=[{SPEECH_JUDGES}]", "rewards.clap.args.model=tiny-clap"],
               "i2av_ltx2": [f"reward_modules=[{SPEECH_JUDGES}]", "rewards.clap.args.model=tiny-clap"],
               # the tiny Whisper hears the tiny CSM's sound as nothing (every WER 1, no advantage): loudness varies
               "tts_csm": [f"reward_modules=[{SPEECH_JUDGES},{DIGIT_REWARDS}]", "rewards.asr_wer.args.model=tiny-tts-judge",
                           "rewards.loudness.weight=1.0", "policy.max_new_frames=3"],
               "tts_dia": [f"reward_modules=[{SPEECH_JUDGES},{DIGIT_REWARDS}]", "rewards.asr_wer.args.model=tiny-tts-judge",
                           "rewards.loudness.weight=1.0", "policy.max_new_frames=3"],
               "tts_omni_talker": [f"reward_modules=[{SPEECH_JUDGES},{DIGIT_REWARDS}]",
                                   "rewards.asr_wer.args.model=tiny-tts-judge", "rewards.loudness.weight=1.0",
                                   "policy.max_new_tokens=3", "policy.system_prompt="]}


@pytest.mark.slow  # 40-65 s each on 2 loaded cores (a worker process and two steps of the recipe's tiny model)
@pytest.mark.parametrize("name", sorted(set(LORA_RECIPES) - FORWARD_PROCESS - NOT_IN_WORKER))
def test_every_shipped_lora_recipe_trains_two_steps_with_the_worker(tmp_path, name):
    """The recipe (its tiny model, two steps of two prompt groups) with rollout.mode=one_step_off: the
    second step on rows one step old, and the adapter trained."""
    t = Trainer(load_recipe(shipped_recipes()[name], [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                                      *SMALLER, *SMALLER_FOR.get(name, [])]))
    before = {name: p.detach().clone() for name, p in lora_tensors(t).items()}
    t.train()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0]
    assert any(not torch.equal(before[name], p) for name, p in lora_tensors(t).items())
