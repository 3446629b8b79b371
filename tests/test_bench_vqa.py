"""GenEval 2 and DPG-Bench (tasks/bench/geneval2.py, dpg_bench.py) and their VLM judge
(vqa_judge.py): the question graph's rule, the rows, the answer forms and aggregations with a
stubbed judge, the judge's probabilities against the tiny VLM's own logits, and both benchmarks end
to end on the tiny diffusion model with the tiny VLM as judge. Both scorings were also run beside
the authors' code on identical answers (docs/bench.md)."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.tasks.bench import geneval2, vqa_judge
from mmrl.tasks.bench.dpg_bench import dpg_rows, graph_score, level


def test_a_question_whose_parent_failed_scores_zero_down_the_graph():
    parents = {1: [0], 2: [1], 3: [2], 4: [0], 5: [1, 4]}
    assert graph_score({1: True, 2: True, 3: True, 4: True, 5: True}, parents) == 1.0
    assert graph_score({1: False, 2: True, 3: True, 4: True, 5: True}, parents) == pytest.approx(1 / 5)  # 2, 3, 5 fall
    assert graph_score({1: True, 2: True, 3: True, 4: False, 5: True}, parents) == pytest.approx(3 / 5)
    assert level("attribute - color (cat, black)") == "attribute" and level("entity - whole (cat)") == "entity"


def csv_rows():
    def q(item, qid, dep, tup, question, text="a black cat on a mat"):
        return {"item_id": item, "text": text, "proposition_id": qid, "dependency": dep, "tuple": tup,
                "question_natural_language": question}
    return [q("p1", 1, "0", "entity - whole (cat)", "Is there a cat?"),
            q("p1", 2, "1", "attribute - color (cat, black)", "Is the cat black?"),
            q("p1", 3, "0", "entity - whole (mat)", "Is there a mat?"),
            q("p1", 4, "1,3", "relation - spatial (cat, mat, on)", "Is the cat on the mat?"),
            q("p2", 1, "0", "global - (photo)", "Is this a photo?", text="a photo")]


def test_dpg_rows_group_the_questions_of_each_prompt():
    rows = dpg_rows(csv_rows(), {})
    assert [r["id"] for r in rows] == ["p1", "p2"] and len(rows[0]["questions"]) == 4
    assert rows[0]["questions"][3] == {"qid": 4, "parents": [1, 3], "question": "Is the cat on the mat?", "level": "relation"}
    broken = csv_rows()
    broken[1]["dependency"] = "7"
    with pytest.raises(ValueError, match="prompt 'p1': question 2 depends on \\[7\\]"):
        dpg_rows(broken, {})


def test_geneval2_answer_forms_and_aggregations_with_a_stubbed_judge(monkeypatch):
    assert geneval2.answer_forms("How many cows are there?", "four") == ["four", "Four", " four", " Four", "4", " 4"]
    assert geneval2.answer_forms("Is the cow red?", "Yes") == ["Yes", "yes", " yes", " Yes"]
    said = {"Are there cows? Answer in one word.": ("yes", 0.9), "How many cows are in the image? Answer in one word.": ("2", 0.4),
            'Does this image show "two cows"? Answer the question with Yes or No.': ("Yes", 0.7)}
    monkeypatch.setattr(geneval2, "ask", lambda path, device, image, question, answers: said[question])
    vqa = [["Are there cows?", "Yes"], ["How many cows are in the image?", "two"]]
    judge = ("judge", "cpu")
    assert geneval2.prompt_score("vqascore", judge, None, "two cows", vqa) == 0.7
    assert geneval2.prompt_score("soft_tifa_am", judge, None, "two cows", vqa) == pytest.approx(0.65)
    assert geneval2.prompt_score("soft_tifa_gm", judge, None, "two cows", vqa) == pytest.approx(math.sqrt(0.36))
    assert geneval2.prompt_score("tifa", judge, None, "two cows", vqa) == 1.0  # "yes" is a form, "2" is one of two's


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory):
    from mmrl.tasks.model_loading import TINY_MODELS
    folder = tmp_path_factory.mktemp("judge")
    model, processor = TINY_MODELS.get("qwen2.5-vl-char")()
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return str(folder)


def test_the_judge_sums_the_first_token_probabilities_of_the_answers(tiny_judge):
    from transformers import AutoModelForImageTextToText, AutoProcessor
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    top, p = vqa_judge.ask(tiny_judge, "cpu", image, "Is it red?", ["Yes", "yes", " yes"])
    model, processor = AutoModelForImageTextToText.from_pretrained(tiny_judge).eval(), AutoProcessor.from_pretrained(tiny_judge)
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is it red?"}]}],
                                         add_generation_prompt=True, tokenize=False)
    with torch.no_grad():
        probs = torch.softmax(model(**processor(text=[text], images=[image], return_tensors="pt")).logits[0, -1], -1)
    # the character tokenizer (byte-level, no merges): first characters, the space as its byte-level symbol
    ids = processor.tokenizer.convert_tokens_to_ids(["Y", "y", "\u0120"])
    assert p == pytest.approx(float(probs[ids].sum()), abs=1e-5)
    assert top == processor.tokenizer.decode([int(probs.argmax())])


def test_geneval2_and_dpg_bench_run_end_to_end_on_the_tiny_diffusion_model(tmp_path, tiny_judge, one_torch_thread):
    from bench_fixtures import generator_config

    from mmrl.experiments.bench.harness import BenchRun, run_bench
    options = {"judge_path": tiny_judge, "device": "cpu"}
    data = tmp_path / "geneval2_data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "two red cows", "atom_count": 3, "vqa_list": [["How many cows are in the image?", "two"], ["Are the cows red?", "Yes"]],
         "skills": ["count", "attribute"]},
        {"prompt": "a cat", "atom_count": 1, "vqa_list": [["Are there any cats in the image?", "Yes"]], "skills": ["object"]}]))
    cfg = generator_config("geneval2", "t2i_demo")
    summary = run_bench(BenchRun("geneval2", tmp_path, cfg, "tiny:pixel-flow-unet", data=str(data), options=options))
    figures = summary["figures"]
    assert summary["headline"]["figure"] == "soft_tifa_gm" and set(summary["categories"]["atom_count"]) == {"1", "3"}
    assert all(0 <= figures[m]["value"] <= 100 for m in ("vqascore", "soft_tifa_am", "soft_tifa_gm", "tifa"))
    assert figures["soft_tifa_gm"]["value"] <= figures["soft_tifa_am"]["value"] + 1e-9  # GM <= AM
    csv = tmp_path / "dpg_bench.csv"
    import csv as csv_module
    with open(csv, "w", newline="") as f:
        writer = csv_module.DictWriter(f, fieldnames=list(csv_rows()[0]))
        writer.writeheader()
        writer.writerows(csv_rows())
    cfg = generator_config("dpg_bench", "t2i_demo")
    dpg = run_bench(BenchRun("dpg_bench", tmp_path, cfg, "tiny:pixel-flow-unet", data=str(csv), options=options))
    assert dpg["samples_per_prompt"] == 4 and dpg["headline"]["n"] == 2 and 0 <= dpg["headline"]["value"] <= 100
    assert dpg["figures"]["relation"]["n"] == 1 and math.isnan(dpg["figures"]["other"]["value"])
