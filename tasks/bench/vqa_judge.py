"""A vision-language judge asked one question about one image, as GenEval 2's ``evaluation.py``
asks Qwen3-VL (``send_message_with_image``): the user turn holds the image and the question, the
model's next-token distribution after the generation prompt is read once (greedy, one token).

`ask(judge, image, question, answers)` -> (the most probable token, decoded; the sum of the
probabilities of each answer's first token, over `answers` as listed, a token listed twice counted
twice as the authors' loop does). The judge is any transformers image-text-to-text model with
its processor (``judge_path``: GenEval 2 uses Qwen/Qwen3-VL-8B-Instruct); loaded once per
process. A judge on another machine is reached by serving the benchmark's scorer there
(``mmrl serve-reward SCORER``, then ``--scorer-url``). Answers are cached per (judge, image,
question), so a benchmark's several metrics ask each question once.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, Sequence

import torch

from mmrl.rewards.clip import _device
from .scorer_models import scorer_model

_ASKED: dict[tuple, tuple[str, list[float]]] = {}
CACHE_LIMIT = 100_000


@functools.lru_cache(maxsize=1)
def load_judge(path: str, device: str):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    model = scorer_model(AutoModelForImageTextToText, path, "vqa judge: judge_path", device)
    return model, AutoProcessor.from_pretrained(path)


def _image_key(image: Any) -> str:
    return hashlib.blake2b(image.convert("RGB").tobytes() + repr(image.size).encode(), digest_size=16).hexdigest()


@torch.no_grad()
def _next_token(path: str, device: str, image: Any, question: str) -> torch.Tensor:
    """[V] the judge's next-token probabilities after the user turn (image, question)."""
    model, processor = load_judge(path, device)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[image.convert("RGB")], return_tensors="pt").to(device)
    return torch.softmax(model(**inputs).logits[0, -1].float(), dim=-1)


def ask(path: str, device: str | None, image: Any, question: str, answers: Sequence[str]) -> tuple[str, float]:
    """(the judge's most probable next token, decoded; the summed probability of `answers`' first tokens)."""
    dev = _device(device)
    key = (path, _image_key(image), question, tuple(answers))
    if key not in _ASKED:
        probs = _next_token(path, dev, image, question)
        tokenizer = load_judge(path, dev)[1].tokenizer
        top = tokenizer.decode([int(probs.argmax())])
        if len(_ASKED) >= CACHE_LIMIT:
            _ASKED.clear()
        _ASKED[key] = (top, [float(probs[tokenizer.encode(a, add_special_tokens=False)[0]]) for a in answers])
    top, each = _ASKED[key]
    return top, sum(each)
