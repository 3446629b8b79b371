"""The demos' held-out evaluators (a second judge beside the training reward, never a reward):
their rules on hand-written cases, and a tiny demo run that reports them in ``summary.json`` and
writes its held-out samples as files that re-score to the same numbers."""

import json
import re

import pytest
from mmrl.rewards.latex_sandbox import tex_available
from mmrl.tasks.demos.evaluators import boxes_at_iou, exact_match, exact_transcript, tex_match

from mmrl.experiments.demo import run_scored
from mmrl.registry import DEMO_EVALUATORS, DEMOS, RECIPES

TINY = ["max_steps=2", "warm_start.steps=20", "warm_start.batch_size=8", "eval.max_prompts=6",
        "eval.group_size=3", "optim.prompts_per_step=2", "optim.micro_batch_size=8", "algorithm.group_size=2",
        "policy.max_new_tokens=16", "policy.tiny_args.hidden=32", "logging.report_to=[none]",
        "logging.progress=false", "save_every=0", "data.args.n_train=64", "data.args.n_eval=8"]


def test_exact_match_takes_the_last_tagged_answer_without_partial_credit():
    score = exact_match("a").score
    assert score(None, ["<a>1 2</a>", "<a> 12 </a>", "<a>13</a>", "12", "<a>9</a> then <a>12</a>", "x"],
                 ["12", "12", "12", "12", "12", None]) == [0.0, 1.0, 0.0, 0.0, 1.0, None]


def test_exact_transcript_is_the_whole_sentence_case_and_spacing_aside():
    score = exact_transcript().score
    assert score(None, ["one two", " One  two ", "one tw", "one two three", "", "x"],
                 ["one two"] * 5 + [None]) == [1.0, 1.0, 0.0, 0.0, 0.0, None]


def test_boxes_at_iou_counts_boxes_over_the_threshold_and_extra_boxes_as_misses():
    score = boxes_at_iou(0.5).score
    truth = [[0, 0, 10, 10]]
    # IoU of [0,0,10,10] with [0,0,10,20] is 0.5 (a hit at the threshold); with [0,0,10,21] 10/21 < 0.5
    assert score(None, ["[0, 0, 10, 20]", "[0, 0, 10, 21]", "[0,0,10,10] [50,50,60,60]", "none", "[1,1,2,2]"],
                 [truth] * 5) == [1.0, 0.0, 0.5, 0.0, 0.0]
    assert score(None, ["[0,0,10,10] [20,20,30,30]"], [[[0, 0, 10, 10], [20, 20, 30, 31]]]) == [1.0]
    assert score(None, ["[0,0,10,10]"], [[]]) == [None]


def test_tex_match_is_a_pixel_identical_render_and_says_which_renderer():
    judge = tex_match()
    assert ("TeX-rendered" in judge.name) == tex_available()
    assert judge.score(None, ["x^{2}", "$x^2$", "x^3", "\\frac{", "x_2"], ["x^2"] * 5) == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_the_demos_have_evaluators():
    assert set(DEMOS.names()) == set(DEMO_EVALUATORS.names())  # every demo has a second judge


def test_a_demo_reports_its_evaluator_and_writes_samples_that_rescore(tmp_path):
    summary = run_scored(RECIPES.get(DEMOS.get("text")), [*TINY, f"output_dir={tmp_path}", "eval.every=1"], "text")
    assert summary["evaluator"] == DEMO_EVALUATORS.get("text").name
    # every periodic evaluation scored the judge too (mmrl sweep's proxy against gold); the last one,
    # with the final weights and the same seed, is the summary's "after"
    evals = [row for row in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
             if "eval/reward_mean" in row]
    assert [row["step"] for row in evals] == [1, 2] and all("eval/eval_mean" in row for row in evals)
    assert evals[-1]["eval/eval_mean"] == pytest.approx(summary["eval_after"])
    assert evals[-1]["eval/reward_mean"] == pytest.approx(summary["after"])
    for when in ("before", "after"):
        saved = json.loads((tmp_path / "samples" / when / "samples.json").read_text())
        assert len(saved) == 6 and all(len(s["completions"]) == 3 for s in saved)

        def exact(text, answer):  # the rule written out again: the last <answer> block equals the answer
            found = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
            return float(bool(found) and found[-1].strip() == answer)
        sampled = [exact(c, s["row"]["answer"]) for s in saved for c in s["completions"]]
        greedy = [exact(s["greedy"], s["row"]["answer"]) for s in saved]
        assert [v for s in saved for v in s["eval"]] == sampled
        assert summary[f"eval_{when}"] == pytest.approx(sum(sampled) / len(sampled))
        assert summary[f"greedy_eval_{when}"] == pytest.approx(sum(greedy) / len(greedy))
        # the saved rewards are the reward the summary reports
        rewards = [v for s in saved for v in s["rewards"]]
        assert summary[when] == pytest.approx(sum(rewards) / len(rewards))


def test_sample_files_keep_audio_and_video_clips_exactly(tmp_path):
    """Held-out audio is written as a WAV and each video frame as a PNG; reading them back gives
    the clip that was scored."""
    import numpy as np
    import soundfile
    from mmrl.tasks.demos.samples import write_samples
    from PIL import Image
    rng = np.random.default_rng(0)
    audio = rng.uniform(-1, 1, 800).astype(np.float32)
    frames = rng.integers(0, 256, (3, 8, 10, 3), dtype=np.uint8)
    samples = [{"row": {"prompt": "p", "audio": {"array": audio, "sampling_rate": np.int64(16000)},
                        "video": {"frames": frames, "fps": 4.0}},
                "completions": ["a"], "rewards": [1.0], "eval": [1.0], "greedy": "a", "greedy_reward": 1.0,
                "greedy_eval": 1.0}]
    write_samples(samples, tmp_path)
    row = json.loads((tmp_path / "samples.json").read_text())[0]["row"]
    assert row["audio"]["sampling_rate"] == 16000
    back, rate = soundfile.read(tmp_path / row["audio"]["wav"], dtype="float32")
    assert rate == 16000 and np.array_equal(back, audio)
    assert row["video"]["fps"] == 4.0 and len(row["video"]["frames"]) == 3
    read = np.stack([np.asarray(Image.open(tmp_path / name)) for name in row["video"]["frames"]])
    assert np.array_equal(read, frames)


def test_video_figure_pairs_each_clip_with_its_own_greedy_answer(tmp_path):
    """T-GRPO's greedy rollouts also answer each clip with shuffled frames (auxiliary rows); the
    figure's answers are the ordered clips' only, the ones the held-out evaluation scored."""
    overrides = ["max_steps=1", "warm_start.steps=2", "warm_start.batch_size=4", "eval.max_prompts=8",
                 "eval.group_size=2", "optim.prompts_per_step=2", "algorithm.group_size=2", "policy.max_new_tokens=8",
                 "policy.shuffled_rollouts=2", "logging.report_to=[none]", "logging.progress=false", "save_every=0",
                 "data.args.n_train=8", "data.args.n_eval=8", f"output_dir={tmp_path}"]
    summary = run_scored(RECIPES.get(DEMOS.get("video")), overrides, "video")
    saved = json.loads((tmp_path / "samples" / "after" / "samples.json").read_text())
    assert summary["after_detail"]["greedy_samples"] == [s["greedy"] for s in saved]
