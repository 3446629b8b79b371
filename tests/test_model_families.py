"""Every model family the README names, as a tiny random model built in memory (tasks/demos/tiny_models.py):
images (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3, LLaVA), video (Qwen2.5-VL, Qwen3-VL), audio
(Qwen2-Audio, the Qwen2.5-Omni thinker). Each passes the adapters' correctness checks: each row's
samples and log-probs equal the row alone; the shared prefill samples what the plain prefill does;
the shared-prefix log-probs equal the plain forward's (where the family takes the shared mask);
streamed gradients equal one batch; a GRPO step starts exactly on-policy and changes the weights
of the media encoder and of the language model."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from helpers import assert_grads_close, on_policy_step_changes, streamed_grads
from mmrl.tasks.lm.audio_lm import AudioLMConfig, AudioLMPolicy
from mmrl.tasks.lm.prefix_sharing import unsupported_reason
from mmrl.tasks.lm.vlm import VLMConfig, VLMPolicy
from PIL import Image
from test_video import write_clip

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

RNG = np.random.default_rng(0)
SMALL_FRAMES = {"video_min_pixels": 28 * 28, "video_max_pixels": 56 * 56}
SHORT_AUDIO = {"max_seconds": 2}


def image(h, w):
    return Image.fromarray(RNG.integers(0, 255, (h, w, 3), dtype=np.uint8))


def clip(seconds, rate):
    return {"array": RNG.standard_normal(int(seconds * rate)) * 0.1, "sampling_rate": rate}


def image_rows():
    return [{"prompt": "where is it?", "image": image(56, 84)},
            {"prompt": "red?", "image": image(112, 56)},
            {"prompt": "two images", "image": [image(56, 56), image(28, 56)]}]


def video_rows():
    return [{"prompt": "which way?", "video": list(RNG.integers(0, 255, (4, 56, 56, 3), dtype=np.uint8))},
            {"prompt": "short", "video": {"frames": RNG.integers(0, 255, (3, 28, 56, 3), dtype=np.uint8), "fps": 2}},
            {"prompt": "an image", "image": image(56, 56)}]


def audio_rows():
    return [{"prompt": "what?", "audio": clip(0.5, 8000)}, {"prompt": "who speaks here?", "audio": clip(1.2, 16000)}]


# family: (adapter, tiny model, tiny args, policy options, rows, media encoder's parameter names)
FAMILIES = {
    "qwen2-vl": ("vlm", "qwen2-vl-char", {}, {}, image_rows, "visual"),
    "qwen2.5-vl": ("vlm", "qwen2.5-vl-char", {}, {}, image_rows, "visual"),
    "qwen3-vl": ("vlm", "qwen3-vl-char", {}, {}, image_rows, "visual"),
    "gemma3": ("vlm", "gemma3-char", {}, {}, image_rows, "vision_tower"),
    "llava": ("vlm", "llava-char", {}, {}, image_rows, "vision_tower"),
    "qwen2.5-vl-video": ("vlm", "qwen2.5-vl-char", {}, dict(num_frames=4, **SMALL_FRAMES), video_rows, "visual"),
    "qwen3-vl-video": ("vlm", "qwen3-vl-char", {}, dict(num_frames=4, **SMALL_FRAMES), video_rows, "visual"),
    "qwen2-audio": ("audio_lm", "qwen2-audio-char", SHORT_AUDIO, {}, audio_rows, "audio_tower"),
    "qwen2.5-omni-thinker": ("audio_lm", "qwen2.5-omni-thinker-char", SHORT_AUDIO, {}, audio_rows, "audio_tower"),
}
ADAPTERS = {"vlm": (VLMPolicy, VLMConfig), "audio_lm": (AudioLMPolicy, AudioLMConfig)}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    adapter, tiny, tiny_args, options, rows, _ = FAMILIES[request.param]
    policy_class, config_class = ADAPTERS[adapter]
    policy = policy_class(config_class(model=f"tiny:{tiny}", tiny_args=tiny_args, max_new_tokens=6, **options))
    return request.param, policy, rows()


def test_each_row_equals_the_row_alone_and_shared_paths_equal_plain_ones(family):
    _, policy, rows = family
    seeds = list(range(1, len(rows) + 1))
    batch = policy.rollout(rows, 2, seeds=seeds)  # with the shared prefill (the default)
    assert len(set(batch.completions)) > len(rows)  # real samples, not one string per group
    full, _ = policy.logprobs(policy.model, batch)
    for g, row in enumerate(rows):
        alone = policy.rollout([row], 2, seeds=[seeds[g]])
        assert alone.completions == batch.completions[2 * g:2 * g + 2]
        single, _ = policy.logprobs(policy.model, alone)
        assert torch.allclose(full[2 * g:2 * g + 2, :single.shape[1]], single, atol=1e-5)
    with torch.no_grad():  # on-policy: the same rows scored again give exactly the same log-probs
        old, _ = policy.logprobs(policy.model, batch)
    assert torch.equal(old, full)
    policy.cfg.shared_prefill = False
    try:
        assert policy.rollout(rows, 2, seeds=seeds).completions == batch.completions
    finally:
        policy.cfg.shared_prefill = True
    logp = {}
    for mode in ("on", "off"):
        policy.cfg.prefix_sharing = mode
        logp[mode], _ = policy.logprobs(policy.model, batch)
    policy.cfg.prefix_sharing = "auto"
    assert (logp["on"] - logp["off"]).abs().max() <= 1e-5


def test_shared_prefix_support_is_as_documented(family):
    name, policy, _ = family
    reason = unsupported_reason(policy.model.config)
    assert (reason is None) == (name != "gemma3"), reason  # Gemma 3's image blocks attend bidirectionally


def write_data(rows, root: Path) -> Path:
    """`rows` as a JSONL file with their images / clips / videos written next to it."""
    out = []
    for i, row in enumerate(rows):
        row = dict(row)
        if "image" in row:
            images = row["image"] if isinstance(row["image"], list) else [row["image"]]
            for k, im in enumerate(images):
                im.save(root / f"{i}-{k}.png")
            row["image"] = [str(root / f"{i}-{k}.png") for k in range(len(images))]
        if "video" in row:
            row["video"] = str(write_clip(root / f"{i}.mp4", frames=6, rate=3, size=56))
        if "audio" in row:
            soundfile.write(root / f"{i}.wav", np.asarray(row["audio"]["array"], np.float32),
                            row["audio"]["sampling_rate"])
            row["audio"] = str(root / f"{i}.wav")
        out.append(row)
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in out))
    return path


@pytest.mark.parametrize("name", list(FAMILIES))
def test_streaming_and_a_training_step(name, tmp_path):
    adapter, tiny, tiny_args, options, rows, encoder = FAMILIES[name]
    recipe = {"task": adapter,
              "policy": {"model": f"tiny:{tiny}", "tiny_args": tiny_args, "max_new_tokens": 5, **options},
              "data": {"path": str(write_data(rows()[:2], tmp_path))},
              "rewards": {"letter_share": {"weight": 1.0}},
              "reward_modules": [str(Path(__file__).parent / "letter_reward.py")],
              "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2, "micro_batch_size": 6},
              "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1,
              "output_dir": str(tmp_path / "run")}
    t = Trainer(parse_config(recipe))
    batch = t.prepare_batch(1)
    assert_grads_close(*streamed_grads(t, batch, (6, 2)))
    changed = on_policy_step_changes(t)
    assert any(encoder in n for n in changed), name
    assert any("language_model" in n or ".layers." in n and encoder not in n for n in changed), name


def test_the_thinker_of_a_whole_omni_checkpoint_loads(tmp_path):
    """A Qwen2.5-Omni checkpoint (config with thinker and talker, weights under `thinker.`) loads
    as its thinker in `audio_lm`, with the weights it was saved with."""
    from mmrl.tasks.model_loading import TINY_MODELS
    from safetensors.torch import save_file
    from transformers import Qwen2_5OmniConfig
    thinker, processor = TINY_MODELS.get("qwen2.5-omni-thinker-char")(**SHORT_AUDIO)
    config = Qwen2_5OmniConfig(thinker_config=thinker.config.to_dict())
    config.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    save_file({f"thinker.{k}": v.clone() for k, v in thinker.state_dict().items()}, tmp_path / "model.safetensors")
    processor.save_pretrained(tmp_path)
    policy = AudioLMPolicy(AudioLMConfig(model=str(tmp_path), max_new_tokens=4))
    assert type(policy.model) is type(thinker)
    saved = thinker.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in policy.model.state_dict().items())
    assert len(policy.rollout(audio_rows()[:1], 2, seeds=[1]).completions) == 2
