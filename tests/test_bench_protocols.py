"""Each built-in benchmark's scorer on hand-written cases, and each benchmark end to end on its
family's tiny model with a tiny offline copy of its data (tests/bench_fixtures.py)."""

import pytest
from bench_fixtures import gsm8k_sorting, librispeech, math500, mathvista, mmau, mmmu, refcoco

from mmrl.config.parse import parse_config
from mmrl.experiments.bench.harness import BenchRun, run_bench
from mmrl.experiments.bench.policy_source import protocol_config
from mmrl.registry import BENCHMARKS
from mmrl.tasks.bench.choices import choice_letter, letters_for, open_answer_correct
from mmrl.tasks.bench.grounding import predicted_box, refcoco_box
from mmrl.tasks.bench.math_text import gsm8k_answer, gsm8k_extract, math_answer
from mmrl.tasks.bench.mathvista import mathvista_answer, normalized_answer
from mmrl.tasks.bench.speech import normalized_words, transcript_edits


@pytest.mark.parametrize("text, strict, flexible", [
    ("Step 1... #### 1,234", "1,234", "1,234"),
    ("3 apples and 4 pears make 7.", "[invalid]", "7."),
    ("The total is $18. Question: what about 99?", "[invalid]", "$18."),  # cut at the stop string
    ("no number here", "[invalid]", "[invalid]"),
    ("#### -5\n#### 6", "-5", "6"),
])
def test_gsm8k_filters(text, strict, flexible):
    assert gsm8k_extract(text, "strict") == strict and gsm8k_extract(text, "flexible") == flexible


def test_gsm8k_exact_match_ignores_commas_dollars_and_a_final_point():
    gold = ["Natalia sold 48 + 24 = 72 clips.\n#### 1,272"] * 3
    assert gsm8k_answer(None, ["So $1272.", "#### 1,272", "1271"], gold) == [1.0, 1.0, 0.0]
    assert gsm8k_answer(None, ["So $1272.", "#### 1,272", "1271"], gold, filter="strict") == [0.0, 1.0, 0.0]


def test_math500_uses_math_verify_equivalence():
    got = math_answer(None, ["so \\boxed{\\frac{1}{2}}", "the answer is \\boxed{0.5}", "\\boxed{3}", ""],
                      ["\\frac{1}{2}", "\\frac{1}{2}", "2", "2"])
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_wer_counts_edits_after_whispers_normaliser_and_sums_over_the_corpus():
    assert normalized_words("Mr. Smith paid $20, didn't he?") == ["mister", "smith", "paid", "$20", "did", "not", "he"]
    refs, hyps = ["HELLO WORLD", "MISTER SMITH PAID TWENTY DOLLARS"], ["hello there world", "Mr. Smith paid $20."]
    assert transcript_edits(None, hyps, refs, count="edits") == [1.0, 0.0]  # one insertion; both sides say "$20"
    assert transcript_edits(None, hyps, refs, count="words") == [2.0, 4.0]  # "twenty dollars" is one word, "$20"
    assert transcript_edits(None, hyps, refs, count="edits", normalizer="lmms_eval") == [1.0, 0.0]


@pytest.mark.parametrize("response, style, letter", [
    ("(B)", "mmmu", "B"), ("The answer is B.", "mmmu", "B"), ("A. Baroque", "mmmu", "A"),
    ("I think it is the option Cubism, clearly not anything else", "mmmu", "B"),
    ("(A) or (B)? I pick (B)", "mmmu", "B"), ("B", "mmau", "B"), ("A bell, so C.", "mmau", "C"),
])
def test_choice_letters(response, style, letter):
    letters = letters_for(["Baroque", "Cubism", "rain", "speech"][:2 if style == "mmmu" else 4])
    assert choice_letter(response, letters, fallback_seed=0, style=style) == letter


def test_no_letter_falls_back_to_a_seeded_draw():
    letters = letters_for(["w", "x", "y", "z"])
    draws = {choice_letter("???", letters, seed) for seed in range(40)}
    assert draws == set("ABCD") and choice_letter("???", letters, 7) == choice_letter("???", letters, 7)


def test_mmmu_open_answers():
    assert open_answer_correct("The area is 12.0 square units", "12")
    assert open_answer_correct("Therefore the answer is Paris.", "paris")
    assert not open_answer_correct("The area is 13", "12")


def test_mathvista_extracts_and_normalises():
    assert normalized_answer("(B) 5", ["3", "5"], "multi_choice", "text", 0) == "5"
    assert normalized_answer("fiev", ["3", "five"], "multi_choice", "text", 0) == "five"  # nearest option
    assert normalized_answer("3.14159", None, "free_form", "float", 2) == "3.14"
    got = mathvista_answer(None, ['The answer is "B".', "There are 4 bars.", "<answer>1.50</answer>", "x"],
                           ["5", "4", "1.5", "4"], [["3", "5"], None, None, None],
                           ["multi_choice", "free_form", "free_form", "free_form"],
                           ["text", "integer", "float", "integer"], [None, None, 1, None])
    assert got == [1.0, 1.0, 1.0, 0.0]


def test_refcoco_brings_each_frame_to_the_images_pixels():
    original, resized = [100, 50], [200, 100]
    assert predicted_box('{"bbox_2d": [20, 10, 60, 40]}', "input", original, resized) == [10, 5, 30, 20]
    assert predicted_box("<|box_start|>(100,100),(500,500)<|box_end|>", "normalized_1000", original, None) == [10, 5, 50, 25]
    assert predicted_box("[0.1, 0.1, 0.5, 0.5]", "normalized_1", original, None) == [10, 5, 50, 25]
    assert predicted_box("no box", "image", original, None) is None
    truth = [[10, 5, 30, 20]]
    args = ([truth, truth], [original] * 2, [resized] * 2, ["input"] * 2)
    assert refcoco_box(None, ['{"bbox_2d": [20, 10, 60, 40]}', "[0, 0, 1, 1]"], *args) == [1.0, 0.0]
    iou = refcoco_box(None, ["[20, 10, 40, 40]", "x"], *args, metric="iou")
    assert iou[0] == pytest.approx(0.5) and iou[1] == 0.0


def _bench(tmp_path, name, task, model, data, overrides=(), **kw):
    bench = BENCHMARKS.get(name)
    cfg = protocol_config(bench, parse_config({"task": task, "policy": {"model": model}}), list(overrides))
    return run_bench(BenchRun(name, tmp_path, cfg, model, data=data, **kw)), cfg


FAMILIES = [  # (benchmark, adapter, tiny model, fixture, overrides)
    ("math500", "causal_lm", "tiny:qwen2-char", math500, ["policy.max_new_tokens=8"]),
    ("refcoco", "vlm", "tiny:qwen2.5-vl-char", refcoco, ["policy.max_new_tokens=8"]),
    ("mathvista", "vlm", "tiny:qwen2.5-vl-char", mathvista, ["policy.max_new_tokens=8"]),
    ("mmmu", "vlm", "tiny:qwen2.5-vl-char", mmmu, ["policy.max_new_tokens=8"]),
    ("librispeech_clean", "audio_lm", "tiny:qwen2-audio-char", librispeech, ["policy.max_new_tokens=8"]),
    ("mmau", "audio_lm", "tiny:qwen2-audio-char", mmau, ["policy.max_new_tokens=8"]),
]


@pytest.mark.parametrize("name, task, model, fixture, overrides", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_benchmark_runs_end_to_end_on_its_familys_tiny_model(tmp_path, name, task, model, fixture, overrides):
    summary, _ = _bench(tmp_path, name, task, model, fixture(tmp_path), overrides)
    bench = BENCHMARKS.get(name)
    head = summary["headline"]
    assert head["figure"] == bench.headline and head["n"] == summary["num_prompts"] > 0
    assert head["value"] == head["value"] and head["se"] >= 0  # a number, with its standard error
    for column in bench.categories:
        assert summary["categories"][column], column
    assert (tmp_path / "bench" / name / "report.md").is_file()


def test_refcoco_picks_the_frame_of_the_loaded_model(tmp_path):
    data = refcoco(tmp_path)
    for model, frame in (("tiny:qwen2.5-vl-char", "input"), ("tiny:qwen2-vl-char", "normalized_1000")):
        summary, _ = _bench(tmp_path / frame, "refcoco", "vlm", model, data, ["policy.max_new_tokens=4"], num_prompts=1)
        assert summary["generation"]["options"]["frame"] == frame


def test_gsm8k_on_a_diffusion_lm_takes_d1s_settings(tmp_path):
    data = gsm8k_sorting(tmp_path, n=2)
    small = ["policy.gen_length=8", "policy.block_length=8", "policy.steps=4", "policy.tiny_args={hidden: 32, layers: 1}"]
    summary, cfg = _bench(tmp_path, "gsm8k", "dlm", "tiny:dlm-char", data, small)
    assert summary["generation"]["options"]["template"] == "{question}"  # d1's bare question
    assert cfg.policy["temperature"] == 0.0 and cfg.policy["remasking"] == "low_confidence"
    assert cfg.policy["system_prompt"].startswith("You are a math expert")
    full = protocol_config(BENCHMARKS.get("gsm8k"), parse_config({"task": "dlm", "policy": {"model": "m"}}), [])
    assert (full.policy["gen_length"], full.policy["block_length"], full.policy["steps"]) == (256, 32, 128)
    assert summary["headline"]["n"] == 2


def test_a_missing_image_is_named_before_the_model_loads(tmp_path):
    import json

    from mmrl.errors import UserError
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"question_id": "q7", "image": str(tmp_path / "gone.png"), "bbox": [1, 1, 2, 2],
                                "answer": ["it"]}) + "\n")
    with pytest.raises(UserError, match=r"row 'q7-0'.*image file does not exist.*gone.png"):
        _bench(tmp_path, "refcoco", "vlm", "no/such-model", str(data))  # a model that cannot load: the check comes first


def test_a_benchmark_of_generated_images_runs_on_the_tiny_diffusion_model(tmp_path, one_torch_thread):
    """The harness with an image generator (what the image and video benchmarks build on): sampled images
    written as PNG per shard, read back for an image scorer (here the t2i demo's colour_shape), figures
    with standard errors, the report's grid of the first images."""
    import json

    from mmrl.core.benchmark import Benchmark, Figure
    from mmrl.registry import RECIPES
    name = "colour_shapes_test"
    if name not in BENCHMARKS:
        BENCHMARKS.register(name)(Benchmark(
            name=name, description="a colour and a shape drawn", source="none", split="test",
            read_rows=lambda rows, options: [{"id": str(n), **r} for n, r in enumerate(rows)],
            prompt=lambda row, options: f"{row['colour']} {row['shape']}", scorer="colour_shape",
            metrics={"score": {"area": [0.08, 0.3]}}, figures={"score": Figure("score")}, headline="score",
            default_task="diffusion", official="the t2i demo's own judge (a test benchmark)", categories=("shape",),
            policy={"diffusion": {"num_steps": 2, "eval_num_steps": 2}}, greedy=False, samples=2))
    data = tmp_path / "shapes.jsonl"
    data.write_text("".join(json.dumps({"colour": c, "shape": s}) + "\n"
                            for c, s in (("red", "circle"), ("blue", "square"), ("green", "circle"))))
    import yaml
    policy = yaml.safe_load(open(RECIPES.get("t2i_demo")))["policy"]
    bench = BENCHMARKS.get(name)
    cfg = protocol_config(bench, parse_config({"task": "diffusion", "policy": policy}), [])
    summary = run_bench(BenchRun(name, tmp_path, cfg, "tiny:pixel-flow-unet", data=str(data)))
    assert summary["headline"]["n"] == 3 and summary["samples_per_prompt"] == 2
    assert set(summary["categories"]["shape"]) == {"circle", "square"}
    folder = tmp_path / "bench" / name
    assert len(list((folder / "shards" / "0-of-1" / "media").glob("*.png"))) == 6
    assert (folder / "grid.png").is_file() and "grid.png" in (folder / "report.md").read_text()
