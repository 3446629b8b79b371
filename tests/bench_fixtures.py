"""Tiny offline copies of each benchmark's source, in the format its hub data set has (column names,
value forms), so the benchmarks run end to end with no download: media are written as files beside
the rows and named by absolute path."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
from PIL import Image

from mmrl.tasks.demos.synthetic.text_tasks import sorting_rows


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def gsm8k_sorting(folder: Path, n: int = 8, seed: int = 5) -> str:
    """GSM8K-style rows the text demo's model can answer: the question a sorting prompt, the worked
    answer ending in '#### <sorted digits>'."""
    rows = sorting_rows(n, 6, random.Random(seed))
    return _jsonl(folder / "gsm8k_sorting.jsonl", [
        {"question": r["prompt"], "answer": f"Sort the digits ascending.\n#### {r['answer']}"} for r in rows])


def math500(folder: Path) -> str:
    rows = [{"problem": "What is $1+1$?", "answer": "2", "subject": "Algebra", "level": 1, "unique_id": "test/a/1.json"},
            {"problem": "Simplify $\\frac{2}{4}$.", "answer": "\\frac{1}{2}", "subject": "Prealgebra", "level": 2,
             "unique_id": "test/b/2.json"}]
    return _jsonl(folder / "math500.jsonl", rows)


def _image(path: Path, seed: int, size=(56, 42)) -> str:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return str(path)


def _wav(path: Path, seed: int, seconds: float = 0.5) -> str:
    import soundfile
    t = np.arange(int(16000 * seconds)) / 16000
    soundfile.write(path, (0.3 * np.sin(2 * np.pi * (300 + 50 * seed) * t)).astype(np.float32), 16000)
    return str(path)


def refcoco(folder: Path) -> str:
    rows = [{"question_id": f"q{i}", "image": _image(folder / f"ref{i}.png", i), "bbox": [4.0, 6.0, 20.0, 14.0],
             "answer": ["the left thing", "a red one"]} for i in range(2)]
    return _jsonl(folder / "refcoco.jsonl", rows)


def mathvista(folder: Path) -> str:
    rows = [{"pid": "1", "query": "Hint: answer with the option.\nQuestion: Which is bigger?\nChoices:\n(A) 3\n(B) 5",
             "decoded_image": _image(folder / "mv1.png", 1), "answer": "5", "choices": ["3", "5"],
             "question_type": "multi_choice", "answer_type": "text", "precision": None,
             "metadata": {"task": "figure question answering"}},
            {"pid": "2", "query": "Question: How many bars?", "decoded_image": _image(folder / "mv2.png", 2),
             "answer": "4", "choices": None, "question_type": "free_form", "answer_type": "integer", "precision": None,
             "metadata": {"task": "math word problem"}}]
    return _jsonl(folder / "mathvista.jsonl", rows)


def mmmu(folder: Path) -> str:
    rows = [{"id": "validation_Art_1", "question": "<image 1> Which style is shown?", "options": "['Baroque', 'Cubism']",
             "answer": "B", "question_type": "multiple-choice", "image_1": _image(folder / "mm1.png", 3)},
            {"id": "validation_Math_2", "question": "<image 1> What is the area?", "options": "[]", "answer": "12",
             "question_type": "open", "image_1": _image(folder / "mm2.png", 4)}]
    return _jsonl(folder / "mmmu.jsonl", rows)


def librispeech(folder: Path) -> str:
    rows = [{"id": f"utt{i}", "audio": _wav(folder / f"ls{i}.wav", i), "text": text, "speaker_id": i}
            for i, text in enumerate(["HELLO WORLD", "MISTER SMITH PAID TWENTY DOLLARS", "GOOD MORNING"])]
    return _jsonl(folder / "librispeech.jsonl", rows)


def mmau(folder: Path) -> str:
    rows = [{"id": f"m{i}", "question": "Which sound is heard?", "audio": _wav(folder / f"mmau{i}.wav", i + 5),
             "choices": json.dumps(["a dog", "a bell", "rain", "speech"]), "answer": "a bell",
             "task": ["sound", "music"][i], "difficulty": "easy"} for i in range(2)]
    return _jsonl(folder / "mmau.jsonl", rows)


def generator_config(bench_name: str, recipe: str, steps: int = 2):
    """The `recipe`'s diffusion policy (the t2i or t2v demo's tiny model) with benchmark `bench_name`'s
    protocol settings, sampling `steps` denoising steps: the image and video benchmarks end to end test
    the harness and the scoring, for which a 2-step image is as good a sample as a 16-step one."""
    import yaml

    from mmrl.config.parse import parse_config
    from mmrl.experiments.bench.policy_source import protocol_config
    from mmrl.registry import BENCHMARKS, RECIPES
    policy = yaml.safe_load(open(RECIPES.get(recipe)))["policy"]
    return protocol_config(BENCHMARKS.get(bench_name), parse_config({"task": "diffusion", "policy": policy}),
                           [f"policy.num_steps={steps}", f"policy.eval_num_steps={steps}"])
