"""Data sources, row transforms (column maps, extraction, conversations, templates, media paths),
validation before the model loads, and reward column bindings."""

import io
import json
import logging

import numpy as np
import pytest
from mmrl.tasks.lm.audio_lm import check_audio, load_audio
from mmrl.tasks.lm.multimodal import place_media
from mmrl.tasks.lm.video_clips import check_video
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy, check_image, load_image
from PIL import Image

from mmrl.config.parse import parse_config
from mmrl.config.sections import DataConfig
from mmrl.core.scoring import ColumnBoundReward, bind_reward
from mmrl.data import DataError, load_data, reward_columns_needed
from mmrl.data.chat import split_conversation, split_placeholders
from mmrl.data.sources import open_source

ROWS = [{"prompt": f"q{i}", "answer": str(i), "n": i} for i in range(5)]


def png(path, w=8, h=6, colour=(255, 0, 0)):
    Image.new("RGB", (w, h), colour).save(path)
    return path


def png_bytes(w=8, h=6):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (0, 255, 0)).save(buf, format="PNG")
    return buf.getvalue()


# ---- sources ---------------------------------------------------------------------------------

def _write_all_types(tmp_path):
    import pandas as pd
    df = pd.DataFrame(ROWS)
    paths = {"json": tmp_path / "d.json", "jsonl": tmp_path / "d.jsonl", "csv": tmp_path / "d.csv",
             "parquet": tmp_path / "d.parquet", "arrow": tmp_path / "d.arrow"}
    paths["json"].write_text(json.dumps(ROWS))
    paths["jsonl"].write_text("\n".join(json.dumps(r) for r in ROWS))
    df.to_csv(paths["csv"], index=False)
    df.to_parquet(paths["parquet"])
    from datasets import Dataset
    ds = Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "saved"))
    import shutil
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    shutil.copy(arrow, paths["arrow"])
    return paths


@pytest.mark.parametrize("kind", ["json", "jsonl", "csv", "parquet", "arrow"])
def test_every_file_type_gives_the_same_rows(tmp_path, kind):
    path = _write_all_types(tmp_path)[kind]
    train, held_out = load_data(DataConfig(path=str(path)))
    assert len(train) == 5 and len(held_out) == 0
    assert [(r["prompt"], str(r["answer"]), int(r["n"])) for r in train] == \
        [(r["prompt"], r["answer"], r["n"]) for r in ROWS]
    assert train[-1]["prompt"] == "q4" and [r["prompt"] for r in train[1:3]] == ["q1", "q2"]


def test_save_to_disk_dataset_dict_with_splits_and_a_directory_of_files(tmp_path):
    from datasets import Dataset, DatasetDict
    DatasetDict({"train": Dataset.from_list(ROWS[:3]), "test": Dataset.from_list(ROWS[3:])}).save_to_disk(
        str(tmp_path / "dd"))
    train, held_out = load_data(DataConfig(path=str(tmp_path / "dd"), eval_path=str(tmp_path / "dd"),
                                           split="train", eval_split="test"))
    assert [r["prompt"] for r in train] == ["q0", "q1", "q2"]
    assert [r["prompt"] for r in held_out] == ["q3", "q4"]
    with pytest.raises(ValueError, match="no split 'validation'; splits: train, test"):
        load_data(DataConfig(path=str(tmp_path / "dd"), split="validation"))
    folder = tmp_path / "files"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[:2]))
    (folder / "b.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS[2:]))
    train, _ = load_data(DataConfig(path=str(folder)))
    assert [r["prompt"] for r in train] == [r["prompt"] for r in ROWS]


def test_binary_file_with_a_text_suffix_names_the_file(tmp_path):
    path = tmp_path / "data.json"
    path.write_bytes(b"\xf4\x00\x01PAR1")
    with pytest.raises(ValueError, match="data.json: not UTF-8"):
        load_data(DataConfig(path=str(path)))
    with pytest.raises(FileNotFoundError, match="missing.parquet"):
        load_data(DataConfig(path=str(tmp_path / "missing.parquet")))


def test_hub_id_offline_without_cache_names_the_data_set(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="data set 'nobody/no-such-set' .*subset 'main'"):
        open_source("nobody/no-such-set", "train", "main")


def test_arrow_rows_stay_lazy_and_images_undecoded(tmp_path):
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature
    ds = Dataset.from_dict({"prompt": ["a", "b"], "image": [png_bytes(), png_bytes(5, 7)]},
                           features=Features({"prompt": Value("string"), "image": ImageFeature()}))
    ds.save_to_disk(str(tmp_path / "img"))
    train, _ = load_data(DataConfig(path=str(tmp_path / "img")), VLMPolicy.media_columns(VLMConfig()))
    from datasets import Dataset as HFDataset
    assert isinstance(train.raw, HFDataset)  # not a decoded list
    row = train[1]
    assert set(row["image"]) == {"bytes", "path"} and isinstance(row["image"]["bytes"], bytes)
    assert load_image(row["image"]).size == (5, 7)


# ---- media values ----------------------------------------------------------------------------

def test_media_values_and_relative_paths(tmp_path):
    sub = tmp_path / "data"
    (sub / "imgs").mkdir(parents=True)
    png(sub / "imgs" / "a.png", 9, 4)
    (sub / "d.jsonl").write_text(json.dumps({"prompt": "p", "image": "imgs/a.png"}))
    media = VLMPolicy.media_columns(VLMConfig())
    train, _ = load_data(DataConfig(path=str(sub / "d.jsonl")), media)
    assert train[0]["image"] == str(sub / "imgs" / "a.png")  # the data file's directory, not the cwd
    other = tmp_path / "elsewhere"
    (other / "imgs").mkdir(parents=True)
    png(other / "imgs" / "a.png", 3, 3)
    train, _ = load_data(DataConfig(path=str(sub / "d.jsonl"), media_root=str(other)), media)
    assert load_image(train[0]["image"]).size == (3, 3)
    for value in (png_bytes(), {"bytes": png_bytes(), "path": "x.png"}, {"bytes": None, "path": str(other / "imgs/a.png")},
                  Image.new("RGB", (8, 6))):
        check_image(value)
        assert load_image(value).size in ((8, 6), (3, 3))


def test_audio_values(tmp_path):
    import soundfile
    samples = np.sin(np.linspace(0, 100, 8000)).astype(np.float32)
    soundfile.write(tmp_path / "a.wav", samples, 8000)
    buf = io.BytesIO()
    soundfile.write(buf, samples, 8000, format="WAV")
    for value in (str(tmp_path / "a.wav"), {"bytes": buf.getvalue(), "path": None},
                  {"array": samples, "sampling_rate": 8000}):
        check_audio(value)
        assert load_audio(value, 16000).shape == (16000,)


def test_a_wav_file_without_samples_is_refused_naming_it(tmp_path):
    import soundfile
    from mmrl.data import RowError
    soundfile.write(tmp_path / "silent.wav", np.zeros(0, dtype=np.float32), 8000)
    assert soundfile.info(str(tmp_path / "silent.wav")).frames == 0  # a valid header, no samples
    with pytest.raises(RowError) as info:
        check_audio(str(tmp_path / "silent.wav"))
    assert (info.value.what, info.value.detail) == ("audio file has no samples", str(tmp_path / "silent.wav"))


# ---- column maps, extraction, templates --------------------------------------------------------

def test_columns_extract_pick_and_template(tmp_path):
    rows = [{"question": "2+2?", "answer": "so 4\n#### 4", "choices": ["x", "y"], "idx": 1}]
    path = tmp_path / "g.json"
    path.write_text(json.dumps(rows))
    train, _ = load_data(DataConfig(path=str(path), columns={"question": "problem"}, extract={"answer": "#### (.*)"},
                                    pick={"idx": "choices"},
                                    prompt_template="{problem} Options:\n{choices} or {choices!r} {choices[0]}"))
    row = train[0]
    assert row["answer"] == "4" and row["idx"] == "y" and "question" not in row
    assert row["prompt"] == "2+2? Options:\nx\ny or ['x', 'y'] x"


# ---- chat data ---------------------------------------------------------------------------------

LLAVA = [{"from": "human", "value": "<image>\nWhere is the cat?"}, {"from": "gpt", "value": "[1, 2, 3, 4]"}]


def test_conversations_become_prompt_and_answer():
    # a single user turn stays a message list, so it gets the chat template as any conversation
    assert split_conversation(LLAVA, True, "conversations") == (
        [{"role": "user", "content": "<image>\nWhere is the cat?"}], "[1, 2, 3, 4]")
    with pytest.raises(ValueError, match="column 'conversations'.*answer_from_conversation"):
        split_conversation(LLAVA, False, "conversations")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}]
    prompt, answer = split_conversation(chat, False, "messages")
    assert answer is None and prompt == chat
    prompt, answer = split_conversation(chat + [{"role": "assistant", "content": "4"}], True, "messages")
    assert prompt == chat and answer == "4"


def test_a_conversation_ending_with_a_tool_turn_is_all_prompt():
    # the model's next turn reads the tool's result (an episode's later turn, as a warm-start row)
    chat = [{"role": "user", "content": "<image>what colour?"},
            {"role": "assistant", "content": '<tool_call>{"name": "zoom"}</tool_call>'},
            {"role": "tool", "content": "<image>"}]
    assert split_conversation(chat, False, "prompt") == (chat, None)
    with pytest.raises(ValueError, match="ends with an assistant turn"):
        split_conversation(chat[:2], False, "prompt")


def test_placeholders_go_where_the_text_puts_them():
    assert split_placeholders("no placeholder ") == [{"type": "text", "text": "no placeholder "}]
    media = [{"type": "image"}, {"type": "image"}]
    messages = place_media("first <image> then <image> end", media)
    assert messages == [{"role": "user", "content": [
        {"type": "text", "text": "first"}, {"type": "image"}, {"type": "text", "text": "then"},
        {"type": "image"}, {"type": "text", "text": "end"}]}]
    # no placeholder: media first, as before
    assert place_media("plain", media[:1]) == [{"role": "user", "content": [{"type": "image"},
                                                                           {"type": "text", "text": "plain"}]}]
    with pytest.raises(ValueError, match="more <image> placeholders"):
        place_media("<image><image>", media[:1])


def test_conversation_rows_through_load_data(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"image": "x.png", "conversations": LLAVA}))
    cfg = DataConfig(path=str(path), prompt_column="conversations", answer_from_conversation=True,
                     answer_column="solution")
    row = load_data(cfg)[0][0]
    assert row["conversations"] == [{"role": "user", "content": "<image>\nWhere is the cat?"}]
    assert row["solution"] == "[1, 2, 3, 4]"
    with pytest.raises(DataError, match=r"c.jsonl: column 'conversations': .*answer_from_conversation.*row 0"):
        load_data(DataConfig(path=str(path), prompt_column="conversations"))


# ---- validation --------------------------------------------------------------------------------

def _grounding_rows(tmp_path, n=6):
    (tmp_path / "img").mkdir(exist_ok=True)
    png(tmp_path / "img" / "ok.png")
    (tmp_path / "img" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    rows = [{"problem": f"q{i}", "image": "img/ok.png", "solution": [[0, 0, 4, 4]]} for i in range(n)]
    rows[1]["image"] = "img/missing.png"
    rows[2]["image"] = "img/broken.png"
    del rows[3]["solution"]
    del rows[4]["problem"]
    return rows


def test_validation_reports_every_problem_with_file_row_column_and_count(tmp_path):
    rows = _grounding_rows(tmp_path)
    rows.append(dict(rows[1], problem="again"))  # a second row with the same missing file
    path = tmp_path / "train.json"
    path.write_text(json.dumps(rows))
    heldout = tmp_path / "eval.jsonl"
    heldout.write_text(json.dumps({"problem": "e", "image": "img/nowhere.png", "solution": [[0, 0, 1, 1]]}))
    fn = bind_reward("iou", None, {"boxes": "solution"})
    required = reward_columns_needed({"iou": fn}, {"iou": {"boxes": "solution"}})
    assert required == {"solution": "reward 'iou' as 'boxes'"}
    with pytest.raises(DataError) as info:
        load_data(DataConfig(path=str(path), eval_path=str(heldout), prompt_column="problem"),
                  VLMPolicy.media_columns(VLMConfig()), required)
    msg = str(info.value)
    assert f"{path}: column 'image': image file does not exist: 2 row(s): row 1 (" in msg
    assert "row 6 (" in msg and "missing.png" in msg
    assert f"{path}: column 'image': image cannot be decoded: 1 row(s): row 2 (" in msg
    assert f"{path}: column 'solution': missing (needed by reward 'iou' as 'boxes'): 1 row(s): row 3" in msg
    assert f"{path}: column 'problem': missing (the prompt column, data.prompt_column): 1 row(s): row 4" in msg
    assert f"{heldout}: column 'image': image file does not exist: 1 row(s): row 0" in msg


def test_skip_invalid_drops_rows_and_logs_the_count(tmp_path, caplog):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_grounding_rows(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        train, _ = load_data(DataConfig(path=str(path), prompt_column="problem", skip_invalid=True),
                             VLMPolicy.media_columns(VLMConfig()), {"solution": "reward 'iou'"})
    assert [r["problem"] for r in train] == ["q0", "q5"]
    assert "dropped 4 of 6 rows" in caplog.text


def test_sample_validation_checks_an_even_sample(tmp_path):
    rows = [{"prompt": "p"} for _ in range(100)]
    del rows[1]["prompt"]  # not in an even sample of 10 (rows 0, 10, ...)
    del rows[50]["prompt"]
    path = tmp_path / "d.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(DataError, match=r"row 50\b") as info:
        load_data(DataConfig(path=str(path), validate="sample", validate_rows=10))
    assert "row 1 " not in str(info.value)
    with pytest.raises(DataError, match=r"2 row\(s\)"):
        load_data(DataConfig(path=str(path)))
    assert len(load_data(DataConfig(path=str(path), validate="off"))[0]) == 100


def test_video_check_reads_headers(tmp_path):
    (tmp_path / "bad.mp4").write_bytes(b"nope")
    from mmrl.data import RowError
    with pytest.raises(RowError, match="video cannot be opened"):
        check_video(str(tmp_path / "bad.mp4"))
    with pytest.raises(RowError, match="video file does not exist"):
        check_video(str(tmp_path / "none.mp4"))
    check_video([np.zeros((4, 4, 3), np.uint8)] * 2)  # frames


# ---- reward column bindings --------------------------------------------------------------------

def test_reward_binding_feeds_the_argument_and_collisions_name_both():
    fn = bind_reward("iou", {"mode": "mean_iou"}, {"boxes": "solution"})
    assert isinstance(fn.func, ColumnBoundReward)
    out = fn(prompts=["p"], completions=["[0, 0, 10, 10]"], solution=[[[0, 0, 10, 10]]])
    assert out == [1.0]
    with pytest.raises(ValueError, match="binds argument 'boxes' to column 'solution', but the data also has a "
                                         "column 'boxes'"):
        fn(prompts=["p"], completions=["x"], solution=[[[0, 0, 1, 1]]], boxes=[[[0, 0, 1, 1]]])
    with pytest.raises(KeyError, match="bound to column 'solution', which the rows do not have"):
        fn(prompts=["p"], completions=["x"], other=[1])
    with pytest.raises(ValueError, match="'boxes' is bound both to a column"):
        bind_reward("iou", {"boxes": [[0, 0, 1, 1]]}, {"boxes": "solution"})


def test_recipe_reward_columns_field_parses():
    cfg = parse_config({"rewards": {"iou": {"columns": {"boxes": "solution"}}}, "data": {"columns": {"a": "b"}}})
    assert cfg.rewards["iou"].columns == {"boxes": "solution"} and cfg.data.columns == {"a": "b"}


def test_a_16_bit_png_is_scaled_to_8_bits_not_saturated(tmp_path):
    values = np.array([[0, 256, 1000], [32768, 65535, 40000]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    assert Image.open(tmp_path / "deep.png").mode == "I;16"  # what PIL writes and reads back
    pixels = np.asarray(load_image(str(tmp_path / "deep.png")))
    by_hand = [[0, 1, 4], [128, 255, 156]]  # round(v / 257): 1000/257 = 3.89, 32768/257 = 127.5, 40000/257 = 155.6
    assert pixels.shape == (2, 3, 3)
    for channel in range(3):
        assert pixels[..., channel].tolist() == by_hand


def test_transparent_pixels_are_composited_on_white_with_one_note(tmp_path, caplog, monkeypatch):
    from mmrl.data import images
    monkeypatch.setattr(images, "_noted_transparency", [])
    rgba = np.array([[[200, 100, 50, 128], [10, 20, 30, 0], [10, 20, 30, 255]]], dtype=np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "clear.png")
    palette = Image.new("P", (2, 1))
    palette.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    palette.putdata([0, 1])
    palette.save(tmp_path / "palette.png", transparency=0)
    with caplog.at_level(logging.WARNING, logger="mmrl"):
        blended = np.asarray(load_image(str(tmp_path / "clear.png"))).astype(int)
        keyed = np.asarray(load_image(str(tmp_path / "palette.png")))
    # c * a / 255 + 255 * (1 - a / 255) with a = 128: 227.4, 177.2, 152.1; a = 0: white; a = 255: c
    assert np.abs(blended[0, 0] - [227, 177, 152]).max() <= 1
    assert blended[0, 1].tolist() == [255, 255, 255] and blended[0, 2].tolist() == [10, 20, 30]
    assert keyed.tolist() == [[[255, 255, 255], [0, 255, 0]]]  # palette entry 0 is transparent
    notes = [r.getMessage() for r in caplog.records if "transparency" in r.getMessage()]
    assert len(notes) == 1 and "clear.png" in notes[0] and "white" in notes[0]


def test_a_float_image_outside_0_1_is_refused_naming_the_file(tmp_path):
    from mmrl.data import RowError
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32), "F").save(tmp_path / "unit.tiff")
    assert np.asarray(load_image(str(tmp_path / "unit.tiff")))[0, :, 0].tolist() == [0, 128, 255]  # 127.5 rounds to even
    Image.fromarray(np.array([[0.0, 300.0]], dtype=np.float32), "F").save(tmp_path / "wide.tiff")
    with pytest.raises(ValueError, match=r"wide.tiff'.*mode F values span 0..300"):
        load_image(str(tmp_path / "wide.tiff"))
    check_image(str(tmp_path / "unit.tiff"))
    with pytest.raises(RowError, match="image values out of range"):  # found by the validation, before the model
        check_image(str(tmp_path / "wide.tiff"))


def test_a_json_row_that_gives_a_key_twice_is_refused_naming_file_line_and_key(tmp_path):
    from mmrl.data.sources import read_rows
    (tmp_path / "rows.jsonl").write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2", "answer": "3"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2: key 'answer' is given twice in one object"):
        read_rows(tmp_path / "rows.jsonl")
    (tmp_path / "rows.json").write_text('[{"prompt": "a", "meta": {"id": 1, "id": 2}}]')
    with pytest.raises(ValueError, match=r"rows.json: key 'id' is given twice in one object"):
        read_rows(tmp_path / "rows.json")
