"""`mmrl bench`'s harness on the text demo's tiny model: a checkpoint and its base scored on a
GSM8K-style fixture with standard errors; shards together equal the unsharded run; a rerun skips
finished shards; the stages run apart; a smoke subset is marked; two runs agree; eval.bench logs
beside the rewards during training."""

import dataclasses
import json

import pytest
from bench_fixtures import gsm8k_sorting

from mmrl.cli.main import main
from mmrl.config.parse import load_recipe, parse_config
from mmrl.errors import UserError
from mmrl.experiments.bench.harness import BenchRun, run_bench
from mmrl.registry import BENCHMARKS, RECIPES
from mmrl.train.loop.trainer import Trainer

TINY = ["policy.tiny_args.hidden=32", "policy.tiny_args.layers=1", "policy.max_new_tokens=12"]
SORTING = ["--option", "template={question}"]  # the demo's prompts are the bare question


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """The text demo's recipe, tiny, trained one step: its output directory and checkpoint."""
    out = tmp_path_factory.mktemp("text_run")
    cfg = load_recipe(RECIPES.get("text_demo"), [f"output_dir={out}", "max_steps=1", "optim.prompts_per_step=2",
                                                 "algorithm.group_size=2", "logging.progress=false",
                                                 "logging.report_to=[none]", "eval.max_prompts=2", *TINY])
    trainer = Trainer(cfg)
    trainer.train()
    return out, out / "checkpoints" / "step-000001"


def test_gsm8k_on_the_text_demos_checkpoint_and_its_base(text_run, tmp_path, capsys):
    out, checkpoint = text_run
    data = gsm8k_sorting(tmp_path)
    assert main(["bench", "gsm8k", "--checkpoint", str(checkpoint), "--data", data, *SORTING, *TINY]) == 0
    trained = json.loads((checkpoint / "bench" / "gsm8k" / "summary.json").read_text())
    assert main(["bench", "gsm8k", "text_demo", f"output_dir={out}", "--base", "--data", data, *SORTING, *TINY]) == 0
    base = json.loads((out / "base" / "bench" / "gsm8k" / "summary.json").read_text())
    for summary in (trained, base):
        assert summary["headline"]["figure"] == "flexible_extract" and summary["headline"]["n"] == 8
        assert {"value", "se", "n"} <= set(summary["figures"]["strict_match"])
        assert 0 <= summary["headline"]["value"] <= 100 and summary["headline"]["se"] >= 0
        assert summary["generation"]["policy"]["max_new_tokens"] == 12  # the override over the protocol's 256
        assert summary["smoke_subset"] is False
    assert trained["checkpoint"] == str(checkpoint) and base["checkpoint"] is None
    assert base["model"] == "base: tiny:qwen2-char"
    report = (checkpoint / "bench" / "gsm8k" / "report.md").read_text()
    assert "| id | prompt | completion |" in report and "sort:" in report
    # the scores are the scorer's on the written completions (an independent re-scoring)
    from mmrl.tasks.bench.math_text import gsm8k_answer
    lines = [json.loads(x) for x in (checkpoint / "bench" / "gsm8k" / "scores.jsonl").read_text().splitlines()]
    rows = [json.loads(x) for x in open(data)]
    again = gsm8k_answer(None, [x["completion"] for x in lines], [r["answer"] for r in rows])
    assert [x["values"]["flexible_extract"] for x in lines] == again


@pytest.fixture(scope="module")
def sampled_gsm8k():
    """GSM8K's protocol drawing 2 samples per prompt at the rollout temperature (seeds matter)."""
    name = "gsm8k_sampled_test"
    if name not in BENCHMARKS:
        BENCHMARKS.register(name)(dataclasses.replace(BENCHMARKS.get("gsm8k"), name=name, greedy=False, samples=2))
    return name


def _run(name, out, data, **kw):
    cfg = parse_config({"task": "causal_lm", "policy": {"model": "tiny:qwen2-char",
                                                        "tiny_args": {"hidden": 32, "layers": 1}, "max_new_tokens": 8}})
    return run_bench(BenchRun(name, out, cfg, "tiny", data=data, options={"template": "{question}"}, **kw))


def test_shards_together_equal_the_unsharded_run_and_reruns_skip_them(sampled_gsm8k, tmp_path, capsys):
    data = gsm8k_sorting(tmp_path, n=7)
    whole = _run(sampled_gsm8k, tmp_path / "whole", data)
    assert _run(sampled_gsm8k, tmp_path / "sharded", data, shard=(0, 2)) is None  # waits for shard 1
    assert "1 of 2 shards finished" in capsys.readouterr().err
    parts = _run(sampled_gsm8k, tmp_path / "sharded", data, shard=(1, 2))
    for key in ("headline", "figures", "categories"):
        assert parts[key] == whole[key], key
    read = lambda out: (out / "bench" / sampled_gsm8k / "scores.jsonl").read_text()  # noqa: E731
    assert read(tmp_path / "sharded") == read(tmp_path / "whole")  # the same completions, in the same order
    samples = tmp_path / "sharded" / "bench" / sampled_gsm8k / "shards" / "0-of-2" / "samples.jsonl"
    before = samples.stat().st_mtime_ns
    assert _run(sampled_gsm8k, tmp_path / "sharded", data, shard=(0, 2))["headline"] == whole["headline"]
    assert samples.stat().st_mtime_ns == before and "is finished already" in capsys.readouterr().err
    with pytest.raises(UserError, match="other settings"):
        _run(sampled_gsm8k, tmp_path / "sharded", data, shard=(0, 2), seed=1)


def test_two_runs_agree_and_the_seed_changes_the_samples(sampled_gsm8k, tmp_path):
    data = gsm8k_sorting(tmp_path, n=3)
    texts = []
    for out, seed in (("a", 0), ("b", 0), ("c", 1)):
        _run(sampled_gsm8k, tmp_path / out, data, seed=seed)
        texts.append((tmp_path / out / "bench" / sampled_gsm8k / "scores.jsonl").read_text())
    assert texts[0] == texts[1] and texts[0] != texts[2]


def test_stages_run_apart_and_a_smoke_subset_is_marked(tmp_path):
    data = gsm8k_sorting(tmp_path, n=6)
    assert _run("gsm8k", tmp_path, data, stage="generate", num_prompts=4) is None
    assert not (tmp_path / "bench" / "gsm8k" / "summary.json").exists()
    with pytest.raises(UserError, match="not finished"):
        _run("gsm8k", tmp_path / "elsewhere", data, stage="score", num_prompts=4)
    summary = run_bench(BenchRun("gsm8k", tmp_path, None, "", stage="score", num_prompts=4, data=data,
                                 options={"template": "{question}"}))
    assert summary["smoke_subset"] is True and summary["num_prompts"] == 4 and summary["source_prompts"] == 6
    assert summary["headline"]["n"] == 4 and summary["model"] == "tiny"
    assert "SMOKE SUBSET" in (tmp_path / "bench" / "gsm8k" / "report.md").read_text()


def test_bad_input_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    assert main(["bench", "gsm8k", "--model", "tiny:qwen2-char", "--data", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "row 0" in err and "####" in err and "Traceback" not in err
    assert main(["bench", "gsm8k", "--model", "tiny:qwen2-char", "--shard", "2/2", "--data", str(bad)]) == 2
    assert "--shard '2/2'" in capsys.readouterr().err
    assert main(["bench", "gsm8k", "--model", "tiny:qwen2-char", "--option", "nope=1", "--data", str(bad)]) == 2
    assert "no option 'nope'" in capsys.readouterr().err
    assert main(["bench", "gsmk8"]) == 2 and "did you mean 'gsm8k'" in capsys.readouterr().err


def test_eval_bench_is_logged_beside_the_rewards_during_training(tmp_path):
    data = gsm8k_sorting(tmp_path, n=3)
    cfg = load_recipe(RECIPES.get("text_demo"), [f"output_dir={tmp_path / 'run'}", "max_steps=1", "eval.every=1",
                                                 "optim.prompts_per_step=2", "algorithm.group_size=2", "eval.max_prompts=2",
                                                 "logging.progress=false", "logging.report_to=[none]", *TINY,
                                                 f"eval.bench={{name: gsm8k, num_prompts: 2, data: {data}, "
                                                 "options: {template: '{question}'}}"])
    Trainer(cfg).train()
    logged = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert "eval/reward_mean" in logged
    for key in ("eval/bench/gsm8k/flexible_extract", "eval/bench/gsm8k/flexible_extract_se", "eval/bench/gsm8k/strict_match"):
        assert key in logged, key
    with pytest.raises(UserError, match="eval.bench.name: 'gsmk8'"):
        Trainer(load_recipe(RECIPES.get("text_demo"), [f"output_dir={tmp_path / 'r2'}", "eval.bench={name: gsmk8}"]))



def _with_answers(folder, data):
    """The shard's completions replaced by right and wrong answers in turn (the scores then differ)."""
    rows = [json.loads(x) for x in open(data)]
    path = folder / "shards" / "0-of-1" / "samples.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    for n, line in enumerate(lines):
        line["completion"] = rows[n]["answer"] if n % 2 == 0 else "#### 7"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_served_scorer_scores_as_in_process(tmp_path):
    """--scorer-url: the benchmark's scorer behind the reward server's app (`mmrl serve-reward gsm8k_answer`),
    through the served rewards' transport, gives the in-process scores."""
    import threading

    import uvicorn
    from served import free_port, wait_healthy

    from mmrl.core.scoring import get_reward
    from mmrl.serving.server_app import reward_app
    data = gsm8k_sorting(tmp_path, n=4)
    assert _run("gsm8k", tmp_path, data, stage="generate") is None
    _with_answers(tmp_path / "bench" / "gsm8k", data)
    score = dict(stage="score", data=data, options={"template": "{question}"})
    local = run_bench(BenchRun("gsm8k", tmp_path, None, "", **score))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(reward_app("gsm8k_answer", get_reward("gsm8k_answer")), port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, type("Alive", (), {"poll": lambda self: None})())
        served = run_bench(BenchRun("gsm8k", tmp_path, None, "", scorer_url=url, **score))
    finally:
        server.should_exit = True
        thread.join(10)
    assert local["headline"]["value"] == 50.0 and local["figures"]["strict_match"]["value"] == 50.0
    assert served["scorer"]["url"] == url and local["scorer"]["url"] is None
    for key in ("headline", "figures"):
        assert served[key] == local[key]


@pytest.mark.parametrize("lora", [0, 4])
def test_the_checkpoints_weights_are_the_ones_the_trainer_resumes(tmp_path, lora):
    """The bench's policy (the run's config, LoRA, CHECKPOINT/model.safetensors) holds the same weights
    as the Trainer after `load_checkpoint` (accelerate's own loading), and not the starting ones."""
    import torch

    from mmrl.cli.commands import run_config
    from mmrl.experiments.bench.policy_source import load_policy
    overrides = [f"output_dir={tmp_path}", "max_steps=1", "optim.prompts_per_step=2", "algorithm.group_size=2",
                 "logging.progress=false", "logging.report_to=[none]", "eval.max_prompts=2", f"optim.lora.r={lora}",
                 "warm_start.steps=2", "warm_start.lr=0.05", *TINY]
    trainer = Trainer(load_recipe(RECIPES.get("text_demo"), overrides))
    trainer.warm_start()  # a random model's rewards are all 0: the RL step alone would change nothing
    trainer.train()
    checkpoint = tmp_path / "checkpoints" / "step-000001"
    args = type("Args", (), {"args": []})()
    cfg = run_config(args, checkpoint)
    bench_policy = load_policy(cfg, checkpoint)
    resumed = Trainer(cfg, for_training=False)
    resumed.load_checkpoint(checkpoint)
    theirs = dict(resumed.unwrapped.named_parameters())
    ours = dict(bench_policy.model.named_parameters())
    assert ours.keys() == theirs.keys() and any("lora" in k for k in ours) == bool(lora)
    assert all(torch.equal(ours[k].cpu(), theirs[k].detach().cpu()) for k in ours)
    if lora:  # LoRA's B starts at zero: trained ones are not
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in ours.items())
    else:
        start = dict(load_policy(cfg, None).model.named_parameters())
        assert any(not torch.equal(start[k], v) for k, v in ours.items())


def test_media_completions_round_trip_and_draw_the_grid(tmp_path):
    """A generator's completions (image, audio, video) are written as files, read back for the scorer as the
    scorers take them, and the first images (a video's first frame) drawn in report.md's grid."""
    import numpy as np
    from PIL import Image

    from mmrl.core.benchmark import Figure
    from mmrl.core.media import medium
    from mmrl.experiments.bench.report import write_results
    from mmrl.experiments.bench.sample_files import read_samples, sample_record
    image = Image.fromarray(np.arange(12 * 10 * 3, dtype=np.uint8).reshape(10, 12, 3))
    video = np.random.default_rng(0).integers(0, 255, (3, 8, 6, 3), dtype=np.uint8)
    audio = {"array": np.linspace(-0.5, 0.5, 800, dtype=np.float32), "sampling_rate": 8000}
    completions = [image, audio, np.transpose(video, (0, 3, 1, 2)), "text"]  # the video as [T, C, H, W] uint8
    lines = [sample_record({"id": f"p{i}", "k": 0, "seed": i, "prompt": "draw", "completion": c,
                            "columns": {"fps": 4.0} if i == 2 else {}}, tmp_path, medium) for i, c in enumerate(completions)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    back = read_samples(tmp_path)
    assert np.array_equal(np.asarray(back[0]["completion"]), np.asarray(image))
    assert back[1]["completion"]["sampling_rate"] == 8000 and np.allclose(back[1]["completion"]["array"], audio["array"])
    assert np.array_equal(back[2]["completion"], video) and back[2]["columns"]["fps"] == 4.0
    assert back[3]["completion"] == "text"
    bench = dataclasses.replace(BENCHMARKS.get("gsm8k"), name="media", figures={"m": Figure("flexible_extract")},
                                headline="m", categories=())
    scored = [{"id": s["id"], "k": 0, "categories": {}, "values": {"flexible_extract": 1.0, "strict_match": 0.0}}
              for s in back]
    info = {"model": "m", "num_prompts": 4, "source_prompts": 4, "smoke_subset": False, "samples_per_prompt": 1,
            "greedy": True, "source": "s", "split": None}
    write_results(tmp_path, bench, info, scored, back)
    grid = Image.open(tmp_path / "grid.png")
    assert grid.size == (2 * 12, 12)  # two tiles (the image, the video's first frame), each 12 x 12
    assert "grid.png" in (tmp_path / "report.md").read_text()
