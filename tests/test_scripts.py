"""Smoke runs of the scripts in scripts/: each benchmark at tiny sizes and one or two steps, as a
subprocess the way a user runs it, its report written to a temporary file (never to
scripts/results/); the printed JSON must parse, match the file and hold the ratios the script
promises, finite. TRL's contender runs where trl is installed (CI does not install it: there the
scripts run with --no-trl); the vLLM engine of bench_rollout only in the vLLM venv (-m vllm)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
RESULTS = SCRIPTS / "results"
HAS_TRL = importlib.util.find_spec("trl") is not None
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_trl = pytest.mark.skipif(not HAS_TRL, reason="trl is not installed (pip install -e '.[bench]')")
TRL_OPTION = "--trl" if HAS_TRL else "--no-trl"


def script_env() -> dict[str, str]:
    """This checkout first on the path, before an installed copy."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_script(name: str, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPTS / name), *options], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=600)


def bench(name: str, tmp_path: Path, *options: str) -> dict:
    """Run scripts/NAME with `options` and `--json` into tmp_path; the report it printed (the JSON
    from its first line that is `{`), checked against the one it wrote."""
    path = tmp_path / f"{name}.json"
    done = run_script(name, *options, "--json", str(path))
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    lines = done.stdout.splitlines()
    assert "{" in lines, f"{name} printed no JSON report:\n{done.stdout[-2000:]}"
    printed = json.loads("\n".join(lines[lines.index("{"):]))
    assert json.loads(path.read_text()) == printed
    return printed


def assert_finite(report: dict, *keys: str) -> None:
    """Each dotted key is in `report` and is a finite number."""
    for key in keys:
        value = report
        for part in key.split("."):
            assert part in value, f"{key}: {part!r} missing from {sorted(value)}"
            value = value[part]
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{key} = {value!r}"


@pytest.fixture(autouse=True)
def committed_results_untouched():
    """No smoke run writes to scripts/results/."""
    def snapshot():
        return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in RESULTS.iterdir()}
    before = snapshot()
    yield
    assert snapshot() == before


@pytest.fixture
def scripts_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))


ENGINE_SMOKE = ("--steps", "2", "--warmup", "0", "--rounds", "1", "--group", "4", "--prompts", "1", "--tokens", "8",
                "--hidden", "32", "--layers", "1", "--threads", "1")


@pytest.mark.slow  # 14 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
@needs_trl
def test_bench_engine_against_trl(tmp_path):
    report = bench("bench_engine.py", tmp_path, *ENGINE_SMOKE, "--trl", "--no-rss")
    assert_finite(report, "overhead_ratio", "trl_time_ratio", "trl_overhead_ratio", "median_step_s.trl")
    assert "peak_rss_mb" not in report


def test_bench_engine_without_trl(tmp_path):
    report = bench("bench_engine.py", tmp_path, *ENGINE_SMOKE, "--no-trl", "--no-rss")
    assert_finite(report, "overhead_ratio", "median_step_s.mmrl", "median_bare_step_s.beside_mmrl")
    assert not {"trl_time_ratio", "trl_overhead_ratio", "peak_rss_mb"} & report.keys()


@pytest.mark.slow  # 26 s of CPU: three fresh processes, each a warm-up step and a probed one
def test_bench_engine_memory(tmp_path):
    """The memory case: each contender's step under the allocation probe, without timing (--rounds 0)."""
    report = bench("bench_engine.py", tmp_path, *ENGINE_SMOKE[6:], "--warmup", "1", "--rounds", "0", "--vocab", "512",
                   "--memory", "--bare-micro-batch", "2", TRL_OPTION)
    memory = report["memory"]
    assert_finite(memory, "peak_mb.mmrl", "peak_mb.bare", "bare_peak_ratio", "phases.mmrl.update.peak_mb",
                  "phases.mmrl.rollout.peak_mb", *(("trl_peak_ratio", "phases.trl.update_backward.peak_mb") if HAS_TRL
                                                   else ()))
    assert memory["peak_mb"]["mmrl"] >= memory["phases"]["mmrl"]["update"]["peak_mb"] > 0
    assert "overhead_ratio" not in report and report["setup"]["model"]["vocab"] == 512


@pytest.mark.slow  # ~15 s on 2 idle cores: a fresh process under the CPU profiler
def test_bench_memory_plan(tmp_path):
    """The plan beside the probe at one small size: both finite, within 15%."""
    report = bench("bench_memory_plan.py", tmp_path, "--vocab", "512", "--sizes", "32x8")
    size = report["sizes"]["32x8"]
    assert size["measured_mib"] > 0 and abs(size["ratio"] - 1) < 0.15


@pytest.mark.slow
def test_bench_engine_peak_rss(tmp_path):
    """The peak-RSS pass: each contender once more alone in a process of its own (2-3 processes more)."""
    report = bench("bench_engine.py", tmp_path, *ENGINE_SMOKE, TRL_OPTION, "--rss")
    assert_finite(report, "peak_rss_mb.bare", "peak_rss_mb.mmrl", *(("trl_peak_rss_ratio",) if HAS_TRL else ()))


@pytest.mark.slow  # 17 s: hf and TRL's VLM rollouts (the default run stays under 15 minutes)
def test_bench_vlm(tmp_path):
    report = bench("bench_vlm.py", tmp_path, "--steps", "2", "--warmup", "0", "--rounds", "1", "--group", "4",
                   "--prompts", "1", "--tokens", "8", "--image-size", "56", "--threads", "1", "--no-rss", TRL_OPTION)
    assert report["setup"]["visual_tokens_per_image"] == 4
    assert_finite(report, "rollout_speedup", "overhead_ratio",
                  *(f"split_s.{run}.{phase}" for run in ("mmrl", "mmrl_no_share") for phase in ("rollout", "update")))
    if HAS_TRL:
        assert_finite(report, "trl_time_ratio", "trl_time_ratio_no_share", "trl_overhead_ratio",
                      *(f"trl_phase_ratio.{phase}" for phase in ("rollout", "logprob", "update")))


def test_bench_vlm_needs_two_steps():
    done = run_script("bench_vlm.py", "--steps", "1")
    assert done.returncode == 2 and "--steps 1" in done.stderr


def test_bench_prefix(tmp_path):
    report = bench("bench_prefix.py", tmp_path, "--group", "2", "--prefix", "16", "--completion", "4",
                   "--repeats", "1", "--large-vocab", "128", "--sweep", "8", "--no-trl")
    assert_finite(report, "time_ratio", "memory_ratio", "token_ratio", "large_vocab.time_ratio",
                  "large_vocab.memory_ratio")
    assert [row["prefix"] for row in report["sweep"]] == [8]
    assert_finite(report["sweep"][0], "time_ratio")
    assert "trl_step" not in report


@pytest.mark.slow
@needs_trl
def test_bench_prefix_against_trl(tmp_path):
    """The whole-step comparison starts four trainer processes at bench_engine's and bench_vlm's
    fixed sizes (512-token prompts, 448-pixel images): about a minute, so slow."""
    report = bench("bench_prefix.py", tmp_path, "--group", "2", "--prefix", "16", "--completion", "4",
                   "--repeats", "1", "--large-vocab", "128", "--sweep", "--trl-steps", "2", "--trl-rounds", "1")
    assert_finite(report, "trl_time_ratio_long_prefix", "trl_time_ratio_vlm")


@pytest.mark.slow  # 22 s: every log-prob operator, forward and backward (the default run stays under 15 minutes)
def test_bench_logprob(tmp_path):
    report = bench("bench_logprob.py", tmp_path, "--hidden", "32", "--vocab", "2048", "--tokens", "64,128",
                   "--chunk", "32", "--repeats", "1", "--threads", "1", "--step-hidden", "32", "--step-layers", "1",
                   "--step-tokens", "4", "--step-group", "2", "--step-prompts", "1", "--step-steps", "1",
                   "--step-warmup", "1", TRL_OPTION)
    assert [(r["hidden"], r["tokens"]) for r in report["operator"]] == [(32, 64), (32, 128)]
    for run in report["operator"]:
        assert_finite(run, "peak_memory_ratio", "time_ratio")
        assert run["max_logp_diff"] <= 1e-5 and run["grad_weight_max_diff"] <= 1e-4
    assert_finite(report, "step.time_ratio_vs_logits", "step.peak_ratio_vs_logits",
                  *(["step.trl_time_ratio", "step.trl_peak_ratio"] if HAS_TRL else []))


def test_bench_diffusion(tmp_path):
    report = bench("bench_diffusion.py", tmp_path, "--layers", "1", "--steps", "2", "--group-size", "2",
                   "--prompts", "1", "--repeats", "1", "--trained-steps", "1,2")
    assert_finite(report, "rollout_overhead_ratio", "peak_activation_growth_per_step",
                  "peak_activation_growth_one_backward")
    assert [row["trained_steps"] for row in report["training_step"]] == [1, 2]


@pytest.mark.slow  # 9 s in the default run on the quiet 2-core machine (2026-11-30); the default run stays under 15 min
def test_bench_diffusion_methods_counts_forwards(tmp_path):
    """Whole training steps of three methods; the denoiser forwards a step costs, counted by hooks,
    against the count their recipes imply: one rollout forward per denoising step (one generation
    call, no CFG), and with one row per micro-batch one update forward per trained step of each
    row, twice for Flow-GRPO (its KL's reference forward)."""
    import yaml
    steps, prompts, group = 6, 2, 2
    report = bench("bench_diffusion.py", tmp_path, "--methods", "flowgrpo,flowgrpo_fast", "--layers", "1",
                   "--size", "16", "--steps", str(steps), "--group-size", str(group), "--prompts", str(prompts),
                   "--micro-batch", "1", "--repeats", "2")
    methods = report["methods"]
    assert list(methods) == ["dancegrpo", "flowgrpo", "flowgrpo_fast"]  # DanceGRPO measured first, the reference
    rows = prompts * group
    fraction = yaml.safe_load((ROOT / "tasks/recipes/t2i_dancegrpo.yaml").read_text())["policy"]["schedule"]["fraction"]
    expected_update = {"dancegrpo": rows * round(fraction * (steps - 1)), "flowgrpo": rows * (steps - 1) * 2}
    for name, cost in methods.items():
        assert_finite(cost, "time_s", "peak_activation_bytes", "time_s_per_trained_sample", "forwards_vs_dance",
                      "time_s_vs_dance", "peak_activation_bytes_vs_dance", "time_s_per_trained_sample_vs_dance")
        assert cost["samples"] == cost["samples_trained"] == rows  # the brightness reward leaves no row untrained
        assert len(cost["forwards_each"]) == 2
        for rollout, update in cost["forwards_each"]:
            assert rollout == steps
            if name in expected_update:
                assert update == expected_update[name], name
        for rollout, update in cost["rows_each"]:  # one micro-batch row per update forward
            assert rollout == steps * rows
            if name in expected_update:
                assert update == expected_update[name], name
    assert methods["dancegrpo"]["forwards_vs_dance"] == 1.0
    assert methods["flowgrpo_fast"]["forwards"] < methods["flowgrpo"]["forwards"]


@pytest.mark.slow  # 10 s in the default run on the quiet 2-core machine (2026-11-30); the default run stays under 15 min
def test_bench_diffusion_wan_video_section(tmp_path):
    report = bench("bench_diffusion.py", tmp_path, "--family", "wan", "--layers", "1", "--steps", "2",
                   "--group-size", "2", "--prompts", "1", "--repeats", "1", "--trained-steps", "1,2")
    assert report["family"] == "wan" and report["model"] == "tiny:wan-t2v" and report["frames"] == 5
    assert_finite(report, "rollout_overhead_ratio", "peak_activation_growth_per_step",
                  "peak_activation_growth_one_backward")
    assert [row["trained_steps"] for row in report["training_step"]] == [1, 2]


@pytest.mark.slow  # 11 s in the default run on the quiet 2-core machine (2026-11-30); the default run stays under 15 min
def test_bench_dlm(tmp_path):
    report = bench("bench_dlm.py", tmp_path, "--reps", "1", "--group", "2", "--gen-length", "8", "--block-length",
                   "4", "--steps", "4", "--large-vocab", "128", "--hidden", "32", "--layers", "1", "--threads", "1",
                   "--dg-hidden", "32", "--dg-canvas", "4", "--dg-blocks", "2", "--dg-steps", "2")
    assert_finite(report, "generation.vocab_100.speedup_vs_d1", "generation.vocab_128.speedup_vs_d1",
                  "diffusion_gemma.speed_vs_stock",
                  *(f"estimators.{name}.time_ratio_to_diffu_grpo"
                    for name in ("coupled", "elbo", "elbo_k8", "spg", "espo", "tracerl", "agrpo")))
    assert report["setup"]["model"]["hidden"] == 32
    assert report["estimators"]["tracerl"]["forwards_per_call"] == 4  # one view per decoding step
    dg = report["diffusion_gemma"]
    assert dg["one_group_same_tokens_as_stock"] and dg["mmrl"]["decoder_forwards"] == dg["stock"]["decoder_forwards"]
    assert dg["estimators"]["final_step"]["decoder_forwards_per_call"] == 2  # one per canvas


def test_bench_rewards_overlap(tmp_path):
    report = bench("bench_rewards.py", tmp_path, "--overlap", "--latency", "0.01", "--prompts", "2", "--group", "2",
                   "--groups-per-call", "1", "--request-rows", "2", "--steps", "1", "--warmup", "0", "--threads", "1",
                   "--hidden", "32", "--layers", "1")
    assert_finite(report, "overlap_step_time_ratio", "serial.time_step_s", "overlapped.time_reward_s",
                  "overlap_bound", "phase_balance", "ratio_to_bound", "generation_split_cost")
    assert report["setup"]["groups_per_call"] == 1
    assert report["setup"]["model"] == "text_demo (tiny:qwen2-char, hidden 32, 1 layers)"
    assert report["generation_split_cost"] == pytest.approx(
        report["overlapped"]["time_generate_s"] / report["serial"]["time_generate_s"])
    serial = report["serial"]
    hidden = min(serial["time_generate_s"], serial["time_reward_s"])
    assert report["overlap_bound"] == pytest.approx(1 - hidden / serial["time_step_s"])


def test_overlap_bound_hides_the_shorter_phase(monkeypatch):
    """A serial step of 1.0 s: 0.5 s generating, 0.4 s scoring, 0.1 s else. At best the 0.4 s of
    scoring hide behind generation: 0.6 s, a bound of 0.6; a measured 0.66 is 1.1 times it."""
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts"))
    from bench_rewards import overlap_bound
    got = overlap_bound({"time_generate_s": 0.5, "time_reward_s": 0.4, "time_step_s": 1.0}, 0.66)
    assert got == pytest.approx({"overlap_bound": 0.6, "phase_balance": 0.8, "ratio_to_bound": 1.1})


def test_bench_rewards(tmp_path):
    from mmrl.rewards.latex_sandbox import tex_available
    report = bench("bench_rewards.py", tmp_path, "--batch", "2", "--repeats", "1", "--workers", "2")
    assert_finite(report, "wer_speedup")
    assert ("latex_speedup" in report) == tex_available()
    if tex_available():
        assert_finite(report, "latex_speedup")


ROLLOUT_SMOKE = ("--hidden", "64", "--heads", "1", "--layers", "1", "--prompts", "2", "--group", "2",
                 "--max-new-tokens", "4", "--repeats", "1")


def test_bench_rollout_hf(tmp_path):
    report = bench("bench_rollout.py", tmp_path, "--engines", "hf", *ROLLOUT_SMOKE)
    assert_finite(report, "hf.tokens_per_s", "hf.tokens_per_rollout")
    assert "vllm" not in report and "vllm_vs_hf_tokens_per_s" not in report


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed")
def test_bench_rollout_without_vllm_names_the_way_out():
    done = run_script("bench_rollout.py", *ROLLOUT_SMOKE)
    assert done.returncode == 2 and "--engines hf" in done.stderr


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (scripts/make_vllm_env.sh)")
def test_bench_rollout_vllm(tmp_path):
    report = bench("bench_rollout.py", tmp_path, *ROLLOUT_SMOKE)
    assert_finite(report, "vllm_vs_hf_tokens_per_s", "logp_diff_max", "logp_diff_mean", "vllm.tokens_per_s")


@pytest.mark.slow  # 15 s of the default run on quiet cores (2026-11-30), which reached 15 min; a benchmark smoke run
def test_bench_sharding(tmp_path):
    report = bench("bench_sharding.py", tmp_path, "--cases", "lm", "--lm-hidden", "32", "--lm-layers", "1",
                   "--no-sharded-rollouts")
    assert_finite(report, "memory_ratio_lm", "time_ratio_lm", "lm_step_s.fsdp_gathered")
    assert "memory_ratio_diffusion" not in report and "time_ratio_lm_sharded_rollouts" not in report


@pytest.mark.slow
def test_bench_sharding_diffusion_and_sharded_rollouts(tmp_path):
    """The tiny SD3 case at its fixed size and FSDP with sharded rollouts: four more runs of 10-20 s."""
    report = bench("bench_sharding.py", tmp_path, "--cases", "lm", "diffusion", "--lm-hidden", "32", "--lm-layers", "1")
    assert_finite(report, "memory_ratio_diffusion", "time_ratio_diffusion", "time_ratio_diffusion_sharded_rollouts",
                  "time_ratio_lm_sharded_rollouts")


def test_bench_sharding_needs_two_steps():
    done = run_script("bench_sharding.py", "--steps", "1")
    assert done.returncode == 2 and "--steps 1" in done.stderr


def test_bench_report_prints_and_writes(tmp_path, capsys, scripts_importable):
    from bench_report import emit
    emit({"ratio": 1.5}, str(tmp_path / "report.json"))
    assert json.loads(capsys.readouterr().out) == {"ratio": 1.5} == json.loads((tmp_path / "report.json").read_text())


def test_require_trl_names_the_way_out(monkeypatch, scripts_importable):
    from bench_harness import require_trl
    monkeypatch.setitem(sys.modules, "trl", None)  # find_spec then finds no trl
    require_trl(False)
    with pytest.raises(SystemExit, match="--no-trl"):
        require_trl(True)


def test_make_vllm_env_checks_without_building(tmp_path):
    script = str(SCRIPTS / "make_vllm_env.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "TORCH_SOURCE" in shown.stdout
    assert subprocess.run(["bash", script], capture_output=True, text=True).returncode == 2
    refused = subprocess.run(["bash", script, str(tmp_path / "venv")], capture_output=True, text=True,
                             env={**os.environ, "TORCH_SOURCE": "nightly"})
    assert refused.returncode == 2 and "TORCH_SOURCE=nightly" in refused.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.slow  # 16 s: two transports, each in processes of its own (the default run stays under 15 minutes)
def test_bench_weights_transfer(tmp_path):
    report = bench("bench_weights_transfer.py", tmp_path, "--repeats", "2", "--hidden", "32", "--layers", "1")
    assert_finite(report, "state_dict_mb", *(f"{transport}.{key}" for transport in ("queue", "broadcast")
                                             for key in ("send_ms", "latency_ms")))
    assert report["broadcast"]["latency_ms"] >= report["broadcast"]["send_ms"] > 0


@pytest.mark.slow  # about 2 min: a Ray cluster of three nodes, a single-process and a served run, one weights push
def test_bench_scaleout(tmp_path):
    pytest.importorskip("ray")
    report = bench("bench_scaleout.py", tmp_path, "--servers", "1", "--steps", "3", "--warmup", "1", "--prompts", "2",
                   "--warm-start-steps", "2", "--push-size", "32x1", "--repeats", "3")
    runs = report["throughput"]
    assert set(runs) == {"single", "served_1"} and runs["single"]["samples_per_s_vs_single"] == 1.0
    assert_finite(report, *(f"throughput.{run}.{key}" for run in runs for key in ("samples_per_s", "seconds")),
                  *(f"weights_push.32x1.{key}" for key in ("push_held_ms", "push_latency_ms", "file_handover_ms")))
    assert runs["served_1"]["rollout_servers"] == 1 and runs["served_1"]["steps"] == 2
    assert report["weights_push"]["32x1"]["push_latency_ms"] >= report["weights_push"]["32x1"]["push_held_ms"] > 0


@pytest.mark.slow  # 22 s: a warm start and four runs, three with a worker (the default run stays under 15 minutes)
def test_bench_async(tmp_path):
    report = bench("bench_async.py", tmp_path, "--steps", "3", "--warmup", "1", "--prompts", "2", "--tokens", "6",
                   "--hidden", "32", "--layers", "1", "--warm-start-steps", "5")
    assert_finite(report, *(f"{run}.{key}" for run in ("sync", "one_step_off", "async_1", "async_2")
                            for key in ("samples_per_s", "samples_per_s_ratio", "rollout_tokens_per_s")))
    assert report["sync"]["staleness_mean"] == 0.0 and report["one_step_off"]["staleness_mean"] == 1.0
    assert report["sync"]["samples_per_s_ratio"] == 1.0
    assert 0.0 < report["sync"]["generate_share"] < 1.0 and report["sync"]["overlap_bound"] >= 1.0
    assert 0.0 <= report["async_1"]["staleness_mean"] <= 1.0 and 0.0 <= report["async_2"]["staleness_mean"] <= 2.0



@pytest.mark.slow  # 20 s: a served reward and three runs, two with a worker
def test_bench_async_with_a_served_reward(tmp_path):
    """The slow served reward is scored in the trainer's step when the trainer scores, and not when
    the worker does."""
    report = bench("bench_async.py", tmp_path, "--steps", "3", "--warmup", "1", "--prompts", "2", "--tokens", "6",
                   "--hidden", "32", "--layers", "1", "--warm-start-steps", "5", "--served-latency", "0.1")
    runs = ("sync", "async_1_trainer_scored", "async_1_worker_scored")
    assert_finite(report, *(f"{run}.{key}" for run in runs for key in ("samples_per_s", "samples_per_s_ratio",
                                                                       "reward_share")))
    trainer, worker = report["async_1_trainer_scored"]["reward_share"], report["async_1_worker_scored"]["reward_share"]
    assert trainer > 5 * worker, (trainer, worker)


def test_compare_sweeps_at_equal_time(tmp_path):
    """Two folders' cells in one equal-time table: the second sweep's cell trains twice as fast."""
    for name, step_s in (("a", 1.0), ("b", 0.5)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "sweep.json").write_text(json.dumps({"cells": [["rollout.mode=sync"], [f"x={name}"]]}))
        rows = ["cell,seed,step,train_s,train_reward,proxy,gold"]
        rows += [f"{cell},0,{step},{step * step_s},0.1,{0.1 * step},{0.05 * step}" for cell in (0, 1) for step in (2, 4)]
        (folder / "sweep_evals.csv").write_text("\n".join(rows) + "\n")
    done = run_script("compare_sweeps.py", f"{tmp_path / 'a'}:1", str(tmp_path / "b"), "--json", str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr
    assert "T = 2.0 s" in done.stdout  # the b cells' last evaluation: step 4 at 2 s
    assert "| a 1: x=a | 1.000 | 1.00x | 2 | 0.200 | 0.100 |" in done.stdout
    assert "| b 0: rollout.mode=sync | 0.500 | 2.00x | 4 | 0.400 | 0.200 |" in done.stdout
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["T_s"] == 2.0 and list(out["cells"]) == ["a 1: x=a", "b 0: rollout.mode=sync", "b 1: x=b"]


@pytest.mark.slow  # 320 s on the 2 cores under a load of 10: the tiny text demo and two `mmrl bench` subprocesses
def test_bench_gsm8k_text_demo(tmp_path):
    out = run_script("bench_gsm8k_text_demo.py", "--out", str(tmp_path), "--json", str(tmp_path / "r.json"),
                     "max_steps=2", "warm_start.steps=2", "eval.max_prompts=4", "save_every=2",
                     "policy.tiny_args.hidden=32", "policy.tiny_args.layers=1")
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout[out.stdout.index("{"):])
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert report["prompts"] == 4 and report["checkpoint_dir"].endswith("step-000002")
    for name in ("base", "checkpoint"):
        assert {"value", "se", "n"} <= set(report[name]["flexible_extract"]) and report[name]["flexible_extract"]["n"] == 4
    assert math.isfinite(report["difference"])


def test_gpu_suite_checks_without_a_gpu(tmp_path):
    """The GPU suite parses, shows its help, refuses a call without OUT_DIR (2) and, on a machine with
    no CUDA device, refuses to run (3) before writing anything."""
    script = str(SCRIPTS / "gpu_suite.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    shown = subprocess.run(["bash", script, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--dry-run" in shown.stdout and "engine_memory" in shown.stdout
    assert subprocess.run(["bash", script], capture_output=True, text=True).returncode == 2
    import torch
    if not torch.cuda.is_available():
        refused = subprocess.run(["bash", script, str(tmp_path / "out")], capture_output=True, text=True,
                                 env={**os.environ, "PYTHON": sys.executable})
        assert refused.returncode == 3 and "--dry-run" in refused.stderr
        assert not (tmp_path / "out").exists()


@pytest.mark.slow  # 30 s idle (150 s at load 10): six scripts started for their --help
def test_gpu_suite_dry_run_starts_every_script(tmp_path):
    """--dry-run prints each benchmark's command, with its JSON under OUT_DIR, and every script starts;
    the limits add up to at most 9 minutes."""
    import re
    done = subprocess.run(["bash", str(SCRIPTS / "gpu_suite.sh"), "--dry-run", str(tmp_path)], capture_output=True,
                          text=True, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    names = [line.split(" ")[0] for line in lines]
    assert names == ["logprob", "logprob_frozen", "engine_memory", "wan_1_3b", "rollout_vllm", "dlm"]
    assert all(f"--json {tmp_path}/{name}.json" in line for name, line in zip(names, lines))
    assert sum(int(re.search(r"limit (\d+)s", line).group(1)) for line in lines) <= 540
