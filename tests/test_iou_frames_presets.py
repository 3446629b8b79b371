"""The iou reward's prediction frames, match rules and threshold, and the vlm_r1 / visual_rft
presets against hand references of those repositories' rules."""

import pytest
from mmrl.rewards.iou import iou_reward


def reward(completions, boxes, **kw):
    return iou_reward(None, completions, boxes=boxes, **kw)


# ---- frames ------------------------------------------------------------------------------------

def test_frames_rescale_to_the_original_image():
    truth = [[[20, 40, 100, 80]]]
    # input frame: the processor resized a 200 x 100 image to 100 x 50
    assert reward(["[10, 20, 50, 40]"], truth, frame="input", original_size=[[200, 100]],
                  input_size=[[100, 50]]) == [1.0]
    # normalised 0-1000 (Qwen3-VL): x * 200 / 1000, y * 100 / 1000
    assert reward(["[100, 400, 500, 800]"], truth, frame="normalized_1000", original_size=[[200, 100]]) == [1.0]
    # image frame: no rescaling; the input-frame numbers read as image pixels miss the box
    assert reward(["[20, 40, 100, 80]"], truth, frame="image") == [1.0]
    assert reward(["[10, 20, 50, 40]"], truth, frame="image") == [0.0]
    # one [width, height] for every row (a recipe argument) works as a column does
    assert reward(["[10, 20, 50, 40]"], truth, frame="input", original_size=[200, 100], input_size=[100, 50]) == [1.0]


def test_frame_without_its_sizes_names_the_column():
    with pytest.raises(ValueError, match="frame='input' needs the 'original_size' column"):
        reward(["[1, 1, 2, 2]"], [[[0, 0, 1, 1]]], frame="input")
    with pytest.raises(ValueError, match="needs the 'input_size' column"):
        reward(["[1, 1, 2, 2]"], [[[0, 0, 1, 1]]], frame="input", original_size=[[10, 10]])
    with pytest.raises(ValueError, match="frame='pixels' is not one of"):
        reward(["[1, 1, 2, 2]"], [[[0, 0, 1, 1]]], frame="pixels")


def test_input_frame_range_is_the_input_image():
    out = reward(["[0, 0, 120, 50]"], [[[0, 0, 10, 10]]], frame="input", original_size=[[200, 100]],
                 input_size=[[100, 50]])
    assert out == [0.0]  # x 120 > the input's 100 (+1%): bad_coords


# ---- match rules and threshold -----------------------------------------------------------------

TWO = [[[0, 0, 10, 10], [0, 0, 10, 6]]]  # A, B
PRED = "[[0, 0, 10, 7], [0, 0, 10, 5]]"  # P1: IoU(A)=.7, IoU(B)=6/7; P2: IoU(A)=.5, IoU(B)=5/6


def test_match_rules():
    hungarian = (0.7 + 5 / 6) / 2
    greedy = (6 / 7 + 0.5) / 2  # P1 takes B first, P2 gets A
    assert reward([PRED], TWO) == [pytest.approx(hungarian)]
    assert reward([PRED], TWO, match="greedy") == [pytest.approx(greedy)]
    # first: only P1 against A
    assert reward([PRED], TWO, match="first") == [pytest.approx(0.7)]
    assert reward(["[[50, 50, 60, 60], [0, 0, 10, 10]]"], [[[0, 0, 10, 10]]], match="first") == [0.0]


def test_threshold_drops_weak_matches():
    assert reward([PRED], TWO, threshold=0.6) == [pytest.approx((0.7 + 5 / 6) / 2)]
    assert reward([PRED], TWO, threshold=0.75) == [pytest.approx((5 / 6) / 2)]
    assert reward([PRED], TWO, match="greedy", threshold=0.5) == [pytest.approx((6 / 7) / 2)]  # .5 is not > .5


# ---- VLM-R1 ------------------------------------------------------------------------------------

def vlm_r1(completions, solutions, original=None, inputs=None, **kw):
    return iou_reward(None, completions, boxes=solutions, preset="vlm_r1",
                      original_size=original, input_size=inputs, **kw)


def test_vlm_r1_rescales_from_the_input_frame():
    # pred [10, 20, 50, 60] in a 100 x 50 input of a 200 x 100 image -> [20, 40, 100, 120]; truth [10, 20, 50, 60]
    # their IoU: inter (min(99, 49) - 20 + 1) * (min(119, 59) - 40 + 1) = 30 * 20; union 80*80 + 40*40 - 600
    out = vlm_r1(["<think>x</think><answer>[10, 20, 50, 60]</answer>"], ["<answer>[10, 20, 50, 60]</answer>"],
                 [[200, 100]], [[100, 50]])
    assert out == [pytest.approx(600 / 7400)]


def test_vlm_r1_one_pixel_overlap_counts_as_none():
    sol = ["<answer>[10, 0, 20, 10]</answer>"]
    assert vlm_r1(["<answer>[0, 0, 11, 10]</answer>"], sol, frame="image") == [0.0]
    # the generic reward counts it: 1 * 10 / (110 + 100 - 10)
    assert reward(["<answer>[0, 0, 11, 10]</answer>"], [[[10, 0, 20, 10]]]) == [pytest.approx(10 / 200)]
    # 2 px overlap: inter (min(11, 19) - 10 + 1) * (min(9, 9) - 0 + 1) = 2 * 10, union 120 + 100 - 20
    assert vlm_r1(["<answer>[0, 0, 12, 10]</answer>"], sol, frame="image") == [pytest.approx(20 / 200)]


def test_vlm_r1_reads_the_first_answer_and_first_integer_box():
    sol = ["<answer>[0, 0, 10, 10]</answer>"]
    two_answers = "<answer>[0, 0, 10, 10]</answer> then <answer>[50, 50, 60, 60]</answer>"
    assert vlm_r1([two_answers], sol, frame="image") == [1.0]
    assert reward([two_answers], [[[0, 0, 10, 10]]]) == [0.0]  # the generic reward reads the last answer
    assert vlm_r1(["<answer>[0.5, 0, 10, 10]</answer>"], sol, frame="image") == [0.0]  # not integers
    assert vlm_r1(["[0, 0, 10, 10]"], sol, frame="image") == [0.0]  # no answer tag
    assert vlm_r1(["<answer>[0,0,10,10] and [1,1,2,2]</answer>"], sol, frame="image") == [1.0]
    assert vlm_r1(["<answer>[0, 0, 10, 10]</answer>"], [[0, 0, 10, 10]], frame="image") == [1.0]  # a box column
    with pytest.raises(ValueError, match="ground truth row 0"):
        vlm_r1(["x"], ["<answer>none</answer>"], frame="image")


# ---- Visual-RFT --------------------------------------------------------------------------------

def rft(completions, solutions):
    return iou_reward(None, completions, boxes=solutions, preset="visual_rft")


GT2 = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}, {'Position': [20, 20, 30, 30], 'Confidence': 1}]</answer>"


def test_visual_rft_mean_over_max_count():
    good = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 0.9}, {'Position': [21, 20, 30, 30], 'Confidence': 0.8}]</answer>"
    assert rft([good], [GT2]) == [pytest.approx((1.0 + 0.9) / 2)]
    # a match only above IoU 0.5: 25/175 counts 0 (the generic mean_iou counts it)
    weak = "<answer>[{'Position': [5, 5, 15, 15], 'Confidence': 0.9}]</answer>"
    assert rft([weak], [GT2]) == [0.0]
    assert reward(["[5, 5, 15, 15]"], [[[0, 0, 10, 10], [20, 20, 30, 30]]]) == [pytest.approx(25 / 175 / 2)]


def test_visual_rft_greedy_by_confidence():
    gt = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}, {'Position': [0, 0, 10, 6], 'Confidence': 1}]</answer>"
    p1, p2 = "{'Position': [0, 0, 10, 7], 'Confidence': %s}", "{'Position': [0, 0, 10, 4], 'Confidence': %s}"
    # P1 first (IoU(A)=.7, IoU(B)=6/7 -> B), then P2 (IoU(A)=.4 -> not > .5 -> 0)
    first_p1 = "<answer>[" + p1 % 0.9 + ", " + p2 % 0.5 + "]</answer>"
    assert rft([first_p1], [gt]) == [pytest.approx((6 / 7) / 2)]
    # P2 first (IoU(B)=4/6 -> B), then P1 gets A (.7)
    first_p2 = "<answer>[" + p1 % 0.5 + ", " + p2 % 0.9 + "]</answer>"
    assert rft([first_p2], [gt]) == [pytest.approx((4 / 6 + 0.7) / 2)]


def test_visual_rft_format_repairs_and_failures():
    one = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}]</answer>"
    # a list cut short inside the answer block: closed after its last complete object
    cut = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 0.9}, {'Position': [20, 2</answer>"
    assert rft([cut], [GT2]) == [pytest.approx(0.5)]
    # without the closing tag their code wraps the whole text in a second <answer>: unreadable
    assert rft([cut.removesuffix("</answer>")], [GT2]) == [0.0]
    assert rft(["<answer>[[{'Position': [0, 0, 10, 10], 'Confidence': 1}]]</answer>"], [one]) == [1.0]
    dup = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}, {'Position': [0, 0, 10, 10], 'Confidence': 0.5}]</answer>"
    assert rft([dup], [one]) == [1.0]  # duplicates dropped before matching
    # extra boxes: sum / max(G, P)
    extra = "<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}, {'Position': [50, 50, 60, 60], 'Confidence': 0.2}]</answer>"
    assert rft([extra], [one]) == [pytest.approx(0.5)]
    assert rft(["<answer>[0, 0, 10, 10]</answer>", "no answer", "<answer>[]</answer>"], [one] * 3) == [0.0] * 3
    assert rft(["<answer>[{'Position': [0, 0, 10, 10], 'Confidence': 1}]</answer>"], [[[0, 0, 10, 10]]]) == [1.0]
    with pytest.raises(ValueError, match="ground truth row 0"):
        rft(["x"], ["<answer>nothing</answer>"])


def test_visual_rft_math_verify_shortcut_on_request():
    pytest.importorskip("math_verify")
    # math_verify reads 65 from both sides: Visual-RFT pays 1.0 although no box overlaps enough
    c = "<answer>[[74, 65, 178, 68], [60, 171, 286, 196]]</answer>"
    sol = "<answer>[{'Position': [67, 65, 177, 69], 'Confidence': 1}]</answer>"
    assert rft([c], [sol]) == [0.0]
    assert iou_reward(None, [c], boxes=[sol], preset="visual_rft", math_verify_first=True) == [1.0]
