"""Episode data in the peers' formats, each trained 2 steps with its shipped recipe (only data.path
and the run size overridden): verl's multi-turn parquet rows (`verl_multiturn`) and TRL's
conversational rows with tool calls (`trl_tools`). The files are written here as the peers lay
them out."""

import io
import json
import math

import numpy as np
import pytest
from PIL import Image

from mmrl.config.parse import load_recipe
from mmrl.data.rows import RowTransform
from mmrl.registry import RECIPES, load_plugins
from mmrl.train.loop.trainer import Trainer

SMALL = ["algorithm.group_size=2", "optim.prompts_per_step=2", "optim.micro_batch_size=4", "max_steps=2",
         "logging.report_to=[none]", "logging.progress=false"]


def two_steps(recipe: str, data_path, tmp_path) -> tuple[Trainer, list[dict]]:
    load_plugins()
    cfg = load_recipe(RECIPES.get(recipe), [f"data.path={data_path}", f"output_dir={tmp_path / 'run'}", *SMALL])
    trainer = Trainer(cfg)
    metrics = [trainer.train_step() for _ in range(2)]
    for name in cfg.rewards:
        assert all(math.isfinite(m[f"reward/{name}"]) for m in metrics), (name, metrics)
    return trainer, metrics


def png(colour) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((40, 56, 3), colour, dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def test_verl_multiturn_parquet_rows(tmp_path):
    import pandas as pd
    rows = [{"data_source": "vstar", "ability": "vqa",
             "prompt": [{"role": "system", "content": "Zoom in with the tool when you need to."},
                        {"role": "user", "content": f"<image>\nWhat colour is the square {i}?"}],
             "images": [{"bytes": png((200, 10 * i, 0)), "path": None}],
             "reward_model": {"style": "rule", "ground_truth": f"red{i}"},
             "extra_info": {"index": i, "question": f"What colour is the square {i}?",
                            "tools_kwargs": {"image_zoom_in_tool": {"create_kwargs": {"index": i}}}}}
            for i in range(4)]
    pd.DataFrame(rows).to_parquet(tmp_path / "train.parquet")
    trainer, metrics = two_steps("verl_multiturn", tmp_path / "train.parquet", tmp_path)
    row = trainer.inputs.train_rows[0]
    i = row["extra_info"]["index"]
    assert row["answer"] == f"red{i}"
    assert row["tools_kwargs"] == {"image_zoom_in_tool": {"create_kwargs": {"index": i}}}
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert all(m["policy/episodes"] == 4 for m in metrics)  # 2 prompts x 2 episodes a step
    rollout = trainer.policy.rollout([row], 1, [0])
    assert rollout.columns["original_size"] == [[56, 40]]  # the row's image reached the model


def test_trl_conversational_rows_with_tool_calls(tmp_path):
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": "6*7"}}}
    lines = [json.dumps({"prompt": [{"role": "system", "content": "Use python for arithmetic."},
                                    {"role": "user", "content": "6*7?"},
                                    {"role": "assistant", "tool_calls": [call]},
                                    {"role": "tool", "content": "42"},
                                    {"role": "assistant", "content": "<answer>42</answer>"},
                                    {"role": "user", "content": f"{i}*3?"}],
                         "answer": str(3 * i)}) for i in range(4)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines))
    trainer, metrics = two_steps("trl_tools", tmp_path / "train.jsonl", tmp_path)
    row = trainer.inputs.train_rows[0]
    text = trainer.policy.prompt_text(row["prompt"])
    assert text.startswith("s:tools python <eos>s:Use python for arithmetic.<eos>u:6*7?<eos>"
                           'a:<tool_call>{"name": "python", "arguments": {"code": "6*7"}}</tool_call><eos>t:42<eos>')
    assert text.endswith(f"u:{row['answer'] and int(row['answer']) // 3}*3?<eos>a:")
    assert all(m["policy/episodes"] == 4 for m in metrics)


@pytest.mark.parametrize("columns, expected", [
    ({"reward_model.ground_truth": "answer"}, "7"),
    ({"reward_model.missing": "answer"}, None),  # absent: nothing is written, as for a missing plain column
])
def test_a_dotted_column_reads_a_nested_field(columns, expected):
    row = RowTransform(columns=columns)({"prompt": "p", "reward_model": {"ground_truth": "7"}})
    assert row.get("answer") == expected and row["reward_model"] == {"ground_truth": "7"}
