"""Runs that never lose or mix work: one run per output directory, resume true/auto/false,
verified checkpoints that fall back past a damaged one, save_total_limit, non-finite steps
skipped, the launcher's world size checked."""

import errno
import json
import math
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import TINY_RECIPE, tiny_overrides

from mmrl.config.parse import parse_config
from mmrl.errors import UserError
from mmrl.train.loop.trainer import Trainer
from mmrl.train.reporting.tracking import read_metrics
from mmrl.train.safety import checkpoint as ckpt
from mmrl.train.safety.health import NonFiniteError


def make(out, *extra):
    return Trainer(parse_config(TINY_RECIPE, tiny_overrides(out) + list(extra)))


# ----- one run per output directory ----------------------------------------------------------------
def test_reused_directory_is_refused_naming_its_files(tmp_path, no_model):
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(UserError, match=r"holds another run's files \(metrics.jsonl, checkpoints/\).*overwrite=true"):
        make(out)


def test_output_dir_that_is_a_file_is_an_error(tmp_path, no_model):
    (tmp_path / "run").write_text("x")
    with pytest.raises(UserError, match="is a file, not a directory"):
        make(tmp_path / "run")


def test_resume_true_without_checkpoint_names_the_directory(tmp_path, no_model):
    with pytest.raises(UserError, match=rf"resume=true but output_dir '{tmp_path / 'run'}' has no checkpoint"):
        make(tmp_path / "run", "resume=true")


def test_overwrite_clears_and_auto_says_what_it_does(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-000007").mkdir(parents=True)  # no trainer state: not a checkpoint
    (out / "metrics.jsonl").write_text('{"step": 7}\n')
    (out / "mine.txt").write_text("not a run file")
    trainer = make(out, "resume=auto")
    assert "resume=auto: no checkpoint" in capsys.readouterr().out
    assert not (out / "metrics.jsonl").exists() and (out / "mine.txt").exists()
    trainer.train()
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2]
    make(out, "overwrite=true")
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()
    assert (out / "mine.txt").exists()


@pytest.mark.parametrize("broken", ["policy.model=nobody/no-such-model-on-the-hub", "data.prompt_column=no_such_column"])
def test_overwrite_keeps_the_old_run_when_the_new_one_cannot_load(tmp_path, broken):
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    with pytest.raises(Exception) as failed:
        make(out, "overwrite=true", broken)
    assert not isinstance(failed.value, AssertionError)
    after = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert after == before and ckpt.latest_checkpoint(out) == ckpt.checkpoint_dir(out, 1)
    assert (out / "run.lock").read_text() == ""  # the failed run let go of the directory


# ----- resuming with other settings ---------------------------------------------------------------
def forbid_loading(monkeypatch):
    """From here on, loading a model or a data set fails the test (what the `no_model` fixture does)."""
    import mmrl.train.loop.parts as parts

    def refuse(*args, **kwargs):
        raise AssertionError("a model or data set was loaded")
    monkeypatch.setattr(parts, "build_policy", refuse)
    monkeypatch.setattr(parts, "load_data", refuse)


def test_resume_with_changed_settings_is_refused_listing_them(tmp_path, monkeypatch):
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    saved = (out / "config.json").read_text()
    forbid_loading(monkeypatch)
    with pytest.raises(UserError, match=r"changes the settings of the run.*\(algorithm\.group_size: 4 -> 8; "
                                        r"optim\.lr: 0\.001 -> 0\.5\).*resume_changes=allow") as refused:
        make(out, "resume=true", "max_steps=3", "optim.lr=0.5", "algorithm.group_size=8", "logging.plot_every=1")
    assert "max_steps" not in str(refused.value) and "plot_every" not in str(refused.value)
    with pytest.raises(UserError, match=r"of another model \(policy\.model: \"tiny:qwen2-char\" -> \"tiny:dlm-char\"\)"):
        make(out, "resume=true", "resume_changes=allow", "policy.model=tiny:dlm-char", "optim.lr=0.5")
    assert (out / "config.json").read_text() == saved


def test_a_run_saved_before_a_setting_existed_resumes_with_its_default(tmp_path):
    """A setting added to mmrl after a run was saved is absent from its config.json: resuming with the
    setting at its default changes nothing; a value other than the default is still a change."""
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    saved = json.loads((out / "config.json").read_text())
    del saved["rollout"], saved["algorithm"]["train_extremes"]  # as an older mmrl wrote it
    (out / "config.json").write_text(json.dumps(saved))
    make(out, "resume=true", "max_steps=2").train()
    assert [m["step"] for m in read_metrics(out / "metrics.jsonl") if "loss" in m][-1] == 2
    with pytest.raises(UserError, match=r"algorithm\.train_extremes: 0 -> 1"):
        make(out, "resume=true", "max_steps=3", "algorithm.train_extremes=1")


def test_resume_changes_allow_keeps_the_original_config_and_records_the_changes(tmp_path):
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    saved = (out / "config.json").read_text()
    trainer = make(out, "resume=true", "resume_changes=allow", "max_steps=2", "optim.lr=0.5")
    trainer.train()
    assert trainer.step == 2 and read_metrics(out / "metrics.jsonl")[-1]["lr"] == 0.5  # the new rate is used
    assert (out / "config.json").read_text() == saved
    record = json.loads((out / "config.resume-step-000001.json").read_text())
    assert record["changes"] == {"optim.lr": {"old": 0.001, "new": 0.5}}


def test_resume_into_a_model_of_another_shape_is_one_short_line(tmp_path):
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    with pytest.raises(UserError, match=r"step-000001 does not fit this run's model \(size mismatch") as refused:
        make(out, "resume=true", "resume_changes=allow", "policy.tiny_args.hidden=64", "policy.tiny_args.heads=4")
    assert len(str(refused.value)) < 400 and "\n" not in str(refused.value)


# ----- checkpoints that can be trusted -------------------------------------------------------------
def fake_checkpoint(out, step, **state):
    tmp = ckpt.temporary_dir(out, step)
    (tmp / "model").mkdir(parents=True)
    (tmp / "model" / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    (tmp / "random_states_0.pkl").write_bytes(b"rng" * 100)
    ckpt.publish(tmp, ckpt.checkpoint_dir(out, step), {"step": step, **state})
    return ckpt.checkpoint_dir(out, step)


def test_manifest_finds_a_changed_file_and_falls_back(tmp_path):
    first, second = fake_checkpoint(tmp_path, 1), fake_checkpoint(tmp_path, 2)
    assert ckpt.verify(second) is None and ckpt.latest_checkpoint(tmp_path) == second
    rng = second / "random_states_0.pkl"
    rng.write_bytes(b"rNg" + rng.read_bytes()[3:])  # same size, different bytes
    warnings = []
    assert ckpt.latest_checkpoint(tmp_path, warn=warnings.append) == first
    assert "random_states_0.pkl does not match its checksum" in warnings[0]
    (first / "model" / "model.safetensors").unlink()
    assert "model.safetensors is missing" in ckpt.verify(first)
    assert ckpt.latest_checkpoint(tmp_path) is None


def test_save_total_limit_keeps_the_newest_and_the_best(tmp_path):
    for step, score in [(1, 0.2), (2, 0.9), (3, None), (4, 0.5), (5, None)]:
        fake_checkpoint(tmp_path, step, **({} if score is None else {"eval_reward_mean": score}))
    ckpt.prune(tmp_path, 2, keep_best=True)
    assert [p.name for p in ckpt.published_checkpoints(tmp_path)] == ["step-000002", "step-000004", "step-000005"]
    ckpt.prune(tmp_path, 1)
    assert [p.name for p in ckpt.published_checkpoints(tmp_path)] == ["step-000005"]


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, capsys):
    out = tmp_path / "run"
    make(out, "max_steps=3", "save_every=1", "save_total_limit=2").train()
    assert [p.name for p in ckpt.published_checkpoints(out)] == ["step-000002", "step-000003"]
    weights = out / "checkpoints" / "step-000003" / "model.safetensors"  # accelerate's copy, read on resume
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    capsys.readouterr()
    trainer = make(out, "max_steps=3", "resume=true")
    said = capsys.readouterr().out
    assert f"checkpoint {out / 'checkpoints' / 'step-000003'} is damaged: {weights} has 100 bytes" in said
    assert trainer.step == 2 and "resuming from" in said and "step-000002" in said


# ----- a full disk -----------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A real 2 MiB filesystem (tmpfs); skipped where it cannot be mounted (not root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)  # a failed run may still hold a file open


def test_full_disk_names_the_disk_and_leaves_no_partial_checkpoint(small_disk, caplog):
    out = small_disk / "run"
    make(out, "max_steps=1").train()  # step-000001 fits
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 24 * 1024))  # a plot or a checkpoint no longer fits
    with pytest.raises(ckpt.DiskFull) as full:
        make(out, "resume=true", "max_steps=2").train()
    said = str(full.value)
    assert f"checkpoint {ckpt.checkpoint_dir(out, 2)} could not be written: the disk holding {out} is full" in said
    reported = re.search(rf"\(filesystem mounted at {small_disk}: ([0-9.]+) KiB free of 2.0 MiB", said)
    assert abs(float(reported[1]) * 1024 - shutil.disk_usage(small_disk).free) <= 16 * 1024  # a few pages move
    assert f"newest checkpoint is {ckpt.checkpoint_dir(out, 1)}" in said
    assert "rewards.png" in caplog.text  # the plot that could not be drawn is a warning, not the error
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]  # no .tmp-step-000002
    filler.unlink()
    resumed = make(out, "resume=true", "max_steps=2")
    assert resumed.step == 1
    resumed.train()
    assert ckpt.latest_checkpoint(out) == ckpt.checkpoint_dir(out, 2)


def test_full_disk_at_the_lowest_write_is_reported_the_same(tmp_path, monkeypatch):
    """Where no small filesystem can be mounted: the first file write of step 2's checkpoint fails as
    a full disk does (after writing part of the file)."""
    out = tmp_path / "run"
    make(out, "max_steps=1").train()
    trainer = make(out, "resume=true", "max_steps=2")
    real_save = torch.save

    def disk_fills(obj, f, *args, **kwargs):
        if str(ckpt.temporary_dir(out, 2)) in str(f):
            Path(f).write_bytes(b"\0" * 1000)
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *args, **kwargs)
    monkeypatch.setattr(torch, "save", disk_fills)
    with pytest.raises(ckpt.DiskFull, match=rf"the disk holding {out} is full \(filesystem mounted at /"):
        trainer.train()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]
    assert ckpt.latest_checkpoint(out) == ckpt.checkpoint_dir(out, 1)


# ----- non-finite steps ----------------------------------------------------------------------------
def test_nonfinite_loss_skips_the_step_then_stops_naming_it(tmp_path):
    out = tmp_path / "run"
    trainer = make(out, "max_steps=5", "max_bad_steps=2")
    objective = trainer.updater.objective

    def poisoned(*args, **kwargs):
        terms = objective.loss(*args, **kwargs)
        if trainer.step + 1 >= 2:  # from step 2 on
            terms.loss = terms.loss * math.nan
        return terms
    trainer.updater.objective = replace(objective, loss=poisoned)
    weights = {}
    original_update = trainer.updater.update

    def update(batch):
        weights[trainer.step + 1] = [p.detach().clone() for p in trainer.model.parameters()]
        return original_update(batch)
    trainer.updater.update = update
    with pytest.raises(NonFiniteError, match=r"step 3: the loss was not finite for 2 steps in a row.*step-000003"):
        trainer.train()
    after = [p.detach() for p in trainer.model.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(weights[2], after))  # steps 2 and 3 changed nothing
    assert not all(torch.equal(a, b) for a, b in zip(weights[1], weights[2]))  # step 1 did
    assert [r["nonfinite_skipped"] for r in read_metrics(out / "metrics.jsonl")] == [0.0, 1.0, 1.0]
    assert (out / "checkpoints" / "step-000003").is_dir()


def test_nonfinite_gradient_is_skipped_and_named(tmp_path):
    trainer = make(tmp_path / "run", "max_steps=1", "max_bad_steps=1")
    param = next(p for p in trainer.model.parameters() if p.requires_grad)
    param.register_hook(lambda g: g * math.inf)
    with pytest.raises(NonFiniteError, match="step 1: the gradient norm was not finite"):
        trainer.train()


# ----- launch ------------------------------------------------------------------------------------------
def test_world_size_mismatch_is_an_error(tmp_path, monkeypatch, no_model):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="expected 2 processes.*1 joined.*torchrun --nproc_per_node N"):
        make(tmp_path / "run")
    monkeypatch.delenv("WORLD_SIZE")  # what `accelerate launch --cpu --num_processes 2` leaves
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    with pytest.raises(UserError, match="starts ONE process"):
        make(tmp_path / "run")


def test_checkpoint_state_records_eval_score(tmp_path):
    out = tmp_path / "run"
    make(out, "max_steps=2", "save_every=2", "eval.every=2", "eval.max_prompts=2", "eval.group_size=2").train()
    state = json.loads((out / "checkpoints" / "step-000002" / "trainer_state.json").read_text())
    assert math.isfinite(state["eval_reward_mean"])


def test_one_pass_finiteness_check_finds_a_single_bad_element_anywhere():
    from mmrl.distributed.strategy import all_finite
    tensors = [torch.randn(7, 5), None, torch.randn(300), torch.full((2, 2), 1e15)]
    assert all_finite(tensors) and all_finite([None]) and all_finite([])
    for bad in (math.nan, math.inf, -math.inf):
        for which in (0, 2, 3):
            broken = [t.clone() if t is not None else None for t in tensors]
            broken[which].view(-1)[-1] = bad
            assert not all_finite(broken), (bad, which)
