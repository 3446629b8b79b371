"""Qwen2.5-Omni's talker as a speech policy (tasks/speech/omni_talker.py): greedy codes and waveform against the stock
`Qwen2_5OmniForConditionalGeneration.generate`, log-probs against the stock talker generation's processed scores
and transformers' own logits processors, the sampler's against the training forward's, a LoRA that the stock class
loads with peft, the recipe, and the methods (GSPO, DAPO)."""

from pathlib import Path

import pytest
import torch
from transformers import Qwen2_5OmniForConditionalGeneration
from transformers.generation.logits_process import (LogitsProcessorList, RepetitionPenaltyLogitsProcessor,
                                                    SuppressTokensLogitsProcessor, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

from mmrl.config.parse import parse_config
from mmrl.registry import ADAPTERS
from mmrl.tasks.speech.omni_talker_inputs import prefix_codes, processed_logits, seen_ids
from mmrl.train.loop.trainer import Trainer

LOUDNESS = str(Path(__file__).parent / "digit_reward.py")
POLICY = {"model": "tiny:qwen2_5-omni-talker", "system_prompt": "", "max_new_tokens": 4}
RECIPE = {"task": "omni_talker", "policy": POLICY,
          "data": {"name": "arithmetic", "args": {"n_train": 8, "n_eval": 2, "digits": 1}},
          "rewards": {"loudness": {"weight": 1.0}}, "reward_modules": [LOUDNESS],
          "algorithm": {"group_size": 3}, "optim": {"lr": 1e-2, "prompts_per_step": 2},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1, "seed": 0}


def make_policy(**settings):
    adapter = ADAPTERS.get("omni_talker")
    return adapter(adapter.Config(**{**POLICY, "max_new_tokens": 6, **settings}))


TEXTS = ["12", "3456"]


def stock_generate(policy, model, seed, **talker):
    """The stock generate on the policy's prompts for TEXTS, left-padded to one batch with their attention mask as
    the processor gives them (thinker greedy, 4 reply tokens): (each row's thinker reply, the talker's generate output
    with its processed scores, the waveforms), token2wav's noise from `seed`. (Given no attention mask, or one of all
    ones, the stock talker forward adds no codec embeddings at its prefill's last two positions; given padding it adds
    them, as the policy always does: docs/methods.md.)"""
    captured = {}
    talker_generate = model.talker.generate

    def recording(**kwargs):
        captured["out"] = talker_generate(**kwargs, output_scores=True, return_dict_in_generate=True)
        return captured["out"].sequences

    rows = [policy.prompt_ids(text) for text in TEXTS]
    width = max(map(len, rows))
    ids = torch.tensor([[policy.tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    model.talker.generate = recording
    torch.manual_seed(seed)
    sequences, waves = model.generate(input_ids=ids, attention_mask=mask, speaker="Chelsie", thinker_max_new_tokens=4,
                                      thinker_do_sample=False, talker_max_new_tokens=6,
                                      talker_eos_token_id=policy.end_ids, **talker)
    model.talker.generate = talker_generate
    return sequences[:, width:].tolist(), captured["out"], waves


def stock_codes(policy, out):
    """Each row's codes [T_i] from the stock talker output, up to and with its first end id."""
    codes = out.sequences[:, -len(out.scores):]
    ended = torch.isin(codes, torch.tensor(policy.end_ids))
    lengths = torch.where(ended.any(1), ended.float().argmax(1) + 1, codes.shape[1])
    return [row[:n] for row, n in zip(codes, lengths.tolist())]


def test_greedy_codes_and_waveform_are_the_stock_generate():
    """Noise 0: the codes the stock talker generation draws greedily after the thinker's greedy replies, and the
    waveform token2wav makes of the first from the same seed, are the policy's from those replies teacher-forced."""
    policy = make_policy(max_new_tokens=6)
    replies, out, waves = stock_generate(policy, policy.model.eval(), 7, talker_do_sample=False)
    for i, (text, stock) in enumerate(zip(TEXTS, stock_codes(policy, out))):
        policy.reply_ids = lambda row, i=i: replies[i]
        batch = policy.rollout([text], 1, seeds=[7], greedy=True)
        codes = batch.extras["completion_codes"][0, :len(stock)]
        assert torch.equal(codes, stock), (codes, stock)
        if i == 0:
            ours = torch.from_numpy(batch.completions[0]["array"])
            assert torch.allclose(ours, waves[0].clamp(-1, 1), atol=1e-6)


def test_logprobs_are_the_stock_talker_generations_processed_scores():
    """Sampling with temperature, top-k, top-p and the repetition penalty: the training forward's log-probs of the
    codes the stock generate drew are the log-softmax of the scores it drew them from."""
    policy = make_policy(temperature=0.7, top_k=12, top_p=0.9, repetition_penalty=1.3)
    replies, out, _ = stock_generate(policy, policy.model.eval(), 3, talker_do_sample=True, talker_temperature=0.7,
                                     talker_top_k=12, talker_top_p=0.9, talker_repetition_penalty=1.3)
    scores = torch.log_softmax(torch.stack(out.scores, 1).float(), -1)  # [2, T, V]
    for i, (text, codes) in enumerate(zip(TEXTS, stock_codes(policy, out))):
        stock = scores[i, :len(codes)].gather(-1, codes[:, None])[:, 0]
        policy.reply_ids = lambda row, i=i: replies[i]
        prefill, stream = policy._states(text)
        prefix = torch.tensor([prefix_codes(policy.model.talker, len(prefill))])
        ended = torch.isin(codes[-1:], torch.tensor(policy.end_ids))
        batch = policy._group_rollout(text, 3, prefix, prefill, stream, codes[None], stock[None],
                                      torch.tensor([len(codes)]), ended, greedy=False)
        with torch.no_grad():
            ours = policy.logprobs(policy.model, batch)[0][0]
        assert (ours - stock).abs().max() < 1e-4, (ours, stock)


def test_processed_logits_are_transformers_logits_processors():
    """The talker's processors at every position of a sequence at once equal transformers' processors applied one
    position at a time on the ids so far (repetition penalty, the start id suppressed, temperature, top-k, top-p)."""
    gen = torch.Generator().manual_seed(0)
    vocab, prefix = 9, torch.tensor([[8, 8, 6, 7]])
    codes = torch.randint(0, 6, (1, 5), generator=gen)
    logits = torch.randn(1, 5, vocab, generator=gen) * 2
    stock = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5), SuppressTokensLogitsProcessor([7]),
                                 TemperatureLogitsWarper(0.8), TopKLogitsWarper(6), TopPLogitsWarper(0.7)])
    ours = processed_logits(logits, seen_ids(prefix, codes, vocab), 7, 1.5, 0.8, 6, 0.7, sampling=True)
    for t in range(5):
        ids = torch.cat([prefix, codes[:, :t]], 1)
        expected = stock(ids, logits[:, t].clone())
        assert torch.equal(torch.isinf(ours[:, t]), torch.isinf(expected))
        finite = torch.isfinite(expected)
        assert torch.allclose(ours[:, t][finite], expected[finite], atol=1e-6)


def test_sampler_logprobs_are_the_training_forwards():
    """Seeded rollouts of two prompts (left-padded to one batch): the log-probs the sampler recorded are the training
    forward's; entropies are those of the truncated distributions."""
    policy = make_policy(top_k=10, max_new_tokens=4)
    batch = policy.rollout(["12", "345"], 3, seeds=[4, 5])
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        training, entropy = policy.logprobs(policy.model, batch, with_entropy=True)
    assert (training - batch.rollout_logp)[mask].abs().max() < 1e-4
    assert (entropy[mask] > 0).all() and (entropy[mask] <= torch.log(torch.tensor(10.0)) + 1e-4).all()


class EndOnThirdToken(torch.nn.Module):
    """A codec head whose logits put all mass on codec end at the third token and none before."""

    def __init__(self, head, end):
        super().__init__()
        self.head, self.end, self.calls = head, end, 0

    def forward(self, hidden):
        self.calls += 1
        return self.head(hidden).index_fill(-1, torch.tensor([self.end]), 1e4 if self.calls == 3 else -1e4)


def test_an_end_token_ends_the_completion_and_is_not_decoded():
    """Codec end drawn third: three units, the two codes before it decoded."""
    policy = make_policy(max_new_tokens=6)
    talker = policy.model.talker
    talker.codec_head = EndOnThirdToken(talker.codec_head, talker.codec_eos_token)
    batch = policy.rollout(["7"], 1, seeds=[0])
    assert batch.unit_mask.tolist() == [[1.0, 1.0, 1.0]] and not batch.truncated.any()
    assert int(batch.extras["completion_codes"][0, 2]) == talker.codec_eos_token
    wave_of_two = policy.decode(batch.extras["completion_codes"][0, :2], 0)
    assert len(batch.completions[0]["array"]) == len(wave_of_two) > 0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_lora_on_the_talker_loads_in_the_stock_class_and_changes_its_greedy_codes(tmp_path):
    """A LoRA step on the talker of a saved tiny Qwen2.5-Omni, the adapter saved: the stock class (its voices read
    from spk_dict.pt) plus PeftModel.from_pretrained scores rollouts as the trained policy does, and its greedy codes
    differ from the base model's."""
    from peft import PeftModel
    base = make_policy()
    base.save_pretrained(base.model, tmp_path / "base")
    target = r".*talker\.model\..*\.(q_proj|v_proj|down_proj)"
    t = Trainer(parse_config({**RECIPE, "policy": {**POLICY, "model": str(tmp_path / "base")}},
                             [f"output_dir={tmp_path / 'run'}", "optim.lora.r=4", "optim.lora.alpha=8",
                              f"optim.lora.target_modules={target}", "optim.lr=0.5"]))
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "talker." in n for n in trainable)
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(Qwen2_5OmniForConditionalGeneration.from_pretrained(tmp_path / "base"),
                                       tmp_path / "adapter").eval()
    plain = Qwen2_5OmniForConditionalGeneration.from_pretrained(tmp_path / "base").eval()
    batch = t.policy.rollout(t.inputs.train_rows[:1], 2, seeds=[3])
    mask = batch.unit_mask.bool()
    with torch.no_grad():
        trained = t.policy.logprobs(t.unwrapped.eval(), batch)[0][mask]
        assert torch.allclose(t.policy.logprobs(loaded, batch)[0][mask], trained, atol=1e-5)
        assert not torch.allclose(t.policy.logprobs(plain, batch)[0][mask], trained, atol=1e-4)
    greedy = {}
    for name, model in (("lora", loaded), ("base", plain)):
        t.policy.model = model.get_base_model() if name == "lora" else model
        greedy[name] = t.policy.rollout(["12"], 1, seeds=[0], greedy=True).extras["completion_codes"]
    assert not torch.equal(greedy["lora"], greedy["base"])


def test_the_recipe_trains_two_steps_on_its_tiny_model(tmp_path):
    """tts_omni_talker.yaml as shipped (GSPO, LoRA on the talker, asr_wer against the words to say), with a tiny random
    Whisper registered as its ASR judge and short completions."""
    import mmrl.rewards.wer as W
    from test_rewards_wer import _tiny_whisper
    from mmrl.config.parse import load_recipe
    from mmrl.config.recipes import resolve_recipe
    W.register_asr_model("tiny-tts-judge", *_tiny_whisper())
    cfg = load_recipe(resolve_recipe("tts_omni_talker"), [
        f"output_dir={tmp_path}", "policy.max_new_tokens=3", "policy.system_prompt=", "optim.prompts_per_step=2",
        "rewards.asr_wer.args.model=tiny-tts-judge", "max_steps=2", "logging.report_to=[none]",
        "logging.progress=false"])
    t = Trainer(cfg)
    assert t.stage.policy.top_p == 0.8 and cfg.algorithm.ratio_level == "sequence"
    trainable = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "talker.model." in n for n in trainable)
    for _ in range(2):
        metrics = t.train_step()
        assert 0.0 <= metrics["reward/asr_wer"] <= 1.0 and torch.isfinite(torch.tensor(metrics["loss"]))


@pytest.mark.parametrize("algorithm", [{"group_size": 3},  # GRPO
                                       {"group_size": 3, "ratio_level": "sequence", "eps_low": 3e-4, "eps_high": 3e-4},
                                       {"group_size": 3, "eps_low": 0.2, "eps_high": 0.28, "aggregation": "token_mean"}],
                         ids=["grpo", "gspo", "dapo"])
def test_every_text_lm_method_trains_a_step(algorithm, tmp_path):
    t = Trainer(parse_config({**RECIPE, "algorithm": algorithm}, [f"output_dir={tmp_path}"]))
    assert torch.isfinite(torch.tensor(t.train_step()["loss"]))


def test_a_model_wrapped_for_distribution_is_refused_by_name():
    from mmrl.errors import UserError

    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    policy = make_policy(max_new_tokens=2)
    batch = policy.rollout(["1"], 2, seeds=[0])
    with pytest.raises(UserError, match="task omni_talker: the model comes wrapped as Wrapper"):
        policy.logprobs(Wrapper(policy.model), batch)


def test_an_unknown_voice_is_refused_by_name():
    from mmrl.errors import UserError
    with pytest.raises(UserError, match="policy.speaker='Ethan' is not a voice of 'tiny:qwen2_5-omni-talker'"):
        make_policy(speaker="Ethan")


def test_a_prompt_that_is_not_text_to_say_is_named():
    check = ADAPTERS.get("omni_talker").prompt_check(ADAPTERS.get("omni_talker").Config(**POLICY))
    assert check("12") is None
    assert check("  ") == "an empty prompt: task omni_talker needs text to say"
    assert check([{"role": "user", "content": "12"}]) == "a list prompt: task omni_talker takes the text to say"
