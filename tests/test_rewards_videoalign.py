"""VideoAlign (VideoReward): its checkpoint format written by PEFT on a tiny random Qwen2-VL,
loaded back, scored against the unmerged PEFT model's heads, normalised with the published
constants; the frame sampling and resizing against hand values."""

import json

import pytest
import torch
from mmrl.core.advantages import compute_advantages
from mmrl.core.scoring import compute_rewards, get_reward
from mmrl.rewards.videoalign import (PUBLISHED_NORMALISATION, prepared_video, prompt_template, raw_scores,
                                     resized_side, sampled_frames)
from mmrl.rewards.videoalign_checkpoint import SPECIAL_TOKENS, load_videoalign, merged_state_dict

from mmrl.config.algorithm import AlgorithmConfig

PUBLISHED = {"VQ_mean": 3.6757, "VQ_std": 2.2476, "MQ_mean": 1.1646, "MQ_std": 1.3811,
             "TA_mean": 2.8105, "TA_std": 2.5121}  # KlingTeam/VideoReward model_config.json, inference_config
# a template of the checkpoint's shape (our words, not the authors' text): the video's prompt and one
# special token per head
TEMPLATE = ("Rate this video.\nVisual quality: <|VQ_reward|>\nMotion quality: <|MQ_reward|>\n"
            "Prompt: {text_prompt}\nText alignment: <|TA_reward|>\n")
ARGS = dict(min_pixels=56 * 56, max_pixels=56 * 56, dtype="float32", device="cpu", batch_size=2)


def test_frame_sampling_and_resizing_by_hand():
    # 33 frames at 16 fps sampled at 2 fps: 4.125 -> 4 frames at round(linspace(0, 32, 4))
    assert sampled_frames(33, 16, 2.0) == [0, 11, 21, 32]
    # 81 frames at 16 fps: 10.125 -> 10 frames
    assert sampled_frames(81, 16, 2.0) == torch.linspace(0, 80, 10).round().long().tolist()
    assert sampled_frames(5, 24, 2.0) == [0, 1, 3, 4]         # at least 4 frames
    assert sampled_frames(3, 24, 2.0) == [0, 2]               # never more than the video's even count
    # 480 x 832 under 448 * 448 pixels: 1.4106 times smaller, each side floored to a multiple of 28
    assert resized_side(480, 832, 128 * 28 * 28, 448 * 448) == (336, 588)
    assert resized_side(32, 32, 128 * 28 * 28, 448 * 448) == (336, 336)   # up to the minimum
    assert resized_side(60, 90, 28 * 28, 448 * 448) == (56, 84)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A VideoReward-format directory written the authors' way: the Qwen2-VL with the three special
    tokens and an rm_head, wrapped by PEFT (LoRA r 4, alpha 8, B non-zero), its state dict saved
    whole as checkpoint-STEP/model.pth beside model_config.json."""
    from peft import LoraConfig, get_peft_model
    from mmrl.tasks.demos.tiny_multimodal import qwen2_vl_char
    root = tmp_path_factory.mktemp("videoreward")
    model, processor = qwen2_vl_char(max_pixels=56 * 56, seed=3)
    processor.save_pretrained(root / "base")
    model.save_pretrained(root / "base")
    processor.tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS.values())})
    model.resize_token_embeddings(len(processor.tokenizer))
    torch.manual_seed(0)
    model.rm_head = torch.nn.Linear(model.config.get_text_config().hidden_size, 1, bias=False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=r".*language_model.*\.(q_proj|v_proj|up_proj)",
                      init_lora_weights=False)
    peft_model = get_peft_model(model, lora).eval()
    (root / "checkpoint-40").mkdir()
    torch.save(peft_model.state_dict(), root / "checkpoint-40" / "model.pth")
    processor.tokenizer.save_pretrained(root / "checkpoint-40" / "tokenizer")
    (root / "model_config.json").write_text(json.dumps({
        "data_config": {"fps": 2.0, "max_frame_pixels": 56 * 56, "eval_dim": ["VQ", "MQ", "TA"]},
        "model_config": {"model_name_or_path": str(root / "base"), "output_dim": 1, "reward_token": "special"},
        "peft_lora_config": {"lora_r": 4, "lora_alpha": 8, "use_rslora": False},
        "inference_config": PUBLISHED}))
    (root / "prompt_template.txt").write_text(TEMPLATE)
    return root, peft_model, processor


def test_the_template_is_the_users_file_and_is_checked(checkpoint, tmp_path):
    root = checkpoint[0]
    with pytest.raises(ValueError, match="prompt_template.txt.*does not exist.*args.template"):
        prompt_template(str(tmp_path), None)
    no_ta = tmp_path / "no_ta.txt"
    no_ta.write_text(TEMPLATE.replace("<|TA_reward|>", ""))
    with pytest.raises(ValueError, match=r"no_ta.txt.*<\|TA_reward\|>"):
        prompt_template(str(root), str(no_ta))
    assert prompt_template(str(root), None) == TEMPLATE


def videos():
    gen = torch.Generator().manual_seed(5)
    return [torch.rand(9, 3, 40, 56, generator=gen), (torch.rand(6, 3, 56, 56, generator=gen) * 255).to(torch.uint8)]


def peft_heads(peft_model, processor, prompts, frames):
    """The authors' forward, by hand: hidden states of the unmerged PEFT model at the three special
    tokens, times rm_head, in the order VQ, MQ, TA."""
    texts = [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": TEMPLATE.format(
            text_prompt=p)}]}], tokenize=False, add_generation_prompt=True) for p in prompts]
    batch = processor(text=texts, videos=frames, padding=True, return_tensors="pt",
                      videos_kwargs={"do_rescale": True, "do_resize": False})
    inner = peft_model.base_model.model
    with torch.no_grad():
        hidden = inner.model(**{k: v for k, v in batch.items() if torch.is_tensor(v)}).last_hidden_state
    rows = []
    for b in range(len(prompts)):
        ids = batch["input_ids"][b].tolist()
        at = [ids.index(processor.tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS[h])) for h in ("VQ", "MQ", "TA")]
        rows.append(inner.rm_head(hidden[b, at])[:, 0])
    return torch.stack(rows)


def test_the_loaded_checkpoint_scores_as_the_peft_model(checkpoint):
    root, peft_model, processor = checkpoint
    prompts = ["a red disc moves right", "rain on a window"]
    frames = [prepared_video(v, 16.0, 2.0, 56 * 56, 56 * 56) for v in videos()]
    want = peft_heads(peft_model, processor, prompts, frames)
    loaded = load_videoalign(str(root), None, "cpu", torch.float32)
    got = raw_scores(loaded, prompts, frames, prompt_template(str(root), None))
    assert torch.allclose(got, want, atol=1e-4), (got, want)
    assert got.std() > 0  # the heads differ: a head mixed up with another would be caught


def test_each_head_is_its_own_reward_normalised_with_the_published_constants(checkpoint):
    root, peft_model, processor = checkpoint
    prompts = ["a red disc moves right", "rain on a window"]
    frames = [prepared_video(v, 16.0, 2.0, 56 * 56, 56 * 56) for v in videos()]
    raw = peft_heads(peft_model, processor, prompts, frames)
    by_hand = {"VQ": (raw[:, 0] - 3.6757) / 2.2476, "MQ": (raw[:, 1] - 1.1646) / 1.3811,
               "TA": (raw[:, 2] - 2.8105) / 2.5121}
    assert PUBLISHED_NORMALISATION == {"VQ": (3.6757, 2.2476), "MQ": (1.1646, 1.3811), "TA": (2.8105, 2.5121)}
    fns = {name: (lambda name=name, **kw: get_reward(name)(path=str(root), **ARGS, **kw))
           for name in ("videoalign_vq", "videoalign_mq", "videoalign_ta", "videoalign")}
    rewards = compute_rewards(fns, prompts, videos(), {"fps": [16.0, 16.0]})
    for head in ("VQ", "MQ", "TA"):
        assert torch.allclose(rewards[f"videoalign_{head.lower()}"], by_hand[head], atol=1e-4), head
    assert torch.allclose(rewards["videoalign"], by_hand["VQ"] + by_hand["MQ"] + by_hand["TA"], atol=1e-4)
    raw_mq = get_reward("videoalign")(prompts, videos(), path=str(root), head="MQ", normalise=False,
                                      fps=[16.0, 16.0], **ARGS)
    assert torch.allclose(torch.tensor(raw_mq), raw[:, 1], atol=1e-4)
    # reward_combine: advantage gives each head its own group-normalised advantage
    four = {k: torch.cat([v, v.flip(0)]) for k, v in rewards.items() if k != "videoalign"}
    adv = compute_advantages(four, {k: 1.0 for k in four}, torch.zeros(4, dtype=torch.long),
                             AlgorithmConfig(reward_combine="advantage", std="none", estimator="dr_grpo"))
    assert torch.allclose(adv.advantages, sum(v - v.mean() for v in four.values()), atol=1e-5)


def test_legacy_names_and_the_lora_merge_by_hand():
    a, b, w = torch.ones(2, 3), torch.full((4, 2), 0.5), torch.zeros(4, 3)
    state = {"base_model.model.model.layers.0.mlp.up_proj.base_layer.weight": w,
             "base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight": a,
             "base_model.model.model.layers.0.mlp.up_proj.lora_B.default.weight": b,
             "base_model.model.visual.blocks.0.attn.qkv.weight": torch.ones(1),
             "base_model.model.rm_head.weight": torch.ones(1, 3)}
    out = merged_state_dict(state, {"lora_r": 2, "lora_alpha": 4})
    assert sorted(out) == ["model.language_model.layers.0.mlp.up_proj.weight", "model.visual.blocks.0.attn.qkv.weight",
                           "rm_head.weight"]
    assert torch.equal(out["model.language_model.layers.0.mlp.up_proj.weight"], torch.full((4, 3), 2.0))  # 2 x (B A = 1)


def test_missing_inputs_are_named(checkpoint, tmp_path):
    root = checkpoint[0]
    with pytest.raises(ValueError, match="args.path"):
        get_reward("videoalign")(["p"], videos()[:1], fps=[8])
    with pytest.raises(ValueError, match="a column 'fps' or args.source_fps"):
        get_reward("videoalign_vq")(["p"], videos()[:1], path=str(root), **ARGS)
    with pytest.raises(FileNotFoundError, match="model_config.json"):
        get_reward("videoalign_vq")(["p"], videos()[:1], path=str(tmp_path), fps=[8],
                                    template=str(root / "prompt_template.txt"), **ARGS)
