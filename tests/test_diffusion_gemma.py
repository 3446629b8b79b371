"""DiffusionGemma as a `dlm` family: the sampler is transformers' `generate` draw for draw, the two
estimators against references written with the stock forward, images through the vision tower,
LoRA that loads in the stock class with PEFT, and a step from its recipe."""

from pathlib import Path

import pytest
import torch

from helpers import on_policy_step_changes

from mmrl.config.parse import load_recipe, parse_config
from mmrl.registry import RECIPES
from mmrl.tasks.dlm.block_diffusion import BlockDiffusionConfig, CanvasStopping, entropy_bound_accept
from mmrl.tasks.dlm.block_diffusion_sampler import end_block, sample_block_diffusion
from mmrl.tasks.dlm.block_diffusion_scoring import block_canvas
from mmrl.tasks.dlm.config import DLMConfig, config_problems
from mmrl.tasks.dlm.policy import DLMPolicy
from mmrl.train.loop.trainer import Trainer

DIGIT_REWARD = str(Path(__file__).parent / "digit_reward.py")


def make_policy(**kw):
    return DLMPolicy(DLMConfig(**{"family": "diffusion_gemma", "model": "tiny:diffusion-gemma", "estimator": "final_step",
                                  "p_mask": 0.0, "gen_length": 16, "denoising_steps": 4, **kw}))


@pytest.fixture(scope="module")
def policy():
    return make_policy()


def red_square():
    from PIL import Image
    return Image.new("RGB", (32, 48), (200, 20, 20))


@pytest.mark.parametrize("steps,confidence", [(3, 0.005), (6, 0.005), (6, 5.0)])
def test_the_sampler_is_generates_draw_for_draw(policy, steps, confidence):
    """One group drawn from seed s is `generate` after torch.manual_seed(s) (on CPU): same canvases,
    acceptances and renoising; a loose confidence threshold makes rows stop early."""
    model, tok = policy.model.eval(), policy.tokenizer
    ids = tok(["12+34=", "12+34=", "12+34="], return_tensors="pt")["input_ids"]
    cfg = BlockDiffusionConfig(denoising_steps=steps, confidence_threshold=confidence)
    torch.manual_seed(11)
    stock = model.generate(ids, max_new_tokens=16, max_denoising_steps=steps, confidence_threshold=confidence,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).sequences[:, ids.shape[1]:]
    mine = sample_block_diffusion(model, ids, torch.ones_like(ids), {}, cfg, 2, [tok.eos_token_id],
                                  tok.pad_token_id, seeds=[11], group_size=3)
    assert torch.equal(mine.completion_ids[:, :stock.shape[1]], stock)


def test_the_sampler_reads_images_as_generate_does(policy):
    model, proc = policy.model.eval(), policy.processor
    chat = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "c?"}]}],
                                    tokenize=False, add_generation_prompt=True)
    enc = proc(text=[chat, chat], images=[[red_square()], [red_square()]], return_tensors="pt")
    media = {k: enc[k] for k in ("pixel_values", "image_position_ids", "mm_token_type_ids")}
    torch.manual_seed(5)
    stock = model.generate(enc["input_ids"], attention_mask=enc["attention_mask"], max_new_tokens=8,
                           max_denoising_steps=3, **media).sequences[:, enc["input_ids"].shape[1]:]
    cfg = BlockDiffusionConfig(denoising_steps=3)
    tok = policy.tokenizer
    mine = sample_block_diffusion(model, enc["input_ids"], enc["attention_mask"], media, cfg, 1, [tok.eos_token_id],
                                  tok.pad_token_id, seeds=[5], group_size=2)
    blind = sample_block_diffusion(model, enc["input_ids"], enc["attention_mask"], {}, cfg, 1, [tok.eos_token_id],
                                   tok.pad_token_id, seeds=[5], group_size=2)
    assert torch.equal(mine.completion_ids, stock)
    assert not torch.allclose(mine.logp, blind.logp)  # the image's features reach the canvas


def test_acceptance_stopping_and_block_ends_follow_generate():
    logits = torch.log(torch.tensor([[[0.98, 0.01, 0.01], [0.4, 0.3, 0.3], [0.9, 0.05, 0.05], [0.5, 0.5, 0.0]]]))
    entropy = torch.distributions.Categorical(logits=logits).entropy()[0]
    # sorted entropies 0.112, 0.394, 0.693, 1.089: the cumulative sums minus the last are 0, 0.112, 0.506, ...
    assert entropy.argsort().tolist() == [0, 2, 3, 1]
    assert entropy_bound_accept(entropy[None], 0.2).tolist() == [[True, False, True, False]]
    assert entropy_bound_accept(entropy[None], 0.01).tolist() == [[True, False, False, False]]  # the first is always taken
    stop = CanvasStopping(1, confidence=10.0)
    canvas = torch.tensor([[1, 2, 3, 4]])
    assert stop(canvas, logits).tolist() == [False]  # no history yet
    assert stop(canvas, logits).tolist() == [True]
    assert not CanvasStopping(0, confidence=0.1)(canvas, logits).item()  # mean entropy 0.57 > 0.1
    tokens, ended = end_block(torch.tensor([[5, 1, 6, 1], [5, 6, 7, 8], [1, 2, 3, 4]]), torch.tensor([False, False, True]),
                              [1], pad_id=0)
    assert tokens.tolist() == [[5, 1, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0]] and ended.tolist() == [True, False, True]


def record_decoder_calls(model, monkeypatch) -> list:
    """Each decoder forward's canvas and self-conditioning logits, as stock `generate` passes them
    (it calls `self.forward`)."""
    calls, forward = [], model.forward

    def recording(**kwargs):
        sc = kwargs.get("self_conditioning_logits")
        calls.append((kwargs["decoder_input_ids"].clone(), None if sc is None else sc.clone()))
        return forward(**kwargs)
    monkeypatch.setattr(model, "forward", recording)
    return calls


def test_final_step_is_the_last_steps_probability_of_the_kept_token(policy, monkeypatch):
    """Reference: `generate`'s own last decoder call (its canvas and the self-conditioning LOGITS it
    passed), re-run through the stock forward with the prompt encoded by the model itself; the token
    kept is that step's argmax and its log-prob log softmax(z / T)."""
    model, tok = policy.model.eval(), policy.tokenizer
    batch = policy.rollout(["7+8="], 2, seeds=[3])
    ids = batch.extras["prompt_ids"][:1]
    calls = record_decoder_calls(model, monkeypatch)
    torch.manual_seed(3)
    stock = model.generate(ids.expand(2, -1), max_new_tokens=8, max_denoising_steps=4,
                           eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).sequences[:, ids.shape[1]:]
    monkeypatch.undo()
    canvas, sc = calls[-1]
    with torch.no_grad():
        logits = model(input_ids=ids.expand(2, -1), decoder_input_ids=canvas, self_conditioning_logits=sc).logits
        temperature = 0.4 + 0.4 * 1 / 4  # the last step: one step left of 4
        reference = torch.log_softmax(logits / temperature, -1).gather(-1, stock[:, :8, None]).squeeze(-1)
        mine = policy.logprobs(policy.model, batch)[0][:, :8]
    assert torch.equal(batch.extras["completion_ids"][:, :8], stock[:, :8])
    mask = batch.unit_mask[:, :8].bool()
    assert torch.allclose(mine[mask], reference[mask], atol=1e-5)
    assert torch.allclose(batch.rollout_logp[:, :8][mask], reference[mask], atol=1e-5)


def test_diffu_grpo_scores_a_fully_noised_block_without_self_conditioning(policy):
    p = make_policy(estimator="diffu_grpo", gen_length=8)
    batch = p.rollout(["7+8="], 2, seeds=[4])
    noise = block_canvas("diffu_grpo", batch.extras, 0, len(p.tokenizer), torch.device("cpu"))
    assert not torch.equal(noise, block_canvas("diffu_grpo", {**batch.extras, "mask_pass": 1}, 0, len(p.tokenizer),
                                               torch.device("cpu")))  # redrawn each pass
    with torch.no_grad():
        logits = p.model(input_ids=batch.extras["prompt_ids"], decoder_input_ids=noise).logits
        reference = torch.log_softmax(logits, -1).gather(-1, batch.extras["completion_ids"][..., None]).squeeze(-1)
        mine = p.logprobs(p.model, batch)[0]
    mask = batch.unit_mask.bool()
    assert torch.allclose(mine[mask], reference[mask], atol=1e-5)


def test_a_vision_reasoner_rollout_scores_its_images(policy):
    rows = [{"prompt": "colour?", "image": red_square()}, {"prompt": "sum: 1+2="}]
    batch = policy.rollout(rows, 2, seeds=[1, 2])
    assert [len(v) for v in batch.extras["pixel_values"]] == [1, 1, 0, 0]
    with torch.no_grad():
        lp = policy.logprobs(policy.model, batch)[0]
    mask = batch.unit_mask.bool()
    assert torch.allclose(lp[mask], batch.rollout_logp[mask], atol=1e-5)
    blind = policy.rollout([{"prompt": "colour?"}], 2, seeds=[1])
    assert not torch.allclose(blind.rollout_logp[:, :4], batch.rollout_logp[:2, :4])


def test_masked_estimators_and_prompt_masking_are_refused_before_loading():
    cfg = DLMConfig(family="diffusion_gemma", model="x", estimator="coupled", p_mask=0.1)
    problems = config_problems(cfg)
    assert problems[0].startswith("policy.estimator='coupled': family diffusion_gemma takes final_step or diffu_grpo")
    assert problems[1].startswith("policy.p_mask=0.1: family diffusion_gemma")
    with pytest.raises(ValueError, match="multiple of the model's canvas_length"):
        make_policy(gen_length=12)


RECIPE = {"task": "dlm", "policy": {"family": "diffusion_gemma", "model": "tiny:diffusion-gemma",
                                    "estimator": "final_step", "p_mask": 0.0, "gen_length": 8, "denoising_steps": 3},
          "data": {"name": "arithmetic", "args": {"n_train": 8, "n_eval": 2, "digits": 1}},
          "rewards": {"digit_share": {"weight": 1.0}}, "reward_modules": [DIGIT_REWARD],
          "algorithm": {"group_size": 4}, "optim": {"lr": 1e-2, "prompts_per_step": 2},
          "logging": {"report_to": ["none"], "progress": False}, "max_steps": 1, "seed": 0}


def test_lora_loads_in_the_stock_class_with_peft(tmp_path):
    """The base saved, a LoRA step trained on it, the adapter saved: DiffusionGemmaForBlockDiffusion
    plus PeftModel.from_pretrained gives the trained policy's logits, not the base's."""
    from peft import PeftModel
    from transformers import DiffusionGemmaForBlockDiffusion
    base = make_policy()
    base.save_pretrained(base.model, tmp_path / "base")
    t = Trainer(parse_config({**RECIPE, "policy": {**RECIPE["policy"], "model": str(tmp_path / "base")}},
                             [f"output_dir={tmp_path / 'run'}", "optim.lora.r=4", "optim.lora.alpha=8",
                              "optim.lr=0.05"]))
    t.train_step()
    t.policy.save_pretrained(t.unwrapped, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    loaded = PeftModel.from_pretrained(DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "base"),
                                       tmp_path / "adapter").eval()
    plain = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "base").eval()
    ids, canvas = torch.tensor([[12, 13, 14]]), torch.tensor([[20, 21, 22, 23, 24, 25, 26, 27]])
    with torch.no_grad():
        trained = t.unwrapped.eval()(input_ids=ids, decoder_input_ids=canvas).logits
        assert torch.allclose(loaded(input_ids=ids, decoder_input_ids=canvas).logits, trained, atol=1e-5)
        assert not torch.allclose(plain(input_ids=ids, decoder_input_ids=canvas).logits, trained, atol=1e-3)


def test_a_step_from_the_recipe(tmp_path):
    cfg = load_recipe(RECIPES.get("dlm_diffusion_gemma"))
    assert cfg.policy["family"] == "diffusion_gemma" and cfg.policy["denoising_steps"] == 48
    # the random model earns no accuracy: a reward that varies (the share of digits) gives the step a gradient
    overrides = [f"output_dir={tmp_path}", "max_steps=1", "optim.prompts_per_step=2", "algorithm.group_size=4",
                 "data.args.n_train=4", "data.args.n_eval=2", "logging.report_to=[none]", "logging.progress=false",
                 f"reward_modules=[{DIGIT_REWARD}]", "rewards.digit_share.weight=1.0"]
    t = Trainer(load_recipe(RECIPES.get("dlm_diffusion_gemma"), overrides))
    assert on_policy_step_changes(t)
