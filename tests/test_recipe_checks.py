"""Every value a recipe names is checked against the registry, the task and the data before any
model loads (issue 46): a reward's arguments and their allowed values, the kind of completion it
scores against the adapter's, the columns it and the adapter need, a size the pipeline cannot draw,
the warm start's targets, a judge's template fields, the rewards' urls, tool files, and a sweep's
held-out rows. Each case ends in one error naming the key, the rows and the value; `no_model` (the
recipe alone is read) and `no_weights` (the data is read too) fail a test that loads the model."""

import json
import time

import pytest
from helpers import TINY_RECIPE, tiny_overrides
from PIL import Image
from served import free_port

from mmrl.config.parse import ConfigError, load_recipe, parse_config
from mmrl.data import DataError
from mmrl.errors import UserError
from mmrl.registry import RECIPES, load_plugins
from mmrl.train.loop.trainer import Trainer

QUIET = ["logging.report_to=[none]", "logging.progress=false"]


def recipe(name, tmp_path, *overrides):
    load_plugins()
    return load_recipe(RECIPES.get(name), [f"output_dir={tmp_path / 'run'}", *QUIET, *overrides])


def tiny(tmp_path, *overrides):
    return parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "run") + list(overrides))


def refused(cfg, error=ConfigError) -> str:
    with pytest.raises(error) as info:
        Trainer(cfg)
    return str(info.value)


def rows_file(tmp_path, rows, name="rows.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def picture(tmp_path, name="start.png"):
    Image.new("RGB", (32, 32), (200, 40, 40)).save(tmp_path / name)
    return name


# ----- a reward's arguments and their allowed values -----------------------------------------------
def test_a_reward_argument_outside_its_choices_names_them_and_the_closest(tmp_path, no_model):
    text = refused(recipe("t2v_demo", tmp_path, "rewards.colour_shape.args.frames=alll",
                          "rewards.colour_shape.args.aggregate=avg"))
    assert text.startswith("2 problems in the recipe:")
    assert ("rewards.colour_shape.args.frames='alll' is not one of all, first, middle, last, every_K "
            "(did you mean 'all'?)") in text
    assert "rewards.colour_shape.args.aggregate='avg' is not one of mean, min, max, median" in text
    assert ("rewards.iou.args.coords='pixel' is not one of pixels, norm1, norm1000 (did you mean 'pixels'?)"
            in refused(recipe("grounding", tmp_path, "rewards.iou.args.coords=pixel")))
    assert ("rewards.accuracy.args.preset='r1-aqa' is not one of video_r1, r1_aqa, vlm_r1 (or null) "
            "(did you mean 'r1_aqa'?)") in refused(tiny(tmp_path, "rewards.accuracy.args.preset=r1-aqa"))


def test_numbered_choices_take_a_whole_number_from_one(tmp_path, no_weights):
    for frames in ("every_0", "every_x", "every_"):
        assert f"frames={frames!r} is not one of" in refused(recipe("t2v_demo", tmp_path, f"rewards.colour_shape.args.frames={frames}"))
    with pytest.raises(AssertionError, match="the policy was built"):  # every check passed
        Trainer(recipe("t2v_demo", tmp_path, "rewards.colour_shape.args.frames=every_3", "warm_start.steps=0",
                       "data.args.n_train=8", "data.args.n_eval=4"))


def test_every_built_in_reward_declares_what_it_scores_and_uses_one_mechanism_for_choices():
    """Each built-in reward says which completions it scores (a judge or a win rate scores whatever
    its server or its preference reads), and its arguments with choices are Literal annotations."""
    import inspect

    from mmrl.core.scoring import REWARD_OUTPUTS, REWARDS
    from mmrl.train.plan.reward_args import literal_choices
    load_plugins()
    built_in = [name for name in REWARDS.names() if REWARDS.get(name).__module__.startswith(("mmrl.rewards", "mmrl.tasks"))]
    assert set(built_in) - set(REWARD_OUTPUTS) == {"judge", "judge_pairwise", "win_rate"}
    with_choices = {name: sorted(p.name for p in inspect.signature(REWARDS.get(name), eval_str=True).parameters.values()
                                 if literal_choices(p.annotation) is not None) for name in built_in}
    assert with_choices["iou"] == ["coords", "frame", "match", "mode", "preset"]
    assert with_choices["latex_render"] == ["component", "kind", "preset", "renderer"]
    assert with_choices["image_consistency"] == ["aggregate", "embedding", "frames"]
    for name in ("clip", "aesthetic", "hpsv2", "pickscore", "colour_shape"):
        assert with_choices[name] == ["aggregate", "frames"], name
    for name in ("wer", "cer", "asr_wer", "deepeyes", "length", "accuracy", "videoalign", "judge", "win_rate"):
        assert with_choices[name], name


def test_a_stages_reward_arguments_are_checked_as_the_recipes(tmp_path, no_model):
    text = refused(tiny(tmp_path, "max_steps=2",
                        "stages=[{steps: 1}, {steps: 1, rewards: {accuracy: {args: {mode: numerc}}}}]"))
    assert ("stages[1].rewards.accuracy.args.mode='numerc' is not one of auto, exact, numeric, choice "
            "(did you mean 'numeric'?)") in text
    assert "stages[0]" not in text


@pytest.mark.parametrize("reward, args, error", [
    ("length", {"mode": "linear"}, "mode='linear' is not one of"),
    ("length", {"unit": "chars"}, "unit='chars' is not one of"),
    ("wer", {"mode": "clipped"}, "mode='clipped' is not one of"),
    ("iou", {"match": "best"}, "match='best' is not one of"),
    ("iou", {"coords": "pixel"}, "coords='pixel' is not one of"),
])
def test_the_declared_choices_are_the_ones_the_reward_refuses_when_called(reward, args, error):
    """The plan's check and the reward's own (a direct call) refuse the same value, and every
    declared value passes the reward's own check."""
    import inspect
    import typing

    from mmrl.core.scoring import get_reward
    from mmrl.train.plan.reward_args import argument_problems
    load_plugins()
    fn = get_reward(reward)
    assert error in argument_problems(reward, fn, args)[0]
    columns = {"wer": {"reference": ["a"]}, "iou": {"boxes": [[[0, 0, 1, 1]]], "image_size": [[8, 8]]}}.get(reward, {})
    with pytest.raises(ValueError, match=error.split("=")[0]):
        fn(["p"], ["<answer>1</answer> [0, 0, 1, 1]"], **columns, **args)
    (name, value), = args.items()
    for allowed in typing.get_args(inspect.signature(fn, eval_str=True).parameters[name].annotation):
        assert not argument_problems(reward, fn, {name: allowed})
        fn(["p"], ["<answer>1</answer> [0, 0, 1, 1]"], **columns, **{name: allowed})


# ----- the kind of completion a reward scores --------------------------------------------------------
def test_a_reward_of_other_completions_than_the_task_draws_is_refused(tmp_path, no_model):
    text = refused(tiny(tmp_path, "rewards.temporal_consistency.weight=1", "rewards.motion.weight=1"))
    assert ("rewards.temporal_consistency: reward 'temporal_consistency' scores video or audio_video completions, "
            "and task=causal_lm makes text ones with this policy section; rewards that score text: accuracy, ") in text
    assert "rewards.motion: reward 'motion' scores video or audio_video completions" in text
    assert "digit_share" not in text  # a user's reward that declares nothing is not checked
    text = refused(recipe("t2i_flowgrpo", tmp_path, "rewards.accuracy.weight=1"))
    assert ("rewards.accuracy: reward 'accuracy' scores text or episode completions, and task=diffusion makes "
            "image ones") in text
    assert "motion_direction" in refused(recipe("t2i_flowgrpo", tmp_path, "rewards.motion_direction.weight=1"))


def test_an_image_reward_scores_videos_and_a_users_declaration_is_checked(tmp_path, no_model):
    module = tmp_path / "my_rewards.py"
    module.write_text("from mmrl.rewards import register_reward\n\n\n"
                      "@register_reward('my_sharpness', outputs=('image',))\n"
                      "def my_sharpness(prompts, completions, **columns):\n    return [0.0] * len(completions)\n")
    text = refused(tiny(tmp_path, f"reward_modules=[{module}]", "rewards.my_sharpness.weight=1"))
    assert "rewards.my_sharpness: reward 'my_sharpness' scores image completions, and task=causal_lm makes text" in text
    from mmrl.train.plan.validate import validate
    validate(recipe("t2v_wan", tmp_path, "rewards.clip.weight=1"))  # frame by frame
    # a video with its sound: video, audio and audio-visual rewards; a silent video has no sound to sync
    validate(recipe("t2av_ltx2", tmp_path, "rewards.clip.weight=1", "rewards.temporal_consistency.weight=1"))
    assert ("rewards.av_sync: reward 'av_sync' scores audio_video completions, and task=diffusion makes video ones"
            in refused(recipe("t2v_wan", tmp_path, "rewards.av_sync.weight=1")))


# ----- columns the rewards and the adapter need, against the data ------------------------------------
def test_video_reward_columns_the_rows_lack_are_named_before_the_model_loads(tmp_path, no_weights):
    rows = rows_file(tmp_path, [{"prompt": "red circle moving right"}, {"prompt": "blue square moving up"}])
    text = refused(recipe("t2v_demo", tmp_path, "data.name=null", f"data.path={rows}", "warm_start.steps=0",
                          "rewards.image_consistency.args.embedding=pixels"), DataError)
    for column, reward in (("colour", "colour_shape"), ("shape", "colour_shape"), ("direction", "motion_direction"),
                           ("image", "image_consistency")):
        assert (f"rows.jsonl: column {column!r}: no row has this column (needed by reward {reward!r}); the rows' "
                f"columns: prompt") in text, column


def test_a_column_value_a_video_reward_cannot_read_is_named_with_its_row(tmp_path, no_weights):
    rows = rows_file(tmp_path, [{"prompt": "red circle moving right", "colour": "red", "shape": "circle",
                                 "direction": "right"},
                                {"prompt": "a purple blob", "colour": "purple", "shape": "blob", "direction": "sideways"}])
    text = refused(recipe("t2v_demo", tmp_path, "data.name=null", f"data.path={rows}", "warm_start.steps=0"), DataError)
    assert "column 'colour': colour_shape: colour 'purple' is not one of" in text and "row 1 ('purple')" in text
    assert "column 'shape': colour_shape: shape 'blob' is not one of ['circle', 'square']" in text
    assert "column 'direction': motion_direction: direction 'sideways' is not one of right, up, left, down" in text


def test_image_to_video_rows_without_their_image_and_a_wrong_image_column(tmp_path, no_weights):
    image = picture(tmp_path)
    rows = rows_file(tmp_path, [{"prompt": "red circle", "image": image, "colour": "red", "shape": "circle"},
                                {"prompt": "blue square", "colour": "blue", "shape": "square"}])
    base = ["data.name=null", f"data.path={rows}"]
    text = refused(recipe("i2v_wan", tmp_path, *base), DataError)
    assert ("rows.jsonl: column 'image': missing (needed by policy.image_column, the image each prompt is "
            "conditioned on): 1 row(s): row 1") in text
    text = refused(recipe("i2v_wan", tmp_path, *base, "policy.image_column=picture"), DataError)
    assert ("column 'picture': no row has this column (needed by policy.image_column, the image each prompt is "
            "conditioned on); the rows' columns: colour, image, prompt, shape") in text
    assert "policy.image_column is not set: WanImageToVideo conditions each prompt on an image" in refused(
        recipe("i2v_wan", tmp_path, *base, "policy.image_column=null"))
    with pytest.raises(AssertionError, match="the policy was built"):  # every row has its image
        Trainer(recipe("i2v_wan", tmp_path, "data.name=null", "data.path=" + str(rows_file(
            tmp_path, [{"prompt": "red circle", "image": image, "colour": "red", "shape": "circle"}], "good.jsonl"))))


def test_editing_rows_without_their_source_image_are_refused_before_the_model_loads(tmp_path, no_weights):
    image = picture(tmp_path)
    rows = rows_file(tmp_path, [{"prompt": "make the circle blue", "image": image, "colour": "blue", "shape": "circle"},
                                {"prompt": "move the square left", "colour": "red", "shape": "square"}])
    for name in ("edit_qwen_image", "edit_flux_kontext"):
        text = refused(recipe(name, tmp_path, "data.name=null", f"data.path={rows}"), DataError)
        assert ("rows.jsonl: column 'image': missing (needed by policy.image_column, the image each prompt is "
                "conditioned on): 1 row(s): row 1") in text, name
    assert "policy.image_column is not set: QwenImageEdit conditions each prompt on an image" in refused(
        recipe("edit_qwen_image", tmp_path, "data.name=null", f"data.path={rows}", "policy.image_column=null"))


# ----- sizes the pipeline cannot draw --------------------------------------------------------------
def test_a_size_the_vae_and_patches_cannot_take_names_the_multiple(tmp_path, no_model):
    text = refused(recipe("t2v_wan", tmp_path, "policy.height=30"))
    assert text == ("policy.height=30: WanPipeline draws heights and widths that are multiples of 8 (its VAE's "
                    "downsampling times its denoiser's patch size); use 24 or 32")
    assert "policy.width=6: StableDiffusion3Pipeline draws heights and widths that are multiples of 4" in refused(
        recipe("t2i_flowgrpo", tmp_path, "policy.model=tiny:sd3", "policy.width=6"))
    assert "policy.height=256: StableDiffusion3Pipeline draws at most 128 pixels a side" in refused(
        recipe("t2i_flowgrpo", tmp_path, "policy.model=tiny:sd3", "policy.height=256"))


# ----- the warm start's targets --------------------------------------------------------------------
@pytest.mark.parametrize("form", ["jsonl", "parquet"])
def test_the_grounding_recipe_on_r1v_rows_names_the_warm_starts_column(tmp_path, no_weights, form):
    """The shipped grounding recipe warm-starts on `target`; R1-V's rows have none. Refused before
    the model loads, naming the column, the file and the way out; warm_start.steps=0 takes the rows."""
    image = picture(tmp_path)
    rows = [{"image": image, "problem": f"Where is object {i}? Answer [x1, y1, x2, y2].",
             "solution": "<answer>[8, 8, 24, 24]</answer>"} for i in range(3)]
    if form == "jsonl":
        path = rows_file(tmp_path, rows)
    else:
        import pandas as pd
        path = tmp_path / "rows.parquet"
        pd.DataFrame(rows).to_parquet(path)
    user = ["data.name=null", f"data.path={path}", "data.prompt_column=problem", "rewards.iou.columns={boxes: solution}"]
    text = refused(recipe("grounding", tmp_path, *user), DataError)
    assert (f"{path.name}: column 'target': no row has this column (needed by the warm start, "
            "warm_start.target_column; warm_start.steps=2200, and warm_start.steps=0 trains without it)") in text
    with pytest.raises(AssertionError, match="the policy was built"):
        Trainer(recipe("grounding", tmp_path, *user, "warm_start.steps=0"))


def test_a_resumed_or_scoring_run_does_not_need_the_warm_starts_column(tmp_path, no_weights):
    rows = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2"}] * 4)
    cfg = tiny(tmp_path, "data.name=null", f"data.path={rows}", "warm_start.steps=5", f"data.eval_path={rows}")
    assert "column 'target'" in refused(cfg, DataError)
    with pytest.raises(AssertionError, match="the policy was built"):
        Trainer(cfg, for_training=False)  # `mmrl eval` does not warm-start


# ----- a judge's template fields --------------------------------------------------------------------
def test_a_judge_template_field_the_rows_lack_names_the_fields_and_the_closest(tmp_path, no_weights):
    cfg = tiny(tmp_path, "rewards.judge.url=http://127.0.0.1:1", "rewards.judge.weight=1",
               "rewards.judge.args.template='Rate {completon} for {prompt}; the answer is {answer}'",
               "rewards.judge.args.images=[completion, diagram]")
    text = refused(cfg)
    assert text.startswith("2 problems of the rewards with the data:")
    assert ("rewards.judge.args.template names {completon}, which is neither prompt nor completion nor a column of "
            "the rows (answer, auxiliary, completion_ids, difficulty, group_id, prompt, target); did you mean "
            "'completion'?") in text
    assert "rewards.judge.args.images names 'diagram', which is neither completion nor a column of the rows" in text


# ----- reward urls -------------------------------------------------------------------------------
def test_a_reward_url_must_be_http_with_a_host(tmp_path, no_model):
    text = refused(tiny(tmp_path, "rewards.digit_share.url=ftp://example.org/score",
                        "rewards.accuracy.url=[localhost:8000, 'http://:80']"))
    assert ("rewards.digit_share.url='ftp://example.org/score': the scheme 'ftp' is not http or https; a reward "
            "server answers HTTP requests") in text
    assert ("rewards.accuracy.url[0]='localhost:8000': give the scheme, http:// or https:// (e.g. "
            "'http://localhost:8000')") in text
    assert "rewards.accuracy.url[1]='http://:80': the url names no host" in text


def test_a_url_nobody_serves_is_refused_at_once_before_the_model_loads(tmp_path, no_weights):
    port = free_port()
    started = time.monotonic()
    text = refused(tiny(tmp_path, f"rewards.digit_share.url=http://127.0.0.1:{port}"), UserError)
    assert text.startswith(f"rewards.digit_share.url: http://127.0.0.1:{port} nothing answers there (")
    assert "mmrl serve-reward digit_share --port PORT" in text and "\n" not in text
    assert time.monotonic() - started < 30  # not retried: refused once, before anything loads
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_launched_server_is_asked_once_started_still_before_the_model(tmp_path, no_weights):
    """`rewards.NAME.server` starts before the model loads; every url is then asked, the launched
    server's and any other."""
    import sys
    port, nobody = free_port(), free_port()
    server = ("rewards.digit_share.server={command: '" + f"{sys.executable} -m http.server {port} --bind 127.0.0.1"
              + "', ready: /, timeout_s: 60}")
    text = refused(tiny(tmp_path, f"rewards.digit_share.url=[http://127.0.0.1:{port}, http://127.0.0.1:{nobody}]",
                        server), UserError)
    assert text.startswith(f"rewards.digit_share.url: http://127.0.0.1:{nobody} nothing answers there")
    with pytest.raises(AssertionError, match="the policy was built"):  # http.server answers /health with 404
        Trainer(tiny(tmp_path, f"rewards.digit_share.url=http://127.0.0.1:{port}", server, "overwrite=true"))


def test_a_health_answer_of_a_server_error_is_refused():
    from mmrl.serving.health import health_problem
    from served import fault_command, running
    port = free_port()
    with running(fault_command("error500", port), port) as (url, _):
        assert health_problem(url, 5.0) is None  # the fault server's /health answers 200; its /score fails
        assert health_problem(url + "/no-such-prefix", 5.0) is None  # 404: a server is there
    assert health_problem(url, 5.0).startswith("nothing answers there")


# ----- tool files --------------------------------------------------------------------------------
def test_a_tool_file_that_does_not_exist_is_refused_before_the_model_loads(tmp_path, no_model):
    assert "'nowhere.py' does not exist" in refused(tiny(tmp_path, "policy.episode.tools=[nowhere.py:lookup]"))
    assert "'missing_tools.py' does not exist" in refused(
        tiny(tmp_path, "policy.episode.tools=[lookup]", "policy.episode.tool_modules=[missing_tools.py]"))


# ----- held-out rows for what scores them --------------------------------------------------------------
def test_a_sweep_over_data_without_held_out_rows_is_refused_before_any_cell_trains(tmp_path):
    from mmrl.experiments.sweep import sweep
    rows = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2", "target": "2"}] * 8)  # the demo warm-starts
    said = []
    with pytest.raises(UserError) as info:
        sweep("text", ["algorithm.estimator=grpo,rloo"], 2, tmp_path / "sweep",
              ["data.name=null", f"data.path={rows}", *QUIET], say=said.append)
    assert str(info.value).startswith(f"mmrl sweep: cell algorithm.estimator=grpo: eval: the data ({rows}) has no "
                                      "held-out rows to score; set data.eval_path")
    assert said == [] and not (tmp_path / "sweep").exists()


def test_a_demos_run_without_held_out_rows_is_refused_before_the_model_loads(tmp_path, no_weights):
    from mmrl.experiments.demo import run_scored
    rows = rows_file(tmp_path, [{"prompt": "1+1=", "answer": "2", "target": "2"}] * 8)
    with pytest.raises(UserError, match=r"has no held-out rows to score"):
        run_scored(RECIPES.get("text_demo"), [f"output_dir={tmp_path / 'run'}", "data.name=null", f"data.path={rows}",
                                              *QUIET], "text")
