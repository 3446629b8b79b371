"""CSM over codec frames (tasks/speech/): a frame's log-prob against transformers' own training
loss, the sampler's log-probs against the training forward's with top-k and the codec's id range,
the end frame, and a LoRA that the stock class loads with peft."""

from pathlib import Path

import pytest
import torch
from transformers import CsmForConditionalGeneration

from mmrl.config.parse import parse_config
from mmrl.registry import ADAPTERS
from mmrl.tasks.speech.codec_frames import codebook_logits, frame_logprobs
from mmrl.train.loop.trainer import Trainer

LOUDNESS = str(Path(__file__).parent / "digit_reward.py")
RECIPE = {"task": "csm", "policy": {"model": "tiny:csm-char", "max_new_frames": 4, "top_k": 0},
          "data": {"name": "arithmetic", "args": {"n_train": 8, "n_eval": 2, "digits": 1}},
          "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [LOUDNESS],
          "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1, "seed": 0}


def make_policy(**settings):
    adapter = ADAPTERS.get("csm")
    return adapter(adapter.Config(**{"model": "tiny:csm-char", "max_new_frames": 5, **settings}))


def test_frame_logprobs_are_transformers_training_loss():
    """At temperature 1 over the whole codebook vocabulary, the frames' summed log-probs are minus
    CSM's own training losses (the backbone's first-codebook and the depth decoder's cross-entropies,
    each a mean over its tokens) times their token counts."""
    policy = make_policy()
    model, config = policy.model.eval(), policy.model.config
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([policy.prompt_ids("12")])
    frames = torch.randint(1, config.vocab_size, (1, 6, config.num_codebooks), generator=gen)
    embeds = torch.cat([model.embed_text_tokens(prompt), model.backbone_model.embed_tokens(frames)], 1)
    labels = torch.cat([torch.full((1, prompt.shape[1], config.num_codebooks), -100), frames], 1)
    with torch.no_grad():
        out = model(inputs_embeds=embeds, labels=labels)
        hidden = model.backbone_model(inputs_embeds=embeds).last_hidden_state[:, prompt.shape[1] - 1:-1]
        logp, _ = frame_logprobs(model.lm_head, model.depth_decoder, hidden, frames, 1.0, 0, config.vocab_size)
    reference = -(out.backbone_loss * 6 + out.depth_decoder_loss * 6 * (config.num_codebooks - 1))
    assert torch.allclose(logp.sum(), reference, atol=1e-4), (float(logp.sum()), float(reference))


def test_codebook_logits_keep_top_k_of_the_decodable_ids():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0, 9.0]])  # id 4 is past the codec's range
    out = codebook_logits(logits, 2.0, 2, allowed=4)
    assert torch.equal(torch.isfinite(out), torch.tensor([[False, True, False, True, False]]))
    assert torch.allclose(out[0, [1, 3]], torch.tensor([1.5, 1.0]))


def test_sampler_logprobs_are_the_training_forwards_with_top_k():
    policy = make_policy(top_k=5, temperature=0.7)
    batch = policy.rollout(["12", "345"], 3, seeds=[4, 5])
    mask = batch.unit_mask.bool()
    assert (batch.extras["completion_codes"] < policy.allowed).all()
    with torch.no_grad():
        training, entropy = policy.logprobs(policy.model, batch, with_entropy=True)
    assert (training - batch.rollout_logp)[mask].abs().max() < 1e-4
    assert (entropy[mask] > 0).all() and (entropy[mask] <= policy.num_codebooks * torch.log(torch.tensor(5.0)) + 1e-4).all()


class EndOnThirdFrame(torch.nn.Module):
    """A head whose logits put (almost) all mass on code 0 on the third frame and none before."""

    def __init__(self, head, frame):
        super().__init__()
        self.head, self.frame = head, frame

    def forward(self, *args, **kwargs):
        if isinstance(self.head, torch.nn.Linear):  # the backbone's head: once per frame
            self.frame["n"] += 1
        logits = self.head(*args, **kwargs)
        return logits.index_fill(-1, torch.tensor([0]), 1e4 if self.frame["n"] == 3 else -1e4)


def test_an_end_frame_ends_the_completion_and_is_its_last_unit():
    """Codes all 0 on the 3rd frame (CSM's end frame): three units, two frames decoded."""
    policy = make_policy(max_new_frames=6)
    model, frame = policy.model, {"n": 0}
    model.lm_head = EndOnThirdFrame(model.lm_head, frame)
    model.depth_decoder.codebooks_head = EndOnThirdFrame(model.depth_decoder.codebooks_head, frame)
    batch = policy.rollout(["7"], 1, seeds=[0])
    assert batch.unit_mask.tolist() == [[1.0, 1.0, 1.0]] and not batch.truncated.any()
    assert (batch.extras["completion_codes"][0, :, 2] == 0).all()
    assert (batch.extras["completion_codes"][0, :, :2] != 0).all()
    assert len(batch.completions[0]["array"]) == 2 * 1920  # two frames of Mimi at 24 kHz, 12.5 frames a second


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lora_loads_in_the_stock_class_with_peft(tmp_path):
    """A LoRA step on a saved tiny CSM, the adapter saved: CsmForConditionalGeneration plus
    PeftModel.from_pretrained scores the rollouts as the trained policy does, not as the base."""
    from peft import PeftModel
    base = make_policy()
    base.save_pretrained(base.model, tmp_path / "base")
    target = r".*(backbone_model|depth_decoder).*\.(q_proj|v_proj)"
    t = Trainer(parse_config({**RECIPE, "policy": {**RECIPE["policy"], "model": str(tmp_path / "base")}},
                             [f"output_dir={tmp_path / 'run'}", "optim.lora.r=4", "optim.lora.alpha=8",
                              f"optim.lora.target_modules={target}", "optim.lr=0.05"]))
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(CsmForConditionalGeneration.from_pretrained(tmp_path / "base"),
                                       tmp_path / "adapter").eval()
    plain = CsmForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    batch = t.policy.rollout(t.inputs.train_rows[:1], 2, seeds=[3])
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        trained = t.policy.logprobs(t.unwrapped.eval(), batch)[0][mask]
        assert torch.allclose(t.policy.logprobs(loaded, batch)[0][mask], trained, atol=1e-5)
        assert not torch.allclose(t.policy.logprobs(plain, batch)[0][mask], trained, atol=1e-4)


def test_the_recipe_trains_a_step_on_its_tiny_model(tmp_path):
    """tts_csm.yaml as shipped (GSPO, LoRA on the backbone, asr_wer against the words to say), with a tiny
    random Whisper registered as its ASR judge and short completions."""
    import mmrl.rewards.wer as W
    from test_rewards_wer import _tiny_whisper
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    W.register_asr_model("tiny-tts-judge", *_tiny_whisper())
    cfg = load_recipe(resolve_recipe("tts_csm"), [f"output_dir={tmp_path}", "policy.max_new_frames=3",
                                                  "rewards.asr_wer.args.model=tiny-tts-judge", "max_steps=1",
                                                  "logging.report_to=[none]", "logging.progress=false"])
    t = Trainer(cfg)
    assert t.stage.policy.top_k == 50 and cfg.algorithm.ratio_level == "sequence"
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "backbone_model" in n for n in trainable)
    metrics = t.train_step()
    assert 0.0 <= metrics["reward/asr_wer"] <= 1.0 and torch.isfinite(torch.tensor(metrics["loss"]))


def test_a_model_wrapped_for_distribution_is_refused_by_name():
    """The log-probs call CSM's parts outside a wrapper's forward (where a data-parallel wrapper would not
    average their gradients), so a wrapped model is refused rather than trained silently unsynchronised."""
    from mmrl.errors import UserError

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    policy = make_policy(max_new_frames=2)
    batch = policy.rollout(["1"], 2, seeds=[0])
    with pytest.raises(UserError, match="task csm: the model comes wrapped as Wrapper"):
        policy.logprobs(Wrapper(policy.model), batch)


def test_a_reference_voice_prompt_embeds_as_transformers_merges_it():
    """A row with a reference voice: our prompt embeddings (the clip's Mimi codes kept beside the ids) equal
    CsmForConditionalGeneration._merge_input_ids_with_input_values on the same ids and waveform; its
    rollouts' log-probs are the training forward's."""
    from mmrl.tasks.speech.csm_prompts import prompt_embeddings
    policy = make_policy(voice_audio_column="voice", voice_text_column="voice_text", max_new_frames=3)
    wave = (torch.randn(24000 * 2 // 5, generator=torch.Generator().manual_seed(0)) * 0.1).numpy()  # 5 Mimi frames
    row = {"prompt": "42", "voice": {"array": wave, "sampling_rate": 24000}, "voice_text": "7"}
    prompt = policy._prompt_tensors([row])
    ids, codes = prompt["prompt_ids"], prompt["prompt_codes"]
    assert int((ids == policy.model.config.audio_token_id).sum()) == 5
    with torch.no_grad():
        stock = policy.model._merge_input_ids_with_input_values(
            input_ids=ids, input_values=torch.from_numpy(wave)[None, None],
            input_values_cutoffs=torch.tensor([[len(wave)]]))["inputs_embeds"]
        assert torch.allclose(prompt_embeddings(policy.model, ids, codes), stock, atol=1e-6)
    batch = policy.rollout([row, {**row, "prompt": "3"}], 2, seeds=[1, 2])
    with torch.no_grad():
        training = policy.logprobs(policy.model, batch)[0]
    mask = batch.unit_mask.bool()
    assert (training - batch.rollout_logp)[mask].abs().max() < 1e-4


def test_dapo_masks_completions_cut_at_the_frame_limit_and_trains(tmp_path):
    """policy.mask_truncated (DAPO's overlong filtering): a completion without its end frame leaves the loss;
    a DAPO-style step (clip-higher, token-mean) runs on the rest."""
    policy = make_policy(max_new_frames=2, mask_truncated=True)
    batch = policy.rollout(["12"], 3, seeds=[0])
    assert batch.truncated.all() and not batch.unit_mask.any() and not batch.rollout_logp.any()
    t = Trainer(parse_config({**RECIPE, "policy": {**RECIPE["policy"], "mask_truncated": False},
                              "algorithm": {"group_size": 3, "eps_low": 0.2, "eps_high": 0.28,
                                            "aggregation": "token_mean"}}, [f"output_dir={tmp_path}"]))
    assert torch.isfinite(torch.tensor(t.train_step()["loss"]))
