"""The box IoU reward: hand-computed IoUs, every emitted box form parses, normalised coordinates
scale, Hungarian matching, mean_iou / detection on multi-box cases, failure counting, and property
tests (arbitrary text never raises; formatted boxes round-trip)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mmrl.rewards import get_reward
from mmrl.rewards.box_parsing import STYLES, format_boxes, parse_boxes
from mmrl.rewards.iou import box_iou, iou_reward, match_boxes

from mmrl.core.scoring import compute_rewards, metric_logger

# --- IoU and matching ----------------------------------------------------------------------------

def test_hand_computed_ious():
    assert box_iou([0, 0, 10, 10], [5, 5, 15, 15]) == pytest.approx(25 / 175)
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert box_iou([0, 0, 10, 10], [0, 0, 10, 5]) == pytest.approx(50 / 100)
    assert box_iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0  # touching edges
    assert box_iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert box_iou([0, 0, 4, 4], [1, 1, 3, 3]) == pytest.approx(4 / 16)  # contained
    assert box_iou([5, 5, 5, 5], [5, 5, 5, 5]) == 0.0  # zero area
    assert box_iou([0, 0, 0, 10], [0, 0, 10, 10]) == 0.0


def test_hungarian_picks_best_pairing_for_crossed_boxes():
    truth = [[0, 0, 10, 10], [100, 100, 110, 110]]
    pred = [[101, 101, 111, 111], [1, 1, 11, 11]]  # listed in the other order
    pairs = match_boxes(pred, truth)
    assert [(i, j) for i, j, _ in pairs] == [(0, 1), (1, 0)]
    assert all(iou == pytest.approx(81 / 119) for _, _, iou in pairs)
    # greedy-by-row would take (0, 0) at 0.5 and leave (1, 1) at ~0.14; the optimum is 0.4 + 0.4
    truth = [[0, 0, 10, 10], [0, 0, 10, 5]]
    pred = [[0, 0, 10, 6], [0, 0, 10, 9]]
    pairs = match_boxes(pred, truth)
    assert [(i, j) for i, j, _ in pairs] == [(0, 1), (1, 0)]
    assert match_boxes([], truth) == [] and match_boxes(pred, []) == []


# --- parsing ---------------------------------------------------------------------------------------

FORMS = {
    "plain": "The box is [10, 20, 30, 40].",
    "floats": "[10.0, 2.0e1, 30, 40]",
    "bbox_2d_fenced": '```json\n[{"bbox_2d": [10, 20, 30, 40], "label": "cat"}]\n```',
    "bbox_2d_bare": 'Here: {"bbox_2d": [10, 20, 30, 40], "label": "cat"}',
    "bbox": '{"bbox": [10, 20, 30, 40]}',
    "box": '[{"box": [10, 20, 30, 40]}]',
    "python_dict": "{'bbox_2d': [10, 20, 30, 40], 'label': 'cat'}",
    "qwen_vl": "<ref>cat</ref><box>(10,20),(30,40)</box>",
    "box_tokens": "<|object_ref_start|>cat<|object_ref_end|><|box_start|>(10,20),(30,40)<|box_end|>",
    "reversed": "[30, 40, 10, 20]",
    "trailing_comma": "[10, 20, 30, 40,]",
    "answer_tag": "<think>maybe [0, 0, 1, 1]</think><answer>[10, 20, 30, 40]</answer>",
}


@pytest.mark.parametrize("name", FORMS)
def test_each_emitted_form_parses(name):
    assert parse_boxes(FORMS[name]) == [[10, 20, 30, 40]]


def test_several_boxes_and_lists_of_lists():
    assert parse_boxes("[1, 2, 3, 4] and [5, 6, 7, 8]") == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert parse_boxes("[[1, 2, 3, 4], [5, 6, 7, 8]]") == [[1, 2, 3, 4], [5, 6, 7, 8]]
    text = '```json\n[{"bbox_2d": [1, 2, 3, 4], "label": "a"}, {"bbox_2d": [5, 6, 7, 8], "label": "b"}]\n```'
    assert parse_boxes(text) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert parse_boxes("<box>(1,2),(3,4)</box><box>(5,6),(7,8)</box>") == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert parse_boxes('{"objects": [{"bbox": [1, 2, 3, 4]}]}') == [[1, 2, 3, 4]]


def test_bad_entries_are_dropped():
    assert parse_boxes('[1, 2, "a", 4] [5, 6, 7, 8]') == [[5, 6, 7, 8]]
    assert parse_boxes("[NaN, 1, 2, 3] [Infinity, 1, 2, 3] [1e999, 1, 2, 3]") == []
    assert parse_boxes("[1, 2, 3] no box here") == []
    assert parse_boxes("") == []
    assert parse_boxes("[true, 1, 2, 3]") == []


def test_answer_tag_falls_back_to_whole_text_when_it_has_no_box():
    assert parse_boxes("[1, 2, 3, 4] <answer>a cat</answer>") == [[1, 2, 3, 4]]


def test_normalised_coords_scale_to_pixels():
    [b] = parse_boxes("[0.1, 0.2, 0.5, 1.0]", coords="norm1", image_size=[200, 100])
    assert b == pytest.approx([20, 20, 100, 100])
    [b] = parse_boxes("<box>(100,200),(500,1000)</box>", coords="norm1000", image_size=[200, 100])
    assert b == pytest.approx([20, 20, 100, 100])
    assert parse_boxes("[10, 20, 30, 40]", coords="pixels", image_size=[200, 100]) == [[10, 20, 30, 40]]
    for coords in ("norm1", "norm1000"):
        with pytest.raises(ValueError, match="image_size"):
            parse_boxes("[0, 0, 1, 1]", coords=coords)
    with pytest.raises(ValueError, match="coords"):
        parse_boxes("[0, 0, 1, 1]", coords="percent")


def test_format_boxes_styles():
    b = [[1, 2, 3.5, 4]]
    assert format_boxes(b, "list") == "[1, 2, 3.5, 4]"
    assert format_boxes(b, "qwen_box") == "<box>(1,2),(3.5,4)</box>"
    assert '"bbox_2d": [1, 2, 3.5, 4]' in format_boxes(b, "bbox_2d")
    with pytest.raises(ValueError, match="style"):
        format_boxes(b, "xml")


# --- the reward -----------------------------------------------------------------------------------

def test_registered():
    assert get_reward("iou") is iou_reward


def test_mean_iou_single_and_multi_box():
    truth = [[0, 0, 10, 10]]
    assert iou_reward(None, ["[0, 0, 10, 10]"], boxes=[truth]) == [1.0]
    assert iou_reward(None, ["[5, 5, 15, 15]"], boxes=[truth]) == [pytest.approx(25 / 175)]
    two = [[0, 0, 10, 10], [20, 20, 30, 30]]
    assert iou_reward(None, ["[[20, 20, 30, 30], [0, 0, 10, 10]]"], boxes=[two]) == [pytest.approx(1.0)]
    # one box missing: (1 + 0) / 2
    assert iou_reward(None, ["[0, 0, 10, 10]"], boxes=[two]) == [pytest.approx(0.5)]
    # an extra predicted box lowers the score: 2 / 3
    extra = "[[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]]"
    assert iou_reward(None, [extra], boxes=[two]) == [pytest.approx(2 / 3)]
    # partial overlap on one of two: (25/175 + 1) / 2
    assert iou_reward(None, ["[[5, 5, 15, 15], [20, 20, 30, 30]]"], boxes=[two]) == \
        [pytest.approx((25 / 175 + 1) / 2)]


def test_detection_f1():
    two = [[0, 0, 10, 10], [20, 20, 30, 30]]
    # both matched above 0.5: F1 = 1
    assert iou_reward(None, ["[[0, 0, 10, 9], [20, 20, 30, 30]]"], boxes=[two], mode="detection") == [1.0]
    # one hit (IoU 1) and one miss (IoU 25/175 < 0.5): P = R = 1/2
    assert iou_reward(None, ["[[5, 5, 15, 15], [20, 20, 30, 30]]"], boxes=[two], mode="detection") == \
        [pytest.approx(0.5)]
    # an extra box: TP 2, P = 2/3, R = 1, F1 = 0.8
    extra = "[[0, 0, 10, 10], [20, 20, 30, 30], [50, 50, 60, 60]]"
    assert iou_reward(None, [extra], boxes=[two], mode="detection") == [pytest.approx(0.8)]
    # a missing box: P = 1, R = 1/2, F1 = 2/3
    assert iou_reward(None, ["[0, 0, 10, 10]"], boxes=[two], mode="detection") == [pytest.approx(2 / 3)]
    # the threshold decides
    assert iou_reward(None, ["[5, 5, 15, 15]"], boxes=[[[0, 0, 10, 10]]], mode="detection",
                      iou_threshold=0.1) == [1.0]


def test_normalised_coords_in_the_reward():
    counts = {}
    out = iou_reward(None, ["[0.0, 0.0, 0.5, 0.5]", "<box>(0,0),(500,500)</box>"],
                     boxes=[[[0, 0, 100, 50]], [[0, 0, 100, 50]]], coords="norm1",
                     image_size=[[200, 100], [200, 100]], log_metric=metric_logger(counts))
    assert out[0] == pytest.approx(1.0)
    assert out[1] == 0.0  # 0-1000 numbers where 0-1 was declared
    assert counts == {"unparsable/bad_coords": 1.0}
    out = iou_reward(None, ["<box>(0,0),(500,500)</box>"], boxes=[[[0, 0, 100, 50]]], coords="norm1000",
                     image_size=[200, 100])
    assert out == [pytest.approx(1.0)]
    with pytest.raises(ValueError, match="image_size"):
        iou_reward(None, ["[0, 0, 1, 1]"], boxes=[[[0, 0, 1, 1]]], coords="norm1000")


def test_none_ground_truth_is_none_and_empty_truth():
    counts = {}
    log = metric_logger(counts)
    assert iou_reward(None, ["[0, 0, 1, 1]", "nothing"], boxes=[None, None], log_metric=log) == [None, None]
    assert iou_reward(None, ["no objects", "[0, 0, 1, 1]"], boxes=[[], []], log_metric=log) == [1.0, 0.0]
    assert counts == {}


def test_unparsable_scores_zero_and_is_counted():
    counts = {}
    out = iou_reward(None, ["I cannot see it", "[1, 2, 3]", "[0, 0, 10, 10]"],
                     boxes=[[[0, 0, 10, 10]]] * 3, log_metric=metric_logger(counts))
    assert out == [0.0, 0.0, 1.0]
    assert counts == {"unparsable/no_box": 2.0}
    # the engine hands each call its own logger: counts belong to the call, not the module
    fns = {"iou": iou_reward}
    for _ in range(2):
        metrics = {}
        rewards = compute_rewards(fns, ["p"], ["nothing"], {"boxes": [[[0, 0, 1, 1]]]}, metrics)
        assert rewards["iou"].tolist() == [0.0]
        assert metrics == {"reward/iou/unparsable/no_box": 1.0}


def test_chat_message_completions():
    msgs = [[{"role": "assistant", "content": "<answer>[0, 0, 10, 10]</answer>"}]]
    assert iou_reward(None, msgs, boxes=[[[0, 0, 10, 10]]]) == [1.0]


def test_length_mismatch_names_boxes():
    with pytest.raises(ValueError, match=r"'boxes'.*\b1\b.*\b2\b"):
        iou_reward(None, ["a", "b"], boxes=[[[0, 0, 1, 1]]])
    with pytest.raises(ValueError, match="mode"):
        iou_reward(None, ["a"], boxes=[[[0, 0, 1, 1]]], mode="map")
    with pytest.raises(ValueError, match="boxes"):
        iou_reward(None, ["a"], boxes=[[[0, 0, 1]]])


# --- properties -----------------------------------------------------------------------------------

_box_text = st.sampled_from(["[", "]", "{", "}", "(", ")", ",", "<box>", "</box>", "<|box_start|>",
                             "<|box_end|>", "<answer>", "</answer>", '"bbox_2d":', "```json", "NaN",
                             "1e999", "-", ".", "e", "12", "0.5", " "])


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(), st.lists(_box_text, max_size=40).map("".join)))
def test_parse_boxes_never_raises(text):
    boxes = parse_boxes(text)
    for b in boxes:
        assert len(b) == 4 and all(math.isfinite(v) for v in b)
        assert b[0] <= b[2] and b[1] <= b[3]
    iou_reward(None, [text], boxes=[[[0, 0, 10, 10]]])


_coord = st.floats(min_value=0, max_value=4096, allow_nan=False, allow_infinity=False)


@st.composite
def _positive_box(draw):
    x1, x2 = sorted(draw(st.lists(_coord, min_size=2, max_size=2, unique=True)))
    y1, y2 = sorted(draw(st.lists(_coord, min_size=2, max_size=2, unique=True)))
    return [x1, y1, x2, y2]


@settings(max_examples=200, deadline=None)
@given(st.lists(_positive_box(), min_size=1, max_size=5), st.sampled_from(STYLES))
def test_formatted_boxes_round_trip(boxes, style):
    text = format_boxes(boxes, style)
    parsed = parse_boxes(text)
    assert len(parsed) == len(boxes), text
    for p, b in zip(parsed, boxes):
        assert p == pytest.approx(b, abs=1e-6), text
    wrapped = parse_boxes(f"<think>thinking [0, 0, 1, 1]</think><answer>{text}</answer>")
    assert wrapped == parsed
