"""The edit rewards (rewards/edit_clip.py, rewards/edit_consistency.py) against hand-written
references: CLIP directional similarity as InstructPix2Pix's `sim_direction` computes it, on a
tiny random open_clip model (no download), and the pixel consistency outside the edited region."""

import numpy as np
import pytest
import torch
from mmrl.rewards.clip import load_clip
from mmrl.rewards.edit_clip import clip_direction, directional_similarity
from mmrl.rewards.edit_consistency import edit_consistency
from PIL import Image
from test_rewards_clip import tiny  # noqa: F401  (the tiny open_clip model fixture)


def test_directional_similarity_is_the_cosine_of_the_two_steps():
    g = torch.Generator().manual_seed(0)
    e, s, t, c = (torch.nn.functional.normalize(torch.randn(3, 8, generator=g), dim=-1) for _ in range(4))
    got = directional_similarity(e, s, t, c)
    for i in range(3):  # one row at a time, by the definition
        a, b = (e[i] - s[i]).numpy(), (t[i] - c[i]).numpy()
        assert got[i].item() == pytest.approx(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)), abs=1e-6)
    assert directional_similarity(s, s, t, c).abs().max() == 0  # no change, no direction


def test_clip_direction_follows_instruct_pix2pix(tiny):  # noqa: F811
    sources = [Image.new("RGB", (40, 40), (250, 0, 0)), Image.new("RGB", (40, 40), (0, 0, 250))]
    edits = [Image.new("RGB", (40, 40), (0, 0, 250)), Image.new("RGB", (40, 40), (20, 200, 20))]
    before, after = ["a red square", "a blue square"], ["a blue square", "a green square"]
    got = clip_direction(["make it blue", "make it green"], edits, image=sources, source_caption=before,
                         target_caption=after, batch_size=1, **tiny)
    net, preprocess, tokenizer = load_clip(None, None, tiny["model_config"], "cpu")
    with torch.no_grad():  # InstructPix2Pix's ClipSimilarity: normalised features, then the two differences
        def image(x):
            f = net.encode_image(torch.stack([preprocess(i) for i in x]))
            return f / f.norm(dim=1, keepdim=True)

        def text(x):
            f = net.encode_text(tokenizer(x))
            return f / f.norm(dim=1, keepdim=True)
        want = torch.nn.functional.cosine_similarity(image(edits) - image(sources), text(after) - text(before))
    assert torch.allclose(torch.tensor(got), want, atol=1e-5)


def test_consistency_counts_the_pixels_outside_the_mask_or_all_but_the_changed_share():
    source = np.full((4, 4, 3), 200, np.uint8)
    edit = source.copy()
    edit[0, 0] = (0, 0, 0)        # the edit: one pixel changed by 200/255 on every channel
    edit[3, 3, 0] = 100           # a stray change outside it: 100/255 on one channel
    mask = np.zeros((4, 4), np.uint8)
    mask[0, 0] = 255
    pil = [Image.fromarray(edit)], [Image.fromarray(source)]
    with_mask = edit_consistency(["x"], pil[0], image=pil[1], mask=[Image.fromarray(mask)])
    assert with_mask == pytest.approx([1 - (100 / 255 / 3) / 15])  # 15 pixels outside, one stray change
    # no mask, region 1/16: the most-changed pixel (the edit) is left out, the stray change counts
    assert edit_consistency(["x"], pil[0], image=pil[1], region=1 / 16) == pytest.approx([1 - (100 / 255 / 3) / 15])
    assert edit_consistency(["x"], pil[0], image=pil[1], region=0.0) == pytest.approx(
        [1 - (200 / 255 + 100 / 255 / 3) / 16])
    assert edit_consistency(["x"], pil[1], image=pil[1]) == [1.0]
    with pytest.raises(ValueError, match="region=1.0 must be in"):
        edit_consistency(["x"], pil[0], image=pil[1], region=1.0)


def test_edit_judge_asks_editscores_prompts_and_reads_its_score_lists(tmp_path):
    from mmrl.rewards.edit_judge import _message, edit_judge, editscore_prompts
    from mmrl.rewards.judge import image_parts
    from test_judge import scripted
    semantics, quality = editscore_prompts(25)
    assert "From scale 0 to 25:" in semantics and "score1' evaluates the editing success" in semantics
    source, edits = Image.new("RGB", (8, 8), (250, 0, 0)), [Image.new("RGB", (8, 8), c) for c in ((0, 0, 250), (9, 9, 9))]
    message = _message("text {with braces}", [source, edits[0]])
    assert message["content"][0] == image_parts(source)[0] and message["content"][1] == image_parts(edits[0])[0]
    assert message["content"][2] == {"type": "text", "text": "text {with braces}"}  # the source first, then the edit
    answers = {semantics.replace("<instruction>", "make it blue"): 'Sure.\n{"reasoning": "blue", "score": [20, 15]}',
               semantics.replace("<instruction>", "make it grey"): "I cannot tell.",
               quality: '{"reasoning" : "clean", "score" : [25, 10]}'}
    with scripted(tmp_path, answers) as transport:
        ask = dict(image=[source, source], transport=transport)
        prompts = ["make it blue", "make it grey"]
        assert edit_judge(prompts, edits, **ask) == [pytest.approx(15 / 2.5), None]  # min / (25 / 10); unread: no number
        assert edit_judge(prompts, edits, aspect="quality", **ask) == [pytest.approx(4.0)] * 2
        assert edit_judge(prompts[:1], edits[:1], aspect="overall", **ask) == [pytest.approx((6.0 * 4.0) ** 0.5)]


def test_edit_judges_bad_arguments_are_plan_problems():
    from mmrl.config.sections import RewardSpec
    from mmrl.registry import load_plugins
    from mmrl.serving.remote_reward import remote_problems
    load_plugins()
    spec = RewardSpec(url="http://127.0.0.1:1", args={"aspect": "style", "score_range": 0})
    assert remote_problems("edit_judge", spec) == [
        "rewards.edit_judge.args.aspect='style': choose semantics, quality or overall",
        "rewards.edit_judge.args.score_range=0: the top of EditScore's scale, a positive integer (25 as EditScore, "
        "10 as VIEScore)"]
    assert remote_problems("edit_judge", RewardSpec(url="http://127.0.0.1:1")) == []
