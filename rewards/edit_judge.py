"""An edit judge behind an OpenAI-compatible server (`edit_judge`): EditScore's prompts and its
reading of the answer, for an EditScore model (EditScore-7B / 72B, served by vLLM or SGLang) or any
vision-language judge. The prompts are VIEScore's, as EditScore's evaluator assembles them
(VectorSpaceLab/EditScore, editscore/vie_prompts.py and editscore/__init__.py at 6e0f1b9): its
context, then for semantics (SC) the two-image editing rule and the two scores (editing success,
over-editing) with the instruction, the source then the edit shown; for perceptual quality (PQ)
the naturalness and artifacts rule with the edit alone. Every "10" of the rules reads
`score_range` (25, EditScore's default). An answer's ``"score": [a, b]`` list is read as
EditScore reads it: min(a, b) / (score_range / 10), in [0, 10];

    aspect: semantics   SC      aspect: quality   PQ      aspect: overall   sqrt(SC PQ)  (two requests)

An answer without a score list is never a number (EditScore substitutes score_range / 2): it is
counted and stops the step or leaves the row without this reward, as the `judge` reward's
(`rewards.NAME.client.on_failure`). The requests go through the served rewards' transport
(`rewards.NAME.url`, `client`, record / replay); docs/editing.md#edit-rewards."""

from __future__ import annotations

import math
import re
from typing import Any, Literal, Sequence

from mmrl.core.scoring import register_reward
from mmrl.errors import UserError
from mmrl.serving.remote_reward import SENDS_OWN_REQUESTS
from mmrl.serving.transport import Transport

from .judge import ask, count_rows, user_message
from .judge_reading import own_text
from .outputs import IMAGE

CONTEXT = (
    'You are a professional digital artist. You will have to evaluate the effectiveness of the '
    'AI-generated image(s) based on given rules.\n'
    'All the input images are AI-generated. All human in the images are AI-generated too. so you need '
    'not worry about the privacy confidentials.\n'
    '\n'
    'IMPORTANT: You will have to give your output in this way (Keep your reasoning concise and short.):\n'
    '{\n'
    '"reasoning" : "...",\n'
    '"score" : [...]\n'
    '}\n'
)
TWO_IMAGE_EDIT_RULE = (
    'RULES:\n'
    '\n'
    'Two images will be provided: The first being the original AI-generated image and the second being '
    'an edited version of the first.\n'
    'The objective is to evaluate how successfully the editing instruction has been executed in the '
    'second image.\n'
    '\n'
    'Note that sometimes the two images might look identical due to the failure of image edit.\n'
)
SEMANTICS_RULE = (
    '\n'
    'From scale 0 to 10: \n'
    'A score from 0 to 10 will be given based on the success of the editing. (0 indicates that the scene '
    'in the edited image does not follow the editing instruction at all. 10 indicates that the scene in '
    'the edited image follow the editing instruction text perfectly.)\n'
    'A second score from 0 to 10 will rate the degree of overediting in the second image. (0 indicates '
    'that the scene in the edited image is completely different from the original. 10 indicates that the '
    'edited image can be recognized as a minimal edited yet effective version of original.)\n'
    "Put the score in a list such that output score = [score1, score2], where 'score1' evaluates the "
    "editing success and 'score2' evaluates the degree of overediting.\n"
    '\n'
    'Editing instruction: <instruction>\n'
)
QUALITY_RULE = (
    'RULES:\n'
    '\n'
    'The image is an AI-generated image.\n'
    'The objective is to evaluate how successfully the image has been generated.\n'
    '\n'
    'From scale 0 to 10: \n'
    'A score from 0 to 10 will be given based on image naturalness. \n'
    '(\n'
    '    0 indicates that the scene in the image does not look natural at all or give a unnatural '
    'feeling such as wrong sense of distance, or wrong shadow, or wrong lighting. \n'
    '    10 indicates that the image looks natural.\n'
    ')\n'
    'A second score from 0 to 10 will rate the image artifacts. \n'
    '(\n'
    '    0 indicates that the image contains a large portion of distortion, or watermark, or scratches, '
    'or blurred faces, or unusual body parts, or subjects not harmonized. \n'
    '    10 indicates the image has no artifacts.\n'
    ')\n'
    'Put the score in a list such that output score = [naturalness, artifacts]\n'
)
SCORE_LIST = re.compile(r'"?score"?\s*:\s*\[([^\]]*)\]', re.IGNORECASE)
NUMBER = re.compile(r"[-+]?\d*\.?\d+")
Aspect = Literal["semantics", "quality", "overall"]


def editscore_prompts(score_range: int) -> tuple[str, str]:
    """(the SC prompt with `<instruction>` to fill, the PQ prompt), as EditScore's evaluator joins them."""
    scale = str(score_range)
    return ("\n".join([CONTEXT, TWO_IMAGE_EDIT_RULE, SEMANTICS_RULE.replace("10", scale)]),
            "\n".join([CONTEXT, QUALITY_RULE.replace("10", scale)]))


class ScoreListReading:
    """EditScore's reading: the last ``"score": [...]`` list of the judge's own text, min / (range / 10)."""

    def __init__(self, score_range: int):
        self.score_range = score_range

    def body(self, model: str, messages: list[dict], max_tokens: int, temperature: float, top_logprobs: int) -> dict:
        return {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature}

    def read(self, choice: dict[str, Any], sent: str = "") -> float | None:
        text = own_text(str((choice.get("message") or {}).get("content") or ""), sent)
        lists = SCORE_LIST.findall(text)
        scores = [float(n) for n in NUMBER.findall(lists[-1])] if lists else []
        if not scores or not all(0 <= s <= self.score_range for s in scores):
            return None
        return min(scores) / (self.score_range / 10)


@register_reward("edit_judge", outputs=IMAGE)
def edit_judge(prompts, completions, image: Sequence, aspect: Aspect = "semantics", score_range: int = 25,
               model: str = "judge", max_tokens: int = 512, temperature: float = 0.0, *,
               transport: Transport | None = None, log_metric=None, **columns):
    """Each edit's EditScore (the module docstring); `image` is the source image column."""
    if problems := args_problems({"aspect": aspect, "score_range": score_range}):
        raise UserError(problems[0])
    reading, (semantics, quality) = ScoreListReading(score_range), editscore_prompts(score_range)
    asked = {"semantics": aspect != "quality", "quality": aspect != "semantics"}
    bodies, spans = [], []
    for i, edit in enumerate(completions):
        instruction = str(prompts[i]["prompt"] if isinstance(prompts[i], dict) else prompts[i])
        if asked["semantics"]:
            text = semantics.replace("<instruction>", instruction)
            bodies.append(reading.body(model, [_message(text, [image[i], edit])], max_tokens, temperature, 0))
            spans.append([i])
        if asked["quality"]:
            bodies.append(reading.body(model, [_message(quality, [edit])], max_tokens, temperature, 0))
            spans.append([i])
    answers = ask("edit_judge", transport, reading, bodies, spans, len(completions), columns.get("group_id"))
    per_row = len(answers) // max(1, len(completions))
    rows = [answers[i * per_row:(i + 1) * per_row] for i in range(len(completions))]
    count_rows(log_metric, [next((a for a in row if isinstance(a, str)), row[0]) for row in rows])
    return [None if any(isinstance(a, str) for a in row) else math.sqrt(math.prod(row)) if len(row) == 2 else row[0]
            for row in rows]


def _message(text: str, images: list) -> dict[str, Any]:
    """The user turn: the images in order, then the prompt (no template fields: `{` and `}` are literal)."""
    return user_message("edit_judge", "{text}", {"text": text}, images)


def args_problems(args: dict[str, Any]) -> list[str]:
    """What is wrong with ``rewards.edit_judge.args``, found before any model loads."""
    problems = []
    if args.get("aspect", "semantics") not in ("semantics", "quality", "overall"):
        problems.append(f"rewards.edit_judge.args.aspect={args['aspect']!r}: choose semantics, quality or overall")
    score_range = args.get("score_range", 25)
    if not isinstance(score_range, int) or isinstance(score_range, bool) or score_range < 1:
        problems.append(f"rewards.edit_judge.args.score_range={score_range!r}: the top of EditScore's scale, a "
                        "positive integer (25 as EditScore, 10 as VIEScore)")
    return problems


setattr(edit_judge, SENDS_OWN_REQUESTS, True)
edit_judge.args_problems = args_problems
