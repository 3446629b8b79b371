"""The judge rewards (rewards/judge.py) against a real OpenAI-compatible HTTP server
(tests/openai_judge_app.py) serving a tiny random Qwen2 saved to disk, or scripted answers: regex
scores and P(Yes) equal what the same model gives in process, a score is read only where the
template asks for it (never a number in prose, never the prompt a server echoed), unreadable
answers stop or are skipped and counted, pairwise win rates follow Pref-GRPO's counting over the
group's pairs (its first <answer>, ties 0.5, rounding) as the in-process win_rate does."""

import base64
import inspect
import io
import json
import os
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from served import HERE, free_port, running

from mmrl.config.remote import ClientSettings
from mmrl.config.sections import RewardSpec
from mmrl.core.scoring import compute_rewards, metric_logger
from mmrl.errors import UserError
from mmrl.registry import load_plugins
from mmrl.rewards.judge import judge, judge_pairwise, user_message
from mmrl.rewards.win_rate import win_rate, win_rates
from mmrl.serving.remote_reward import RemoteRewardError, remote_problems, served_reward
from mmrl.serving.transport import Transport
from mmrl.tasks.demos.tiny_models import char_tokenizer_with, chat_template, tiny_qwen2

PROMPTS = ["1+1=", "2+2=", "3+1="]
COMPLETIONS = ["2", "5", "4"]


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    load_plugins()
    path = tmp_path_factory.mktemp("judge_model")
    tokenizer = char_tokenizer_with([], chat_template())
    model = tiny_qwen2(tokenizer, hidden=32, layers=1, heads=2, tied=False).eval()  # tied, it echoes the prompt's last token
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    port = free_port()
    os.environ["JUDGE_TEST_KEY"] = "judge-secret"  # the server requires it, the transports send it
    command = [sys.executable, str(HERE / "openai_judge_app.py"), str(path), str(port)]
    with running(command, port) as (url, _):  # compared with the model as the server loads it
        yield url, AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def in_process(model, tokenizer, text, max_tokens):
    """The greedy answer and the first token's probabilities of the model in process."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    return tokenizer.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True), out.scores[0][0].softmax(-1)


def transport(url, **client):
    return Transport([url], ClientSettings(api_key_env="JUDGE_TEST_KEY", **client))


@contextmanager
def scripted(tmp_path, answers: dict[str, str]):
    """tests/openai_judge_app.py answering each user text with the scripted content (a real server)."""
    script = tmp_path / "answers.json"
    script.write_text(json.dumps(answers))
    port = free_port()
    os.environ.setdefault("JUDGE_TEST_KEY", "judge-secret")  # the server requires it, the transport sends it
    with running([sys.executable, str(HERE / "openai_judge_app.py"), str(script), str(port)], port) as (url, _):
        yield transport(url, on_failure="skip")


def test_regex_scores_are_the_served_models_answers(judge_server):
    """Rows whose greedy answer has a digit score its last digit; the others are unreadable: skipped
    and counted."""
    url, model, tokenizer = judge_server
    template = "Rate: {prompt} {completion}"
    answers = [in_process(model, tokenizer, template.format(prompt=p, completion=c), 8)[0]
               for p, c in zip(PROMPTS, COMPLETIONS)]
    expected = [float(re.findall(r"\d", a)[-1]) if re.search(r"\d", a) else None for a in answers]
    metrics = {}
    got = judge(PROMPTS, COMPLETIONS, template, pattern=r"(\d)", max_tokens=8,
                transport=transport(url, on_failure="skip"), log_metric=metric_logger(metrics))
    assert got == expected
    assert metrics == {"sent_rows": 3, "failed_rows": 0, "unparsed_rows": expected.count(None)}
    scored = [v for v in expected if v is not None]
    if scored:  # the named range check: a score outside it is unreadable, never clipped
        got = judge(PROMPTS, COMPLETIONS, template, pattern=r"(\d)", max_tokens=8, score_range=[min(scored) + 0.5, 10],
                    transport=transport(url, on_failure="skip"))
        assert got == [v if v is not None and v > min(scored) else None for v in expected]


def test_yes_probability_is_the_models_softmax(judge_server):
    url, model, tokenizer = judge_server
    template = "Is {completion} right for {prompt}? Say Y or N."
    got = judge(PROMPTS, COMPLETIONS, template, parse="yes_probability", yes_tokens=["Y", "y"],
                no_tokens=["N", "n"], top_logprobs=len(tokenizer), transport=transport(url))
    for p, c, value in zip(PROMPTS, COMPLETIONS, got):
        probs = in_process(model, tokenizer, template.format(prompt=p, completion=c), 1)[1]
        yes = sum(probs[tokenizer.convert_tokens_to_ids(t)] for t in "Yy")
        no = sum(probs[tokenizer.convert_tokens_to_ids(t)] for t in "Nn")
        assert value == pytest.approx(float(yes / (yes + no)), rel=1e-4)


def test_prose_answers_are_never_numbers(judge_server):
    url, model, tokenizer = judge_server
    template = "Rate: {prompt} {completion}"
    answers = [in_process(model, tokenizer, template.format(prompt=p, completion=c), 8)[0]
               for p, c in zip(PROMPTS, COMPLETIONS)]
    assert not any(re.search(r"score: \d", a) for a in answers)  # prose, as far as this pattern reads
    with pytest.raises(RemoteRewardError, match=r"reward 'judge': http://127\.0\.0\.1:\d+/v1/chat/completions answered "
                                                r".* for rows 0-0 of 3, which rewards\.judge\.args \(parse, pattern, score_range, "
                                                r"verdicts, yes_tokens / no_tokens\) cannot read as a score"):
        judge(PROMPTS, COMPLETIONS, template, pattern=r"score: (\d)", max_tokens=8, transport=transport(url))
    metrics = {}
    got = compute_rewards({"judge": lambda prompts, completions, log_metric=None: judge(
        prompts, completions, template, pattern=r"score: (\d)", max_tokens=8, log_metric=log_metric,
        transport=transport(url, on_failure="skip"))}, PROMPTS, COMPLETIONS, {}, metrics)
    assert torch.isnan(got["judge"]).all()
    assert metrics["reward/judge/unparsed_rows"] == 3 and metrics["reward/judge/sent_rows"] == 3


def test_pairwise_win_rates_over_the_groups_pairs(judge_server):
    """Each pair's verdict is the model's greedy answer in process; the win rates are Pref-GRPO's."""
    url, model, tokenizer = judge_server
    template = "Which is better for {prompt}: 1) {completion_a} or 2) {completion_b}?"
    verdicts = {}
    for i in range(3):
        for j in range(3):
            if i != j:
                text = template.format(prompt=PROMPTS[0], completion_a=COMPLETIONS[i], completion_b=COMPLETIONS[j])
                verdicts[i, j] = in_process(model, tokenizer, text, 1)[0]
    labels = {v: 1.0 for v in verdicts.values()}  # every first character the model answers counts 1 ...
    first = verdicts[0, 1]
    labels[first] = 0.0  # ... except the answer to (0, 1), which counts 0: both kinds occur
    prompts = [PROMPTS[0]] * 3
    for pairs in ("once", "both"):
        got = judge_pairwise(prompts, COMPLETIONS, template, pattern=r"^(.)", verdicts=labels, max_tokens=1,
                             pairs=pairs, transport=transport(url))
        expected = win_rates(range(3), lambda a, b: labels[verdicts[a, b]], pairs)
        assert got == pytest.approx(expected)


def test_the_api_key_comes_from_the_named_environment_variable(judge_server):
    url = judge_server[0]
    with pytest.raises(RemoteRewardError, match=r"/v1/chat/completions answered HTTP 401 .* for rows 0-0 of 3"):
        judge(PROMPTS, COMPLETIONS, "{completion}", transport=Transport([url], ClientSettings()))
    with pytest.raises(UserError, match=r"client\.api_key_env='JUDGE_NO_SUCH_KEY': the environment variable"):
        Transport([url], ClientSettings(api_key_env="JUDGE_NO_SUCH_KEY"))


def test_a_judge_without_a_server_or_with_bad_arguments_says_which_key(judge_server):
    with pytest.raises(UserError, match=r"rewards\.judge\.url"):
        judge(PROMPTS, COMPLETIONS, "{completion}")
    with pytest.raises(UserError, match=r"rewards\.judge\.args\.score_range"):
        judge(PROMPTS, COMPLETIONS, "{completion}", score_range=[3, 1], transport=transport(judge_server[0]))
    with pytest.raises(UserError, match=r"args\.images names 'frames', which is neither 'completion' nor a column"):
        judge(PROMPTS, COMPLETIONS, "{completion}", images=["frames"], transport=transport(judge_server[0]))
    with pytest.raises(UserError, match=r"template names \{answer\}"):
        judge(PROMPTS, COMPLETIONS, "{answer}", transport=transport(judge_server[0]))


def test_a_recipes_judge_scores_groups_through_the_engine(judge_server):
    """rewards.judge_pairwise with a url, as a run builds it: the engine calls it per prompt group
    and each group's win rates are those of the judge asked about that group alone."""
    url, _, _ = judge_server
    args = {"template": "{prompt}: 1) {completion_a} 2) {completion_b}", "pattern": r"^(.)", "max_tokens": 1,
            "verdicts": {c: float(ord(c) % 2) for c in map(chr, range(32, 127))}}
    fn = served_reward("judge_pairwise", RewardSpec(url=url, args=args, client=ClientSettings(api_key_env="JUDGE_TEST_KEY")))
    prompts, completions = ["1+1="] * 3 + ["2+2="] * 2, ["2", "5", "4", "4", "x"]
    metrics = {}
    got = compute_rewards({"judge_pairwise": fn}, prompts, completions, {"group_id": [0, 0, 0, 1, 1]}, metrics)
    alone = [v for rows in ([0, 1, 2], [3, 4]) for v in judge_pairwise(
        [prompts[i] for i in rows], [completions[i] for i in rows], transport=transport(url), **args)]
    assert got["judge_pairwise"].tolist() == pytest.approx(alone)
    assert metrics["reward/judge_pairwise/sent_rows"] == 5
    assert "rewards.judge_pairwise.url" in " ".join(remote_problems("judge_pairwise", RewardSpec()))


def test_a_judges_bad_arguments_are_plan_problems():
    """Found before any model loads, each naming its key."""
    load_plugins()
    spec = RewardSpec(url="http://127.0.0.1:1", args={"template": "{prompt", "score_range": [1]})
    assert remote_problems("judge", spec) == ["rewards.judge.args.score_range=[1]: give [low, high] with low < high"]
    spec.args = {"template": "{prompt", "parse": "regex"}
    assert "rewards.judge.args.template='{prompt' is not a template" in remote_problems("judge", spec)[0]
    spec.args = {"parse": "yes_probability"}
    assert remote_problems("judge_pairwise", spec) == ["rewards.judge_pairwise.args.template is missing: the "
                                                       "judge's user message"]
    spec.args = {"template": "{completion_a}", "verdicts": {"1": 2.0}}
    assert "rewards.judge_pairwise.args.verdicts" in remote_problems("judge_pairwise", spec)[0]


def test_images_and_frames_go_as_png_data_urls_before_the_text():
    """The generated image (a PIL image) and a column's video frames (an array [F, H, W, C]) come
    back pixel for pixel from the message's data URLs, images first, then the filled template."""
    from PIL import Image
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(2, 4, 5, 3), dtype=np.uint8)
    image = Image.fromarray(rng.integers(0, 256, size=(6, 3, 3), dtype=np.uint8))
    message = user_message("judge", "{prompt} / {completion_name}", {"prompt": "a cat", "completion_name": "x"},
                           [image, frames])
    parts = message["content"]
    assert [p["type"] for p in parts] == ["image_url"] * 3 + ["text"] and parts[-1]["text"] == "a cat / x"
    decoded = [np.asarray(Image.open(io.BytesIO(base64.b64decode(p["image_url"]["url"].split(",", 1)[1]))))
               for p in parts[:3]]
    assert all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in parts[:3])
    assert np.array_equal(decoded[0], np.asarray(image))
    assert np.array_equal(decoded[1], frames[0]) and np.array_equal(decoded[2], frames[1])


def test_a_judge_behind_transformers_serve_that_echoes_the_prompt(tmp_path):
    """The judge against `transformers serve` itself (transformers' OpenAI-compatible server, as a
    subprocess). With a chat template its response parser does not know (turns in brackets), the
    server's answer repeats the whole prompt before the model's own text. A template ending "0-10"
    then read -10 on every row with the last number anywhere; the judge reads only the model's own
    text: a pattern for numbers anywhere reads what the model's greedy answer in process holds, the
    default score pattern finds no score (unparsed, counted), and a stop names the model's answer."""
    tokenizer = char_tokenizer_with([], chat_template(turn=("[", "]"), assistant="judge"))
    tiny_qwen2(tokenizer, hidden=32, layers=1, heads=2, tied=False).eval().save_pretrained(tmp_path)  # tied, it echoes
    tokenizer.save_pretrained(tmp_path)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tmp_path).eval(), AutoTokenizer.from_pretrained(tmp_path)
    template = "{prompt} {completion} Rate it 0-10"
    sent = template.format(prompt=PROMPTS[0], completion=COMPLETIONS[0])
    expected = in_process(model, tokenizer, sent, 8)[0]
    assert expected.strip()
    numbers = re.findall(r"-?\d+(?:\.\d+)?", expected)  # what a pattern for any number finds in the model's text
    port = free_port()
    serve = [str(Path(sys.executable).with_name("transformers")), "serve", str(tmp_path), "--port", str(port)]
    with running(serve, port) as (url, _):
        body = {"model": str(tmp_path), "messages": [{"role": "user", "content": sent}], "max_tokens": 8}
        raw = Transport([url], ClientSettings()).send("/v1/chat/completions", [body])[0].value
        echoed = raw["choices"][0]["message"]["content"]
        assert "".join(sent.split()) in "".join(echoed.split()) and echoed.rstrip().endswith(expected.strip())
        ask = dict(model=str(tmp_path), max_tokens=8)
        got = judge(PROMPTS[:1], COMPLETIONS[:1], template, pattern=r"(-?\d+(?:\.\d+)?)",
                    transport=Transport([url], ClientSettings(on_failure="skip")), **ask)
        assert got == [float(numbers[-1]) if numbers else None]  # never the template's -10
        with pytest.raises(RemoteRewardError, match=re.escape(url)) as stopped:
            judge(PROMPTS[:1], COMPLETIONS[:1], template, transport=Transport([url], ClientSettings()), **ask)
        assert expected.strip() in str(stopped.value) and "0-10" not in str(stopped.value)
        metrics = {}
        assert judge(PROMPTS[:1], COMPLETIONS[:1], template, transport=Transport([url], ClientSettings(on_failure="skip")),
                     log_metric=metric_logger(metrics), **ask) == [None]
        assert metrics == {"sent_rows": 1, "failed_rows": 0, "unparsed_rows": 1}


READINGS = {  # the judge's answer -> the score it gives (None: unreadable), score_range [0, 10]
    "7/10": 7.0,
    "7 out of 10": 7.0,
    "Score: 7": 7.0,
    "The colours match the prompt well.\n**Score:** 6/10": 6.0,
    "Looks right.\nScore: 3\nOn reflection the shape is off.\nFinal score: 2": 2.0,  # the last score line
    "I rate it 7/10.": None,  # a ratio in prose: not where the template asks for the score
    "The second picture has 3 cats and 2 dogs, quite good.": None,  # a number elsewhere in prose
    "Score: 7/100": None,  # a ratio out of another range
    "Score: 11": None,  # outside score_range: never clipped
}


def test_a_score_is_read_only_where_the_template_asks_for_it(tmp_path):
    """Scripted answers through a real server: a whole answer that is a score or a ratio, and a
    Score line, read as their score; numbers in prose are unparsed (counted), never the last number."""
    template = "Rate {completion} for {prompt} from 0 to 10. End with a line 'Score: N'."
    completions = [f"c{i}" for i in range(len(READINGS))]
    prompts = ["a red circle"] * len(completions)
    answers = {template.format(prompt=p, completion=c): a for p, c, a in zip(prompts, completions, READINGS)}
    metrics = {}
    with scripted(tmp_path, answers) as sent:
        got = judge(prompts, completions, template, score_range=[0, 10], transport=sent,
                    log_metric=metric_logger(metrics))
        assert got == list(READINGS.values())
        unread = list(READINGS.values()).count(None)
        assert metrics == {"sent_rows": len(READINGS), "failed_rows": 0, "unparsed_rows": unread}
        with pytest.raises(RemoteRewardError, match=r"answered 'I rate it 7/10\.' for rows 5-5 of 9.*cannot read "
                                                    "as a score"):
            judge(prompts, completions, template, score_range=[0, 10],
                  transport=Transport(sent.urls, ClientSettings(api_key_env="JUDGE_TEST_KEY")))
        # without a range a ratio still reads as its numerator, and a bare number as itself
        assert judge(prompts[:3], completions[:3], template, transport=sent) == [7.0, 7.0, 7.0]


def pref_grpo_win_rates(n: int, answers: dict[tuple[int, int], str]) -> list[float]:
    """Pref-GRPO's counting as their `_pairwise_win_rate` does it (CodeGoat24/Pref-GRPO,
    fastvideo/rewards/unifiedreward_think.py), written out: each pair (i, j), i < j, the first
    <answer>...</answer> of the judge's text; "Image 1 is better" in it: i wins, else "Image 2 is
    better" in it: j wins, else a tie (0.5 each); a rate = wins / comparisons, rounded to 3 places."""
    wins, seen = [0.0] * n, [0] * n
    for (i, j), text in answers.items():
        seen[i] += 1
        seen[j] += 1
        found = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
        verdict = found.group(1).strip() if found else ""
        if verdict and "Image 1 is better" in verdict:
            wins[i] += 1
        elif verdict and "Image 2 is better" in verdict:
            wins[j] += 1
        else:
            wins[i] += 0.5
            wins[j] += 0.5
    return [round(w / s, 3) for w, s in zip(wins, seen)]


PAIRWISE_TEMPLATE = ("Which image fits '{prompt}' better? Image 1: {completion_a}. Image 2: {completion_b}. Think "
                     "in <think></think>, then answer in the format <answer>Image 1 is better</answer> or "
                     "<answer>Image 2 is better</answer>.")
OWN_ANSWERS = {  # each pair's answer, as the judge writes it
    (0, 1): "<think>Image 1 (9/10), Image 2 (6/10)</think>\n<answer>Image 1 is better</answer>",
    (0, 2): "<answer>Image 2 is better</answer>",
    (0, 3): "<think>both fit</think><answer>Both images are equally good</answer>",  # a tie
    (1, 2): "<answer>Image 2 is better</answer>",
    (1, 3): "<answer>Image 1 is better</answer>\n<answer>Image 2 is better</answer>",  # the first counts
    (2, 3): "<answer>\nImage 2 is better\n</answer>",
}


def test_pairwise_follows_pref_grpo_and_equals_the_in_process_win_rate(tmp_path):
    """Scripted answers through a real server, one of them after an echo of its prompt (whose
    format example names Image 1): the win rates are the authors' (first <answer>, a tie 0.5 each,
    rounded to 3 places), those of the in-process win_rate given the same verdicts, and by hand
    0: (1 + 0 + 0.5) / 3, 1: 1 / 3, 2: 2 / 3, 3: (0.5 + 0 + 1) / 3."""
    completions, prompt = ["A", "B", "C", "D"], "a red circle"
    served = {}
    for (i, j), text in OWN_ANSWERS.items():
        sent = PAIRWISE_TEMPLATE.format(prompt=prompt, completion_a=completions[i], completion_b=completions[j])
        served[sent] = f"user\n{sent}\nassistant\n{text}" if (i, j) == (1, 2) else text  # the echoing server
    verdict = {(i, j): 1.0 if "<answer>Image 1" in t else 0.0 if "<answer>Image 2" in t or "\nImage 2" in t else 0.5
               for (i, j), t in OWN_ANSWERS.items()}
    by_hand = [round(1.5 / 3, 3), round(1 / 3, 3), round(2 / 3, 3), round(1.5 / 3, 3)]
    in_process = win_rates(range(4), lambda a, b: verdict[a, b], "once",
                           inspect.signature(win_rate).parameters["decimals"].default)
    assert pref_grpo_win_rates(4, OWN_ANSWERS) == by_hand == in_process
    metrics = {}
    with scripted(tmp_path, served) as sent:
        got = judge_pairwise([prompt] * 4, completions, PAIRWISE_TEMPLATE, transport=sent,
                             log_metric=metric_logger(metrics))
        assert got == by_hand
        assert metrics == {"sent_rows": 4, "failed_rows": 0, "unparsed_rows": 0}
        untagged = PAIRWISE_TEMPLATE.format(prompt=prompt, completion_a="A", completion_b="E")
    # an answer without <answer> (the authors count it a tie) is unreadable here: the group gets no reward
    with scripted(tmp_path, {untagged: "Image 1 is better, I think"}) as sent:
        metrics = {}
        assert judge_pairwise([prompt] * 2, ["A", "E"], PAIRWISE_TEMPLATE, transport=sent,
                              log_metric=metric_logger(metrics)) == [None, None]
        assert metrics["unparsed_rows"] == 2
