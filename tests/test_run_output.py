"""What a run says about itself: warnings for steps that train nothing, the start summary and the
end line, metric lines without the progress bar."""

import copy
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import TINY_RECIPE
from mmrl.config.parse import ConfigError, parse_config
from mmrl.train.loop.trainer import Trainer
from mmrl.train.reporting.tracking import read_metrics
from mmrl.train.safety.health import NoRewardError, RunHealth

HERE = Path(__file__).parent


def _recipe(tmp_path, **changes):
    recipe = copy.deepcopy(TINY_RECIPE)
    recipe["output_dir"] = str(tmp_path / "run")
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field:
            recipe[section][field] = value
        else:
            recipe[section] = value
    return recipe


def _warnings(caplog, text):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_reward_that_never_applies_warns_once_then_stops_the_run(tmp_path, caplog):
    recipe = _recipe(tmp_path, rewards={"never_applies": {"weight": 1.0}},
                     reward_modules=[str(HERE / "none_reward.py")], max_steps=6)
    caplog.set_level(logging.WARNING)
    with pytest.raises(NoRewardError, match=r"steps 1-3: no reward gave a value for any completion \('never_applies' "
                                            r"returned None for every row.*max_bad_steps=3"):
        Trainer(parse_config(recipe, [])).train()
    warned = _warnings(caplog, "never_applies")
    assert len(warned) == 1 and warned[0].startswith("step 1: no reward gave any completion a value ('never_applies' "
                                                     "returned None for every row")
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["reward_mean"] is None and r["skipped_frac"] == 1.0 for r in records)


def test_a_saturating_learning_rate_warns(tmp_path, caplog):
    recipe = _recipe(tmp_path, max_steps=5)
    recipe["optim"]["lr"] = recipe["optim"]["max_lr"] = 1e6  # past the recipe check's ceiling on purpose
    caplog.set_level(logging.WARNING)
    Trainer(parse_config(recipe, [])).train()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    norms = [r["grad_norm"] for r in records]
    assert norms[0] > 0 and norms[1:4] == [0.0, 0.0, 0.0]
    assert all(r["skipped_frac"] < 1 for r in records[1:4])  # rows had advantages, yet no gradient
    warned = _warnings(caplog, "saturated")
    assert len(warned) == 1 and warned[0].startswith("step 4:") and "lower optim.lr" in warned[0]


def test_health_counts_only_zero_gradients_after_non_zero_ones_with_rows_to_train(caplog):
    caplog.set_level(logging.WARNING)
    health = RunHealth(max_bad_steps=3)
    trained = {"reward_mean": 0.5, "reward/acc": 0.5, "skipped_frac": 0.0}
    for step in range(1, 4):  # zero from the start: nothing learned yet, no warning
        health.check(step, {**trained, "grad_norm": 0.0})
    health.check(4, {**trained, "grad_norm": 1.0})
    for step in range(5, 9):  # steps with no rows to train do not count
        health.check(step, {**trained, "grad_norm": 0.0, "skipped_frac": 1.0 if step % 2 else 0.0})
    assert not _warnings(caplog, "saturated")
    health.check(9, {**trained, "grad_norm": 0.0})
    assert len(_warnings(caplog, "saturated")) == 1
    health.check(10, {"reward_mean": float("nan"), "reward/acc": float("nan"), "grad_norm": 0.0})
    health.check(11, {**trained, "grad_norm": 0.0})  # a step with a reward resets the count
    health.check(12, {"reward_mean": float("nan"), "reward/acc": float("nan"), "grad_norm": 0.0})
    health.check(13, {"reward_mean": float("nan"), "reward/acc": float("nan"), "grad_norm": 0.0})
    said = _warnings(caplog, "'acc'")  # once for each run of steps without a reward
    assert [s.split(":")[0] for s in said] == ["step 10", "step 12"]


def test_a_step_whose_dynamic_sampling_kept_no_group_is_not_a_missing_reward(caplog):
    """Dynamic sampling that finds no group with reward variance keeps no row: the step's reward
    means are NaN because nothing was kept, not because a reward gave None; no stop, one warning."""
    health = RunHealth(max_bad_steps=2)
    nothing_kept = {"reward_mean": float("nan"), "reward/acc": float("nan"), "sampling/groups": 0.0, "sampling/tries": 4.0}
    for step in range(1, 6):
        health.check(step, nothing_kept)
    assert not _warnings(caplog, "returned None")
    assert len(_warnings(caplog, "equal rewards")) == 1
    health.check(6, {"reward_mean": float("nan"), "reward/acc": float("nan"), "sampling/groups": 4.0})
    with pytest.raises(NoRewardError):
        health.check(7, {"reward_mean": float("nan"), "reward/acc": float("nan"), "sampling/groups": 4.0})


def test_a_step_without_any_reward_is_said_at_once_with_each_rewards_cause(caplog):
    """Failed and skipped, unreadable, None: each reward's cause in the first step's warning; a
    dynamic-sampling step with no reward at all counts as a step without a reward."""
    caplog.set_level(logging.WARNING)
    health = RunHealth(max_bad_steps=3)
    nan = float("nan")
    health.check(1, {"reward_mean": nan, "reward/served": nan, "reward/served/failed_frac": 1.0,
                     "reward/judge": nan, "reward/judge/failed_frac": 0.0, "reward/judge/unparsed_frac": 1.0,
                     "reward/none": nan})
    said = _warnings(caplog, "step 1:")
    assert said == ["step 1: no reward gave any completion a value ('served' failed on every row sent to its server, "
                    "and rewards.served.client.on_failure=skip left them without it; 'judge' got no answer it could "
                    "read as a score: reward/judge/unparsed_frac is 1.0, see rewards.judge.args; 'none' returned None "
                    "for every row, which means 'does not apply': check its data columns and arguments), so the step "
                    "trained nothing; 3 such steps in a row stop the run (max_bad_steps)"]
    health.check(2, {"reward_mean": nan, "reward/none": nan, "sampling/groups": 0.0, "sampling/rewarded_frac": 0.0})
    assert not _warnings(caplog, "equal rewards") and not _warnings(caplog, "step 2:")  # one warning a streak
    with pytest.raises(NoRewardError, match=r"steps 1-3: no reward gave a value for any completion \('none' returned "
                                            r"None for every row.*max_bad_steps=3"):
        health.check(3, {"reward_mean": nan, "reward/none": nan})


def test_a_run_is_an_error_only_when_none_of_its_steps_had_a_reward():
    nan = float("nan")
    none, some = {"reward_mean": nan, "reward/a": nan}, {"reward_mean": 0.5, "reward/a": 0.5}
    uniform = {"reward_mean": nan, "reward/a": nan, "sampling/groups": 0.0, "sampling/rewarded_frac": 1.0}
    for steps in ([some, none], [none, some], [uniform, uniform, uniform, uniform], [none, uniform]):
        health = RunHealth(max_bad_steps=3)
        for step, metrics in enumerate(steps, 1):
            health.check(step, metrics)
        health.finish()  # trained on something, or its groups were equal (dynamic sampling: a warning only)
    health = RunHealth(max_bad_steps=3)
    health.check(1, none)
    health.check(2, none)
    with pytest.raises(NoRewardError, match=r"^the run trained on nothing: in none of its 2 steps \(1-2\) did a "
                                            r"reward give any completion a value \('a' returned None"):
        health.finish()


def test_dynamic_sampling_over_rewards_that_never_apply_is_no_saturated_policy(tmp_path, caplog):
    """Dynamic sampling keeps no group when no reward gave a value (NaN groups have no variance):
    that is a step without a reward, not the "every group equal" warning."""
    recipe = _recipe(tmp_path, rewards={"never_applies": {"weight": 1.0}}, reward_modules=[str(HERE / "none_reward.py")],
                     max_steps=1, sampling={"dynamic": True, "dynamic_max_tries": 2})
    caplog.set_level(logging.WARNING)
    with pytest.raises(NoRewardError, match="the run trained on nothing"):
        Trainer(parse_config(recipe, [])).train()
    assert not _warnings(caplog, "equal rewards")
    record = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert record["sampling/groups"] == 0 and record["sampling/rewarded_frac"] == 0 and record["sampling/tries"] == 2


def test_runs_that_train_on_nothing_exit_non_zero_saying_why(tmp_path, capsys):
    """Two steps (fewer than max_bad_steps): a reward returning None for every row, and a real
    reward server answering HTTP 500 to every row under on_failure skip, each the run's only reward."""
    from mmrl.cli.main import main
    from served import fault_command, free_port, running
    none = _recipe(tmp_path, rewards={"never_applies": {"weight": 1.0}}, reward_modules=[str(HERE / "none_reward.py")])
    (tmp_path / "none.yaml").write_text(yaml.safe_dump(none))
    assert main(["train", str(tmp_path / "none.yaml")]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == ("mmrl: error: the run trained on nothing: in none of its 2 steps (1-2) did a reward give any "
                    "completion a value ('never_applies' returned None for every row, which means 'does not apply': "
                    "check its data columns and arguments)")
    port = free_port()
    served = _recipe(tmp_path, rewards={"digit_share": {"weight": 1.0, "url": f"http://127.0.0.1:{port}",
                                                        "client": {"retries": 0, "on_failure": "skip"}}})
    served["output_dir"] = str(tmp_path / "served_run")
    (tmp_path / "served.yaml").write_text(yaml.safe_dump(served))
    with running(fault_command("error500", port), port):
        assert main(["train", str(tmp_path / "served.yaml")]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said == ("mmrl: error: the run trained on nothing: in none of its 2 steps (1-2) did a reward give any "
                    "completion a value ('digit_share' failed on every row sent to its server, and "
                    "rewards.digit_share.client.on_failure=skip left them without it)")
    metrics = read_metrics(tmp_path / "served_run" / "metrics.jsonl")
    assert [m["reward/digit_share/failed_frac"] for m in metrics] == [1.0, 1.0]


def _mmrl(*args):
    return subprocess.run([sys.executable, "-m", "mmrl", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def _weights(run, step):
    return load_file(run / "checkpoints" / f"step-{step:06d}" / "model" / "model.safetensors")


@pytest.mark.slow  # 14 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_mmrl_train_runs_the_warm_start_once(tmp_path):
    recipe = _recipe(tmp_path, max_steps=1, warm_start={"steps": 3, "batch_size": 4, "lr": 1e-2})
    recipe["optim"]["lr"] = 0.0  # RL leaves the weights as the warm start made them
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    out = _mmrl("train", tmp_path / "recipe.yaml")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warm start: 3 supervised steps" in out.stdout
    reference = Trainer(parse_config(recipe, [f"output_dir={tmp_path / 'reference'}"]))
    untrained = {k: v.clone() for k, v in reference.unwrapped.state_dict().items()}
    reference.warm_start()
    warmed, run = reference.unwrapped.state_dict(), tmp_path / "run"
    trained = _weights(run, 1)
    assert trained and all(torch.allclose(trained[k], warmed[k], atol=1e-6) for k in trained)
    assert any(not torch.equal(trained[k], untrained[k]) for k in trained)
    out = _mmrl("train", tmp_path / "recipe.yaml", "resume=true", "max_steps=2")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "warm start" not in out.stdout
    assert all(torch.equal(v, _weights(run, 2)[k]) for k, v in trained.items())  # not warm-started again


def test_a_run_prints_its_summary_metric_lines_and_end_line(tmp_path, capsys):
    recipe = _recipe(tmp_path, max_steps=2)
    recipe["logging"]["print_every"] = 1
    trainer = Trainer(parse_config(recipe, []))
    params = list(trainer.unwrapped.parameters())
    trainer.train()
    out, run = capsys.readouterr().out, tmp_path / "run"
    records = read_metrics(run / "metrics.jsonl")
    assert (f"mmrl train: task causal_lm, model tiny:qwen2-char\n"
            f"  parameters: {sum(p.numel() for p in params):,} trainable of {sum(p.numel() for p in params):,} "
            f"(100.0%)\n  data: 64 train rows, 8 eval rows\n  output: {run} (world size 1)\n") in out
    metric_lines = [line for line in out.splitlines() if line.startswith("train step")]
    assert metric_lines == [f"train step {r['step']}/2: reward={r['reward_mean']:.3g} kl={r['kl']:.3g} "
                            f"clip={r['clip_frac']:.3g} loss={r['loss']:.3g}" for r in records]
    best = max(records, key=lambda r: (r["reward_mean"], r["step"]))
    end = [line for line in out.splitlines() if line.startswith("mmrl train: done")]
    assert len(end) == 1 and end[0].startswith("mmrl train: done, step 2 (2 this session) in ")
    assert end[0].endswith(f"; reward_mean last {records[-1]['reward_mean']:.4g}, best {best['reward_mean']:.4g} "
                           f"(step {best['step']}); final checkpoint {run / 'checkpoints' / 'step-000002'}")
    assert (run / "checkpoints" / "step-000002").is_dir()

    recipe.update(resume=True, max_steps=3)
    recipe["logging"]["print_every"] = 0
    Trainer(parse_config(recipe, [])).train()
    out = capsys.readouterr().out
    assert "  resumed from step 2\n" in out and "train step" not in out
    assert "mmrl train: done, step 3 (1 this session) in " in out


def test_evaluation_shows_progress_when_progress_is_on(tmp_path, capsys):
    recipe = _recipe(tmp_path, eval={"max_prompts": 4, "group_size": 2})
    for progress in (True, False):
        recipe["logging"]["progress"] = progress
        recipe["output_dir"] = str(tmp_path / f"run-{progress}")
        Trainer(parse_config(recipe, [])).evaluate()
        err = capsys.readouterr().err
        # the bars are drawn, then cleared (leave=False); how far a quick pass gets redrawn depends on timing
        assert ("eval (sampled): " in err and "eval (greedy): " in err) == progress, err


def test_a_lora_run_builds_without_a_future_warning(tmp_path):
    recipe = _recipe(tmp_path)
    recipe["optim"]["lora"] = {"r": 2, "target_modules": ["q_proj", "v_proj"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        trainer = Trainer(parse_config(recipe, []))
    assert any("lora_A" in name for name, _ in trainer.unwrapped.named_parameters())


@pytest.mark.slow  # 22 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_after_a_warm_start_the_kl_is_to_the_warm_started_model_and_a_resume_keeps_it(tmp_path):
    """The reference of the KL is the warm-started model: the first step's KL (policy = warm start)
    is 0, where a reference copied before the warm start gives the distance to the untrained model;
    the checkpoint keeps that reference, so a resumed run's next step equals the uninterrupted run's."""
    recipe = _recipe(tmp_path, max_steps=2, save_every=1, warm_start={"steps": 5, "batch_size": 4, "lr": 1e-2})
    recipe["algorithm"]["beta"] = 0.1
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    for out in (_mmrl("train", tmp_path / "recipe.yaml"),
                _mmrl("train", tmp_path / "recipe.yaml", f"output_dir={tmp_path / 'cut'}", "max_steps=1"),
                _mmrl("train", tmp_path / "recipe.yaml", f"output_dir={tmp_path / 'cut'}", "resume=true")):
        assert out.returncode == 0, out.stderr[-2000:]
    whole, cut = read_metrics(tmp_path / "run" / "metrics.jsonl"), read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert whole[0]["kl"] == pytest.approx(0.0, abs=1e-7)
    assert whole[1]["kl"] > 1e-6  # the step moved the policy away from it
    assert cut[1]["step"] == 2 and cut[1]["kl"] == pytest.approx(whole[1]["kl"], rel=1e-5)
    assert cut[1]["loss"] == pytest.approx(whole[1]["loss"], rel=1e-5)
    assert (tmp_path / "cut" / "checkpoints" / "step-000001" / "reference.safetensors").is_file()


def test_a_warm_start_with_a_kl_and_lora_is_refused_before_any_model_loads(tmp_path):
    recipe = _recipe(tmp_path, warm_start={"steps": 5}, optim={**TINY_RECIPE["optim"], "lora": {"r": 4}})
    recipe["algorithm"]["beta"] = 0.1
    with pytest.raises(ConfigError, match=r"warm_start.steps=5 with optim.lora.r=4 and a KL"):
        Trainer(parse_config(recipe, []))
