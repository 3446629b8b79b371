"""Dia over delayed decoder steps (tasks/speech/dia*.py): the step scores against transformers' own Dia
logits processors, greedy rollouts against the stock `generate` (with guidance, an eos of its own, the
frame limit, a reference voice) and their waveforms against `DiaProcessor.batch_decode`, the sampler's
log-probs against the training forward's, and a hand-written step log-prob."""

import math
from pathlib import Path

import pytest
import torch
from helpers import on_policy_step_changes
from transformers import GenerationConfig

from mmrl.config.parse import parse_config
from mmrl.registry import ADAPTERS
from mmrl.tasks.speech.dia_steps import step_logprobs, step_scores
from mmrl.train.loop.trainer import Trainer

LOUDNESS = str(Path(__file__).parent / "digit_reward.py")

EOS_BIAS = 0.1  # added to channel 0's eos logit: the tiny model then ends "12" on its own (8 frames), not "34"


def make_policy(**settings):
    adapter = ADAPTERS.get("dia")
    return adapter(adapter.Config(**{"model": "tiny:dia", "max_new_frames": 12, **settings}))


def bias_eos(policy, bias=EOS_BIAS):
    """A hook on Dia's output layer adding `bias` to channel 0's eos logit (flat index eos of K x V)."""
    eos = torch.tensor([policy.eos])
    return policy.model.logits_dense.register_forward_hook(
        lambda module, args, out: out.index_add(-1, eos, torch.full(out.shape[:-1] + (1,), bias)))


def test_step_scores_are_the_stock_processors():
    """Random conditional / unconditional logits through our `step_scores` and through the list Dia's
    `_get_logits_processor` builds for sampling (guidance, temperature, eos filter, top-k, top-p, delay
    pattern): the same distributions, channel 0's eos forced where it is highest."""
    policy = make_policy()
    k, v = len(policy.delays), policy.model.config.decoder_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    cond, uncond = torch.randn(6, k, v, generator=gen) * 2, torch.randn(6, k, v, generator=gen) * 2
    cond[0, 0, policy.eos] = 20.0  # row 0's channel 0 ends
    config = GenerationConfig(do_sample=True, guidance_scale=3.0, temperature=1.8, top_k=5, top_p=0.9, max_length=64)
    stock = policy.model._get_logits_processor(generation_config=config, input_ids_seq_length=1,
                                               encoder_input_ids=torch.zeros(1, 1, dtype=torch.long),
                                               logits_processor=None, device="cpu", model_kwargs={})
    reference = stock(torch.zeros(6 * k, 1, dtype=torch.long), torch.cat([cond.reshape(-1, v), uncond.reshape(-1, v)]))
    ours, ends = step_scores(cond, uncond, policy.eos, 3.0, 1.8, 5, 0.9)
    assert ends.tolist() == [True] + [False] * 5
    assert torch.allclose(torch.log_softmax(ours.reshape(-1, v), -1).exp(), torch.log_softmax(reference, -1).exp())


def test_step_logprob_is_the_hand_written_sum_over_drawn_channels():
    scores = torch.tensor([[[0.0, math.log(3.0), float("-inf")], [1.0, 1.0, 1.0]]])  # one step, two channels
    tokens, drawn = torch.tensor([[1, 2]]), torch.tensor([[True, False]])
    logp, entropy = step_logprobs(scores, tokens, drawn, with_entropy=True)
    assert torch.allclose(logp, torch.tensor([math.log(0.75)]))
    assert torch.allclose(entropy, torch.tensor([-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]))


@pytest.mark.parametrize("guidance", [3.0, 1.0])
def test_greedy_is_the_stock_generate_and_decodes_as_its_processor(guidance):
    """Greedy rollouts (noise 0) equal `DiaForConditionalGeneration.generate(do_sample=False)` under the same
    guidance and top-k, token for token: "12" ends on its own, "34" at the frame limit; the waveforms are
    `DiaProcessor.batch_decode`'s of the stock output."""
    policy = make_policy(guidance_scale=guidance)
    hook = bias_eos(policy)
    ended = []
    for text in ("12", "34"):
        batch = policy.rollout([text], 1, seeds=[0], greedy=True)
        inputs = policy.processor(text=[policy.prompts.text_of(text)], return_tensors="pt", padding=True,
                                  **policy.prompts.audio_kwargs)
        stock = policy.model.generate(**inputs, max_new_tokens=12 + 1 + max(policy.delays), guidance_scale=guidance,
                                      top_k=policy.cfg.top_k, do_sample=False)
        assert torch.equal(batch.extras["decoder_ids"][0], stock[0])
        wave = policy.processor.batch_decode(stock, **policy.prompts.audio_kwargs)[0]
        assert torch.allclose(torch.from_numpy(batch.completions[0]["array"]), wave.clamp(-1, 1))
        ended.append(batch.columns["ended"][0])
    hook.remove()
    assert ended == [True, False]


def test_sampler_logprobs_are_the_training_forwards():
    """Sampled with guidance, temperature, top-k and top-p: the recorded step log-probs equal the training
    forward's over the batch; the units end max(delay) steps after channel 0's eos."""
    policy = make_policy(top_k=8, top_p=0.8)
    hook = bias_eos(policy, 0.05)
    batch = policy.rollout(["12", "3456"], 3, seeds=[4, 5])
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        training, entropy = policy.logprobs(policy.model, batch, with_entropy=True)
    hook.remove()
    assert (training - batch.rollout_logp)[mask].abs().max() < 1e-4
    assert (entropy[mask] >= 0).all() and (batch.rollout_logp[mask] < 0).any()
    ends = batch.extras["decoder_ids"][:, :, 0].eq(policy.eos).float().argmax(1)
    assert batch.unit_mask.sum(1).tolist() == (ends - 1 + max(policy.delays)).tolist()


def test_a_reference_voice_is_the_stock_audio_prompt():
    """A row with a reference voice: the greedy rollout equals the stock generate on DiaProcessor's text and
    audio prompt; sampled rollouts' log-probs are the training forward's, with rows of other prompt lengths."""
    policy = make_policy(voice_audio_column="voice", voice_text_column="voice_text", max_new_frames=5)
    wave = (torch.randn(512 * 4, generator=torch.Generator().manual_seed(0)) * 0.1).numpy()  # 4 DAC frames
    row = {"prompt": "42", "voice": {"array": wave, "sampling_rate": 44100}, "voice_text": "[S1] 7"}
    prompt = policy.prompts.of(row, row["prompt"])
    assert prompt.start == 5
    batch = policy.rollout([row], 1, seeds=[0], greedy=True)
    inputs = policy.processor(text=["[S1] 7 [S1] 42"], audio=[wave], return_tensors="pt", padding=True,
                              **policy.prompts.audio_kwargs)
    stock = policy.model.generate(**inputs, max_new_tokens=5 + 1 + max(policy.delays), top_k=policy.cfg.top_k,
                                  guidance_scale=3.0, do_sample=False)
    assert torch.equal(batch.extras["decoder_ids"][0], stock[0])
    batch = policy.rollout([row, "3"], 2, seeds=[1, 2])
    with torch.no_grad():
        training = policy.logprobs(policy.model, batch)[0]
    assert (training - batch.rollout_logp)[batch.unit_mask.bool()].abs().max() < 1e-4


@pytest.mark.parametrize("setting,message", [
    ({"temperature": 0.7}, "policy.temperature=0.7 must be >= 1"),
    ({"guidance_scale": 0.5}, "policy.guidance_scale=0.5 must be >= 1"),
    ({"voice_audio_column": "voice"}, "go together"),
])
def test_bad_settings_are_refused_by_name(setting, message):
    adapter = ADAPTERS.get("dia")
    problems = adapter.config_problems(adapter.Config(model="tiny:dia", **setting))
    assert any(message in p for p in problems), problems


RECIPE = {"task": "dia", "policy": {"model": "tiny:dia", "max_new_frames": 4, "top_k": 8},
          "data": {"name": "arithmetic", "args": {"n_train": 8, "n_eval": 2, "digits": 1}},
          "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [LOUDNESS],
          "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1, "seed": 0}
METHODS = {"grpo": {},
           "gspo": {"ratio_level": "sequence", "eps_low": 3e-4, "eps_high": 4e-4},
           "dapo": {"eps_low": 0.2, "eps_high": 0.28, "aggregation": "token_mean"}}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_each_text_lm_method_trains_a_step_on_policy(method, tmp_path):
    """GRPO, GSPO (sequence-level ratio) and DAPO (clip-higher, token-mean) each take a step that starts
    exactly on-policy, with the sampler's log-probs the training forward's, and moves the decoder."""
    t = Trainer(parse_config({**RECIPE, "algorithm": {"group_size": 3, **METHODS[method]}}, [f"output_dir={tmp_path}"]))
    changed = on_policy_step_changes(t)
    assert any("decoder.layers" in n for n in changed)


def test_mask_truncated_leaves_completions_cut_at_the_frame_limit_out():
    """policy.mask_truncated (DAPO's overlong filtering): a completion whose eos was forced has no units."""
    policy = make_policy(max_new_frames=2, mask_truncated=True)
    batch = policy.rollout(["12"], 3, seeds=[0])
    assert batch.truncated.all() and not batch.unit_mask.any() and not batch.rollout_logp.any()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lora_loads_in_the_stock_class_and_changes_its_greedy_output(tmp_path):
    """A LoRA step on a saved tiny Dia, the adapter saved: DiaForConditionalGeneration plus
    PeftModel.from_pretrained scores the rollouts as the trained policy does, and its stock greedy
    `generate` differs from the base model's."""
    from peft import PeftModel
    from transformers import DiaForConditionalGeneration, DiaProcessor
    base = make_policy()
    base.save_pretrained(base.model, tmp_path / "base")
    target = r".*decoder.*\.(q_proj|v_proj|gate_up_proj)"
    t = Trainer(parse_config({**RECIPE, "policy": {**RECIPE["policy"], "model": str(tmp_path / "base")}},
                             [f"output_dir={tmp_path / 'run'}", "optim.lora.r=4", "optim.lora.alpha=8",
                              f"optim.lora.target_modules={target}", "optim.lr=0.2"]))
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(DiaForConditionalGeneration.from_pretrained(tmp_path / "base"),
                                       tmp_path / "adapter").eval()
    plain = DiaForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    batch = t.policy.rollout(t.inputs.train_rows[:1], 2, seeds=[3])
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        trained = t.policy.logprobs(t.unwrapped.eval(), batch)[0][mask]
        assert torch.allclose(t.policy.logprobs(loaded, batch)[0][mask], trained, atol=1e-5)
    processor = DiaProcessor.from_pretrained(tmp_path / "base")
    inputs = processor(text=["[S1] 12"], return_tensors="pt", padding=True, **base.prompts.audio_kwargs)
    settings = {"max_new_tokens": 12, "guidance_scale": 3.0, "top_k": 8, "do_sample": False}
    assert not torch.equal(loaded.generate(**inputs, **settings), plain.generate(**inputs, **settings))


def test_the_recipe_trains_a_step_on_its_tiny_model(tmp_path):
    """tts_dia.yaml as shipped (GSPO, LoRA on the decoder, Dia's sampling settings, asr_wer against the words
    to say), with a tiny random Whisper registered as its ASR judge and short completions."""
    import mmrl.rewards.wer as W
    from test_rewards_wer import _tiny_whisper
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    W.register_asr_model("tiny-tts-judge", *_tiny_whisper())
    cfg = load_recipe(resolve_recipe("tts_dia"), [f"output_dir={tmp_path}", "policy.max_new_frames=3",
                                                  "rewards.asr_wer.args.model=tiny-tts-judge", "max_steps=2",
                                                  "logging.report_to=[none]", "logging.progress=false"])
    t = Trainer(cfg)
    assert t.stage.policy.guidance_scale == 3.0 and cfg.algorithm.ratio_level == "sequence"
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and ".decoder." in n for n in trainable)
    for _ in range(2):
        metrics = t.train_step()
        assert 0.0 <= metrics["reward/asr_wer"] <= 1.0 and torch.isfinite(torch.tensor(metrics["loss"]))
