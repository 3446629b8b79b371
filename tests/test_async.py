"""Asynchronous rollouts (docs/async.md): each row's weights version and the staleness statistics,
the decoupled (proximal) objective against hand-written references."""

import json
import math
import multiprocessing.queues
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.objectives import policy_loss
from mmrl.core.rollout import Rollout, staleness_metrics
from mmrl.core.rollout_correction import importance_weights
from mmrl.errors import UserError
from mmrl.registry import ADAPTERS, import_user_module
from mmrl.tasks.lm.causal_lm import CausalLMPolicy
from mmrl.train.loop.trainer import Trainer
from mmrl.train.placement.rollout_worker import RolloutWorker, RolloutWorkerDied
from mmrl.serving.weights_broadcast import backend_for
from mmrl.train.plan.validate import validate


def trainer(tmp_path, *overrides):
    return Trainer(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *overrides]))


def test_staleness_metrics_against_hand_counts():
    metrics = staleness_metrics(torch.tensor([3, 2, 2, 0]), 3)  # 0, 1, 1, 3 steps behind
    assert metrics == {"rollout/staleness_mean": 1.25, "rollout/staleness_max": 3.0}
    assert staleness_metrics(torch.zeros(0, dtype=torch.long), 3) == {}


def test_the_version_is_kept_through_select_and_concat():
    def rollout(version):
        r = Rollout(torch.tensor([0, 0]), ["p", "p"], ["a", "b"], torch.ones(2, 3))
        r.stamp_version(version)
        return r
    both = Rollout.concat([rollout(4), rollout(7)])
    assert both.weights_version.tolist() == [4, 4, 7, 7]
    assert both.select([3, 0]).weights_version.tolist() == [7, 4]


def test_every_row_carries_the_weights_it_was_drawn_by_and_the_step_logs_staleness(tmp_path):
    t = trainer(tmp_path)
    metrics = t.train_step()
    assert metrics["rollout/staleness_mean"] == metrics["rollout/staleness_max"] == 0.0
    batch = t.prepare_batch(2)  # drawn by the weights after one update
    assert batch.rollout.weights_version.tolist() == [1] * len(batch.rollout)
    assert batch.metrics["rollout/staleness_max"] == 0.0


@pytest.mark.parametrize("kind", ["tis", "mis"])
def test_decoupled_loss_against_a_hand_computed_reference(kind):
    """Two rows of two units drawn by stale weights (behaviour), the proximal log-probs of the
    weights before the update, the current ones: the clip is on theta / proximal, the weight
    proximal / behaviour, capped at 2 (TIS) or dropped above it (MIS)."""
    cfg = AlgorithmConfig(eps_low=0.2, eps_high=0.2)
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -0.3]])
    proximal = torch.tensor([[-1.2, -0.5], [-1.8, -0.3]])
    behaviour = torch.tensor([[-1.0, -1.6], [-1.8, -0.2]])
    adv, mask, weights = torch.tensor([1.0, -0.5]), torch.ones(2, 2), torch.full((2, 2), 0.25)
    w, capped = importance_weights(proximal, behaviour, kind, 2.0)
    terms = policy_loss(logp, proximal, adv, mask, weights, cfg, is_weight=w)
    # row 0 (A = 1): unit 0 ratio e^0.2 > 1.2, clipped: -1.2, weight e^-0.2;
    #                unit 1 ratio 1: -1, weight e^1.1 > 2 (TIS: 2, MIS: 0)
    # row 1 (A = -0.5): unit 0 ratio e^-0.2 < 0.8, unclipped side larger: 0.5 e^-0.2, weight 1;
    #                   unit 1 ratio 1: 0.5, weight e^-0.1
    second = -2.0 if kind == "tis" else 0.0
    expected = (-1.2 * math.exp(-0.2) + second + 0.5 * math.exp(-0.2) + 0.5 * math.exp(-0.1)) / 4
    assert terms.loss.item() == pytest.approx(expected, abs=1e-6)
    assert capped.tolist() == [[False, True], [False, False]]


def test_the_clip_of_stale_rows_is_against_the_current_weights(tmp_path):
    """A batch drawn before an update and trained after it: the proximal log-probs are the
    updated weights' (recomputed), so the logged gap to the behaviour log-probs is the staleness's,
    measured here with the policy's own forward."""
    t = trainer(tmp_path, "algorithm.rollout_correction=tis", "algorithm.mu=2", "optim.lr=0.05")
    stale = t.prepare_batch(1)
    t.updater.update(t.prepare_batch(1))  # the weights move one step
    rows = (stale.row_mask & (stale.advantages != 0)).nonzero().flatten()
    r = stale.rollout.select(rows)
    with torch.no_grad():
        current, _ = t.policy.logprobs(t.model, r, slice(None))
    gap = (current.float() - r.rollout_logp).abs()[r.unit_mask.bool()]
    assert gap.max() > 1e-3  # the update moved the log-probs: the comparison can fail
    metrics = t.updater.update(stale)
    assert metrics["rollout/logp_diff_mean"] == pytest.approx(float(gap.mean()), rel=1e-3)
    assert metrics["rollout/logp_diff_max"] == pytest.approx(float(gap.max()), rel=1e-3)


def run(tmp_path, name, *overrides, steps=3, recipe=TINY_RECIPE):
    out = tmp_path / name
    t = Trainer(parse_config(recipe, [f"output_dir={out}", f"max_steps={steps}", "algorithm.rollout_correction=tis",
                                      *overrides]))
    t.train()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return t, lines


def assert_same_run(sync, sync_lines, worker, worker_lines, keys):
    """The same rollouts (lengths, rewards), losses and weights, step by step."""
    for a, b in zip(sync_lines, worker_lines, strict=True):
        for key in keys:
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert b["rollout/staleness_max"] == 0.0
    for (name, p), q in zip(sync.unwrapped.named_parameters(), worker.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_a_worker_at_staleness_0_is_the_synchronous_run(tmp_path, mode):
    """The worker waits for the newest weights: the same rollouts (lengths, rewards), losses and weights."""
    sync, sync_lines = run(tmp_path, "sync")
    worker, worker_lines = run(tmp_path, "worker", f"rollout.mode={mode}", "rollout.max_staleness=0")
    assert_same_run(sync, sync_lines, worker, worker_lines,
                    ("reward_mean", "reward/accuracy", "reward/digit_share", "completion_length", "loss"))


DIFFUSION_RECIPE = {
    "task": "diffusion", "policy": {"model": "tiny:sd3", "height": 32, "width": 32, "num_steps": 4,
                                    "eval_num_steps": 4, "noise_level": 0.7,
                                    "schedule": {"kind": "sliding_window", "size": 1, "shift_every": 1}},
    "data": {"name": "colour_shapes", "args": {"n_train": 8, "n_eval": 2, "size": 32}},
    "rewards": {"mean_red": {"weight": 1.0}}, "reward_modules": [str(Path(__file__).parent / "image_reward.py")],
    "algorithm": {"group_size": 3}, "optim": {"lr": 1e-3, "prompts_per_step": 2, "micro_batch_size": 3},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}


@pytest.mark.slow  # 11 s on quiet cores (2026-11-30); the LoRA worker's diffusion case at staleness 0 stays in the default run
def test_async_diffusion_at_staleness_0_is_the_synchronous_run(tmp_path):
    """The worker builds the same pipeline from the recipe and samples each group from its seed, with
    the SDE window of the step it is asked for (it moves every step): the same images' rewards,
    losses and denoiser weights."""
    sync, sync_lines = run(tmp_path, "sync", recipe=DIFFUSION_RECIPE, steps=2)
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0",
                               recipe=DIFFUSION_RECIPE, steps=2)
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines, ("reward_mean", "reward/mean_red", "loss"))


DLM_RECIPE = {
    "task": "dlm", "policy": {"model": "tiny:dlm-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
                              "gen_length": 8, "block_length": 4, "steps": 4},
    "data": {"name": "arithmetic", "args": {"n_train": 32, "n_eval": 4, "digits": 1}},
    "rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": TINY_RECIPE["reward_modules"],
    "algorithm": {"group_size": 4}, "optim": {"lr": 1e-3, "prompts_per_step": 3, "micro_batch_size": 12},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}


def test_async_dlm_at_staleness_0_is_the_synchronous_run(tmp_path):
    """The worker decodes each group from its seed with the newest weights and keeps the seeds of the
    estimator's masks: the same completions' rewards, losses and weights."""
    sync, sync_lines = run(tmp_path, "sync", recipe=DLM_RECIPE)
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0", recipe=DLM_RECIPE)
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines, ("reward_mean", "reward/digit_share", "loss"))


VLM_RECIPE = {
    "task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2,
                                                                         "vision_hidden": 16},
                              "max_new_tokens": 6},
    "data": {"name": "shapes", "args": {"n_train": 16, "n_eval": 2, "size": 56}},
    "rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": TINY_RECIPE["reward_modules"],
    "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2, "micro_batch_size": 6},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}

AUDIO_RECIPE = {
    "task": "audio_lm", "policy": {"model": "tiny:qwen2-audio-char",
                                   "tiny_args": {"hidden": 32, "layers": 1, "heads": 2, "audio_hidden": 16,
                                                 "max_seconds": 1},
                                   "max_new_tokens": 6},
    "data": {"name": "tones", "args": {"n_train": 16, "n_eval": 2}},
    "rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": TINY_RECIPE["reward_modules"],
    "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2, "micro_batch_size": 6},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}


VIDEO_RECIPE = {  # T-GRPO: each group with a video is followed by auxiliary rows drawn with its frames shuffled
    "task": "vlm", "policy": {"model": "tiny:qwen2.5-vl-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2,
                                                                         "vision_hidden": 16},
                              "max_new_tokens": 6, "num_frames": 4, "shuffled_rollouts": 2,
                              "video_min_pixels": 28 * 28, "video_max_pixels": 56 * 56},
    "data": {"name": "moving_dot", "args": {"n_train": 16, "n_eval": 2, "frames": 6, "size": 56}},
    "rewards": {"digit_share": {"weight": 1.0}, "t_grpo": {"weight": 1.0, "args": {"accuracy_args": {"mode": "choice"}}}},
    "reward_modules": TINY_RECIPE["reward_modules"],
    "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2, "micro_batch_size": 6},
    "logging": {"report_to": ["none"], "progress": False}, "seed": 0}


@pytest.mark.parametrize("recipe, keys", [  # the video case is slow (the image and audio cases cover the worker's media)
    (VLM_RECIPE, ()), (AUDIO_RECIPE, ()),
    pytest.param(VIDEO_RECIPE, ("reward/t_grpo", "auxiliary/reward/digit_share"), marks=pytest.mark.slow)],
    ids=["vlm", "audio_lm", "vlm_video_t_grpo"])
def test_async_multimodal_at_staleness_0_is_the_synchronous_run(tmp_path, recipe, keys, one_torch_thread):
    """The worker builds the model and its processor from the recipe and is sent each row with its
    image (a PIL image), clip (a sample array) or video (frames): the same completions' rewards (the
    shuffled rows' too), losses and weights."""
    sync, sync_lines = run(tmp_path, "sync", recipe=recipe, steps=2)
    worker, worker_lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0",
                               recipe=recipe, steps=2)
    assert any(x["loss"] != 0 for x in sync_lines)
    assert_same_run(sync, sync_lines, worker, worker_lines,
                    ("reward_mean", "reward/digit_share", "completion_length", "loss", *keys))


def test_an_episode_policy_in_the_worker_logs_its_counts_as_the_synchronous_run(tmp_path, one_torch_thread):
    """The episodes, turns and tool calls are counted by the policy that generates (the worker's) and
    logged with the step that takes its rollouts: the same `policy/*` counts as the synchronous run."""
    tools = ["policy.model=tiny:qwen2-chat-char", f"policy.episode.tools=[{Path(__file__).parent}/episode_tools.py:add]",
             "policy.episode.max_turns=2", "policy.episode.max_tokens=16"]
    sync, sync_lines = run(tmp_path, "sync", *tools, steps=2)
    worker, worker_lines = run(tmp_path, "worker", *tools, "rollout.mode=async", "rollout.max_staleness=0", steps=2)
    assert sync_lines[0]["policy/episodes"] == 16
    assert_same_run(sync, sync_lines, worker, worker_lines,
                    ("reward_mean", "loss", "policy/episodes", "policy/episode_turns", "policy/truncated_episodes"))


def test_async_keeps_every_row_within_max_staleness(tmp_path):
    """Two steps asked ahead: step k's rows are at most min(k - 1, 2) steps old, none dropped."""
    t, lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=2", steps=4)
    assert [x["rollout/staleness_max"] <= min(x["step"] - 1, 2) for x in lines] == [True] * 4
    assert [x["rollout/stale_dropped"] for x in lines] == [0.0] * 4
    assert not t.collector.worker.process.is_alive() and not t.collector.prefetched


def test_async_asks_max_staleness_steps_ahead_and_a_resumed_run_draws_the_same_prompts(tmp_path):
    """max_staleness 2: after step k the prompts of steps k+1 and k+2 are drawn and asked for (none
    beyond max_steps). A run resumed from step 2's checkpoint holds the prompts drawn ahead and the
    sampler's state (the outcomes of every collected step learnt), and draws step 5 as the run does."""
    t = trainer(tmp_path, "rollout.mode=async", "rollout.max_staleness=2", "max_steps=4", "save_every=0")
    t.collector.worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        for ahead in ([2, 3], [3, 4]):
            t.train_step()
            assert sorted(t.collector.prefetched) == ahead
            assert [s for s in range(6) if t.collector.worker.asked_for(s)] == ahead
        t.save_checkpoint()
        t.release_output_dir()
        resumed = trainer(tmp_path, "rollout.mode=async", "rollout.max_staleness=2", "max_steps=4", "resume=true")
        assert resumed.step == 2 and resumed.collector.prefetched == t.collector.prefetched
        assert resumed.inputs.sampler.state_dict() == t.inputs.sampler.state_dict()
        assert resumed.inputs.sampler.draw(5, 4) == t.inputs.sampler.draw(5, 4)
        resumed.release_output_dir()
        t.train_step()
        assert sorted(t.collector.prefetched) == [4]  # step 5 is beyond max_steps
    finally:
        t.collector.worker.stop()


@pytest.mark.parametrize("stale_rows", ["drop", "keep"])
def test_rows_older_than_max_staleness_are_dropped_or_kept(tmp_path, stale_rows):
    """max_staleness 0, weights every 4 updates: steps 2-4's rows are drawn by the initial weights, 1-3
    steps older than allowed: drop leaves all 16 of each out (three steps in a row that train nothing,
    which is not a reward that never applies), keep trains them."""
    t, lines = run(tmp_path, "worker", "rollout.mode=async", "rollout.max_staleness=0", "rollout.weights_every=4",
                   f"rollout.stale_rows={stale_rows}", steps=4)
    rows = 4 * 4  # prompts_per_step x group_size
    if stale_rows == "drop":
        assert [x["rollout/stale_dropped"] for x in lines] == [0.0, rows, rows, rows]
        assert [x["sampling/groups"] for x in lines] == [4.0, 0.0, 0.0, 0.0]
        assert [x["loss"] for x in lines[1:]] == [0.0] * 3
    else:
        assert [x["rollout/stale_dropped"] for x in lines] == [0.0] * 4
        assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0, 2.0, 3.0]
        assert all(x["loss"] != 0.0 for x in lines[1:])


def test_a_row_that_cannot_be_sent_to_the_worker_is_an_error_not_a_wait(tmp_path):
    """A row with an open file in its image column cannot pickle: asking for it fails at once, naming
    the step (the queue's feeder thread would drop the request, and the trainer would wait forever)."""
    t = trainer(tmp_path, "rollout.mode=async")
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        with open(__file__) as image, pytest.raises(UserError, match=r"the data rows of step 3 \(groups from 0\) "
                                                                  r"cannot be sent to the rollout worker: TypeError"):
            worker.ask((3, 0, 0), [{**t.inputs.train_rows[0], "image": image}], 4, [1])
        drawn = worker.take((3, 0, 0), [t.inputs.train_rows[0]], 4, [1])  # the worker still serves the next request
        assert len(drawn) == 4
    finally:
        worker.stop()
    t.release_output_dir()


def test_one_step_off_trains_on_rows_one_step_old(tmp_path):
    t, lines = run(tmp_path, "worker", "rollout.mode=one_step_off")
    assert [x["rollout/staleness_max"] for x in lines] == [0.0, 1.0, 1.0]  # the first step's rows: the initial weights
    assert not t.collector.worker.process.is_alive()


def draws_after_an_update(t):
    """Two rows' groups of 3 drawn by the trainer's policy on seeds 11 and 12 before one synchronous
    step, then after it by a worker sent the updated weights and by the trainer's policy itself:
    (initial, drawn by the worker, trained, the stopped worker)."""
    rows, seeds = [t.inputs.train_rows[i] for i in range(2)], [11, 12]
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        initial = t.policy.rollout(rows, 3, seeds)
        t.train_step()  # synchronous: the test's worker is not the run's
        worker.send_weights(t.unwrapped, 1)
        drawn = worker.take((2, 0, 0), rows, 3, seeds)
        t.policy.set_training_step(2)
        trained = t.policy.rollout(rows, 3, seeds)
    finally:
        worker.stop()
    return initial, drawn, trained, worker


def test_the_worker_draws_from_the_trained_weights_bit_for_bit(tmp_path):
    """The worker, sent the weights after an update, draws the same completions with the same
    log-probs, bit for bit, as the trainer's policy on one torch thread (the worker's); the initial
    weights draw other log-probs, so a transfer that missed the update would fail."""
    t = trainer(tmp_path, "rollout.mode=async", "optim.lr=0.05")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        initial, drawn, trained, _ = draws_after_an_update(t)
    finally:
        torch.set_num_threads(threads)
    assert drawn.completions == trained.completions and drawn.weights_version.tolist() == [1] * 6
    assert torch.equal(drawn.rollout_logp, trained.rollout_logp)
    assert initial.completions != trained.completions or not torch.equal(initial.rollout_logp, trained.rollout_logp)


def test_a_cpu_trainer_gives_the_worker_one_of_its_threads_while_it_runs(tmp_path):
    """The worker's one thread and the trainer's together use the trainer's cores: the trainer runs
    one thread less while its worker runs, and its own number again once the worker has stopped."""
    t, threads = trainer(tmp_path, "rollout.mode=async"), torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        worker = RolloutWorker(t.cfg, t.unwrapped, 0)
        during = torch.get_num_threads()
        worker.stop()
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    assert (during, after) == (2, 3)


def test_the_weights_do_not_go_through_the_queue(tmp_path, monkeypatch):
    """The queue carries each transfer's version only; the weights are broadcast."""
    sent, put = [], multiprocessing.queues.Queue.put
    monkeypatch.setattr(multiprocessing.queues.Queue, "put",
                        lambda queue, message, *args: (sent.append(message), put(queue, message, *args))[1])
    t = trainer(tmp_path, "rollout.mode=async")
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    try:
        worker.send_weights(t.unwrapped, 1)
    finally:
        worker.stop()
    assert sent == [("weights", 0, "whole"), ("weights", 1, "whole"), ("stop",)]


def test_the_weights_backend_is_nccl_only_between_two_cuda_devices():
    """One CUDA device cannot be two NCCL ranks; a CPU side takes gloo."""
    cases = {("cuda:0", "cuda:1"): "nccl", ("cuda:0", "cuda:0"): "gloo", ("cuda:0", "cpu"): "gloo",
             ("cpu", "cuda:0"): "gloo", ("cpu", "cpu"): "gloo"}
    assert {pair: backend_for(*map(torch.device, pair)) for pair in cases} == cases


def test_a_transfer_to_a_dead_worker_fails_rather_than_waits(tmp_path):
    """The broadcast to a killed worker fails as its connection closes (not after the group's
    timeout); the next transfer sees it and starts none, and the awaited rollouts raise it. gloo
    words the closed socket as "closed by peer" or, when the send hits it first, "Read error ...:
    Connection reset by peer"; either is the dead worker."""
    t = trainer(tmp_path, "rollout.mode=async")
    rows = [t.inputs.train_rows[0]]
    worker = RolloutWorker(t.cfg, t.unwrapped, 0)
    worker.process.kill()
    worker.process.join()
    try:
        for version in range(1, 100):  # 5 s at most
            worker.send_weights(t.unwrapped, version)
            if worker.transfer_error is not None:
                break
            time.sleep(0.05)
        with pytest.raises(RolloutWorkerDied, match=r"was killed by SIGKILL after its weights transfer failed "
                                                  r"\(RuntimeError: .*Connection (closed by|reset by) peer"):
            worker.take((1, 0, 0), rows, 3, [0])
    finally:
        worker.stop()


# one_step_off's under -m slow (14 s in the default run, 2026-11-30): the dead worker's path is the same
@pytest.mark.parametrize("mode", [pytest.param("one_step_off", marks=pytest.mark.slow), "async"])
def test_a_dead_worker_stops_the_run_after_a_checkpoint_and_resume_starts_a_new_one(tmp_path, monkeypatch, mode):
    kill_reward = Path(__file__).parent / "kill_reward.py"
    monkeypatch.setattr(import_user_module(str(kill_reward), "reward_modules"), "_calls", 0)  # counted from this run's first step
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "2")  # during step 2's scoring
    monkeypatch.setenv("MMRL_TEST_KILL_SIGNAL", "children")
    killer = [f"reward_modules=[{TINY_RECIPE['reward_modules'][0]},{kill_reward}]", "rewards.killer.weight=0.0",
              f"rollout.mode={mode}"]
    with pytest.raises(RolloutWorkerDied, match=f"rollout worker .* was killed by SIGKILL .*rollout.mode={mode}") as err:
        run(tmp_path, "worker", "save_every=10", *killer, steps=4)
    assert any("after step 2, which is saved" in note for note in err.value.__notes__)
    monkeypatch.setenv("MMRL_TEST_KILL_AT", "0")
    t, lines = run(tmp_path, "worker", "resume=true", *killer, steps=4)
    assert t.step == 4 and [x["step"] for x in lines] == [1, 2, 3, 4]
    assert lines[2]["rollout/staleness_max"] == 0.0  # step 3 redrawn by the new worker from the checkpoint's weights


def test_one_step_off_refuses_what_it_cannot_run_before_any_model_loads(tmp_path):
    with pytest.raises(ConfigError) as err:
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                            "rollout.max_staleness=2", "optim.lora.r=4", "sampling.dynamic=true"]))
    text = str(err.value)
    assert "rollout.max_staleness=2" in text and "sampling.dynamic=true" in text
    assert "lora" not in text  # the worker takes a LoRA (tests/test_async_lora.py)


class TrainerOnlyLM(CausalLMPolicy):
    """A plugin adapter that leaves `runs_in_rollout_worker` at the Policy's default."""
    runs_in_rollout_worker = False


def test_async_refuses_what_it_cannot_run_and_names_the_families_that_work(tmp_path, monkeypatch):
    monkeypatch.setitem(ADAPTERS._items, "trainer_only_lm", TrainerOnlyLM)
    with pytest.raises(ConfigError) as err:
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "task=trainer_only_lm", "rollout.mode=async",
                                            "rollout.max_staleness=-1", "rollout.stale_rows=keep"]))
    text = str(err.value)
    assert "task='trainer_only_lm' (the rollout worker runs audio_lm, causal_lm, csm, dia, diffusion, dlm, janus, omni_talker, vlm)" in text
    assert "rollout.max_staleness=-1" in text and "rollout.stale_rows=keep with algorithm.rollout_correction=none" in text
    with pytest.raises(ConfigError, match=r"rollout.mode=async with policy.units=forward_process \(no behaviour"):
        validate(parse_config(DIFFUSION_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async",
                                                 "policy.units=forward_process"]))
    with pytest.raises(ConfigError, match=r"rollout.mode=async with policy.temperature=0 \(greedy decoding records"):
        validate(parse_config(DLM_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=async", "policy.temperature=0"]))
    with pytest.raises(ConfigError, match=r"rollout.weights_every=2 is async's \(rollout.mode=one_step_off\)"):
        validate(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "rollout.mode=one_step_off",
                                            "rollout.weights_every=2"]))
