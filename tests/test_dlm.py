"""The masked diffusion LM adapter: block decoding, seeded groups, the three log-prob estimators
against hand-written references, exact on-policy ratios per pass, streaming, a training step."""

import math
from pathlib import Path

import pytest
import torch
from helpers import assert_grads_close, on_policy_step_changes, streamed_grads
from mmrl.tasks.dlm.estimators import LOGP_ESTIMATORS, EstimatorArgs, EstimatorInputs, view_seed
from mmrl.tasks.dlm.generation import DecodeConfig, block_decode, eos_gamma, transfer_counts
from mmrl.tasks.dlm.config import DLMConfig
from mmrl.tasks.dlm.policy import DLMPolicy

from mmrl.config.parse import parse_config
from mmrl.train.loop.trainer import Trainer

PROMPTS = ["12+34=", "5+6="]


def make_policy(**kw):
    return DLMPolicy(DLMConfig(model="tiny:dlm-char", tiny_args={"hidden": 32, "layers": 1, "heads": 2},
                               **{"gen_length": 8, "block_length": 4, "steps": 4, **kw}))


@pytest.fixture(scope="module")
def policy():
    return make_policy()


def test_tiny_model_attends_both_ways(policy):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    later = ids.clone()
    later[0, -1] = 10
    first = policy.model(input_ids=ids).logits[0, 0]
    assert not torch.allclose(first, policy.model(input_ids=later).logits[0, 0])


def test_transfer_schedules_commit_every_mask():
    assert transfer_counts(10, 4, "uniform") == [3, 3, 2, 2]
    assert transfer_counts(10, 0, "ascending_paper") == [1, 2, 4, 3]
    assert sum(transfer_counts(32, 6, "ascending_paper")) == 32
    for b in range(1, 300):
        assert sum(transfer_counts(b, 0, "ascending")) == b


def cj_grpo_ass_counts(length):
    """CJ-GRPO's get_num_transfer_tokens_ass for one block, written out: S = floor(log2 L) steps,
    2^i tokens at step i, the last step L - (2^(S-1) - 1)."""
    steps = int(math.log2(length))
    return [2 ** i if i < steps - 1 else length - (2 ** i - 1) for i in range(steps)]


def test_ascending_schedule_follows_cj_grpo_code():
    assert transfer_counts(16, 0, "ascending") == [1, 2, 4, 9]  # the code: 4 steps
    assert transfer_counts(16, 0, "ascending_paper") == [1, 2, 4, 8, 1]  # one more forward
    assert transfer_counts(15, 0, "ascending") == [1, 2, 12]
    assert transfer_counts(15, 0, "ascending_paper") == [1, 2, 4, 8]  # the paper's 2^k - 1 case
    assert transfer_counts(1, 0, "ascending") == [1]
    for b in range(2, 300):
        assert transfer_counts(b, 0, "ascending") == cj_grpo_ass_counts(b)


def test_eos_gamma_follows_cj_grpo_code():
    # uniform, 2 blocks of 3 steps (6 in all), g = .4: the code's tau = s / (6 - 1), never 1 in a block
    cfg = DecodeConfig(gen_length=12, block_length=6, steps=6, eos_early_rejection=True)
    assert [eos_gamma(cfg, s, 3) for s in range(3)] == pytest.approx([0.4, 0.4 + 0.6 / 5, 0.4 + 0.6 * 2 / 5])
    linear = DecodeConfig(gen_length=12, block_length=6, steps=6, eos_gamma_rule="block_linear")
    assert [eos_gamma(linear, s, 3) for s in range(3)] == pytest.approx([0.4, 0.7, 1.0])
    # ascending, one block of 16 (S = 4): tau = (2^(s+1) - 1) / 16, geometric
    asc = DecodeConfig(gen_length=16, block_length=16, schedule="ascending", eos_min_gamma=0.2)
    assert [eos_gamma(asc, s, 4) for s in range(4)] == pytest.approx([0.2 + 0.8 * k / 16 for k in (1, 3, 7, 15)])
    assert eos_gamma(DecodeConfig(steps=1, gen_length=4, block_length=4), 0, 1) == 1.0  # a single step
    with pytest.raises(ValueError, match="policy.eos_gamma_rule"):
        DecodeConfig(eos_gamma_rule="late").check()


@pytest.mark.parametrize("rule,eos_at_second_step", [("cj_grpo", 1), ("block_linear", 2)])
def test_eos_factor_over_several_blocks_reaches_the_decoder(policy, rule, eos_at_second_step):
    eos, other = policy.eos_ids[0], 7

    def confident_eos(x, attention, positions):  # even positions: EOS at p ~ 1, odd: `other` at p ~ 0.6
        logits = torch.full((x.shape[0], len(positions), 40), -10.0)
        logits[:, 0::2, eos] = 3.0
        logits[:, 1::2, other] = 0.9
        logits[:, 1::2, other + 1] = 0.5
        return logits

    seen = []
    cfg = DecodeConfig(gen_length=12, block_length=6, steps=6, temperature=0.0, eos_early_rejection=True,
                       eos_gamma_rule=rule)
    block_decode(lambda x, a, p: (seen.append(x.clone()), confident_eos(x, a, p))[1], torch.tensor([[5, 6]]),
                 torch.ones(1, 2, dtype=torch.long), cfg, policy.mask_id, eos, None, 1)
    # step 0 (gamma .4): two `other`s; step 1 commits 2 of {3 EOS at ~.99 gamma, 1 `other` at ~.6}:
    # the code's gamma .52 puts the `other` first, block_linear's .7 two EOS
    before, after = seen[1][0, 2:8], seen[2][0, 2:8]
    new = after[(before == policy.mask_id) & (after != policy.mask_id)]
    assert int((new == eos).sum()) == eos_at_second_step


@pytest.mark.parametrize("schedule,remasking", [("uniform", "low_confidence"), ("ascending", "random"),
                                                ("ascending_paper", "random")])
def test_decoding_fills_blocks_in_order_and_every_mask(policy, schedule, remasking):
    cfg = DecodeConfig(gen_length=8, block_length=4, steps=4, temperature=1.0, remasking=remasking, schedule=schedule)
    canvases = []

    def recording(x, attention, positions):
        canvases.append((x.clone(), positions.clone()))
        return policy.logits(policy.model, x, attention, positions)

    ids, mask = policy._encode(PROMPTS)
    out = block_decode(recording, ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0), cfg, policy.mask_id,
                       None, seeds=[1, 2], group_size=2)
    plen, m = ids.shape[1], policy.mask_id
    assert not (out == m).any()
    per_block = {"uniform": 2, "ascending": 2, "ascending_paper": 3}[schedule]  # 4 / 2; 1 + 3; 1 + 2 + 1
    assert len(canvases) == 2 * per_block
    for k, (x, positions) in enumerate(canvases):
        block = k // per_block
        assert positions.tolist() == list(range(plen + 4 * block, plen + 4 * block + 4))
        assert not (x[:, plen:plen + 4 * block] == m).any()  # earlier blocks are complete
        assert (x[:, plen + 4 * (block + 1):] == m).all()  # later blocks untouched
    committed = [int((x[:, plen:] != m).sum(1)[0]) for x, _ in canvases] + [8]
    expected = {"uniform": transfer_counts(4, 2, "uniform"), "ascending": [1, 3], "ascending_paper": [1, 2, 1]}[schedule]
    assert [b - a for a, b in zip(committed, committed[1:])] == expected * 2


def test_eos_early_rejection_defers_eos(policy):
    eos, other = policy.eos_ids[0], 7

    def confident_eos(x, attention, positions):  # even positions: EOS at p ~ 0.9, odd: `other` at p ~ 0.6
        logits = torch.full((x.shape[0], len(positions), 40), -10.0)
        logits[:, 0::2, eos] = 3.0
        logits[:, 1::2, other] = 0.9
        logits[:, 1::2, other + 1] = 0.5
        return logits

    ids = torch.tensor([[5, 6]])
    mask = torch.ones_like(ids)
    first_commits = []
    for rejection in (False, True):
        cfg = DecodeConfig(gen_length=4, block_length=4, steps=4, temperature=0.0, eos_early_rejection=rejection)
        seen = []
        block_decode(lambda x, a, p: (seen.append(x.clone()), confident_eos(x, a, p))[1], ids, mask, cfg,  # noqa: B023
                     policy.mask_id, eos, None, 1)
        second = seen[1][0, 2:]
        first_commits.append(int(second[(second != policy.mask_id)][0]))
    assert first_commits == [eos, other]


def test_cfg_combines_conditional_and_unconditional_logits(policy):
    cfg = DecodeConfig(gen_length=2, block_length=2, steps=1, temperature=0.0, cfg_scale=2.0)

    def prompt_aware(x, attention, positions):  # token 3 scores 0.7 when the prompt is visible
        visible = (x[:, 0] != policy.mask_id).float()[:, None]
        logits = torch.zeros(x.shape[0], len(positions), 10)
        logits[..., 3] = 0.7 * visible
        logits[..., 4] = 0.8
        return logits

    # alone, token 4 wins; guided z_u + 3 (z_c - z_u) scores token 3 at 2.1, token 4 at 0.8
    assert prompt_aware(torch.tensor([[5, 9]]), None, torch.tensor([1])).argmax(-1).item() == 4
    out = block_decode(prompt_aware, torch.tensor([[5]]), torch.ones(1, 1, dtype=torch.long), cfg, policy.mask_id,
                       None, None, 1)
    assert out.tolist() == [[3, 3]]


def test_a_group_depends_only_on_its_prompt_and_seed(policy):
    both = policy.rollout(PROMPTS, 3, seeds=[1, 2])
    alone = policy.rollout(PROMPTS[1:], 3, seeds=[2])
    assert torch.equal(both.extras["completion_ids"][3:], alone.extras["completion_ids"])
    assert torch.equal(both.extras["mask_seed"][3:], alone.extras["mask_seed"])
    assert not torch.equal(policy.rollout(PROMPTS[1:], 3, seeds=[3]).extras["completion_ids"],
                           alone.extras["completion_ids"])
    state = torch.random.get_rng_state()
    policy.rollout(PROMPTS, 2, seeds=[4, 5])
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is never used


def _hand_views(policy, batch, name, **args):
    gens = [torch.Generator().manual_seed(view_seed(int(s), int(batch.extras["mask_pass"])))
            for s in batch.extras["mask_seed"]]
    return LOGP_ESTIMATORS.get(name)(EstimatorInputs(
        gens, batch.extras["prompt_mask"], batch.extras["completion_ids"].shape[1], batch.unit_mask.sum(1).long(),
        EstimatorArgs(**args), batch.extras["completion_step"], batch.extras["completion_entropy"]))


@pytest.mark.parametrize("name", ["diffu_grpo", "coupled", "elbo"])
def test_estimators_match_a_plain_masked_forward(name):
    p = make_policy(estimator=name, p_mask=0.5, elbo_points=3)
    batch = p.rollout(PROMPTS, 2, seeds=[1, 2])
    logp, _ = p.logprobs(p.model, batch)
    ex = batch.extras
    ref = torch.zeros_like(logp)
    views = _hand_views(p, batch, name, p_mask=0.5, elbo_points=3)
    for v in views:
        ids = torch.cat([ex["prompt_ids"].masked_fill(v.prompt_masked, p.mask_id),
                         ex["completion_ids"].masked_fill(v.masked, p.mask_id)], 1)
        attention = torch.cat([ex["prompt_mask"], torch.ones_like(ex["completion_ids"])], 1)
        logits = p.model(input_ids=ids, attention_mask=attention,
                         position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits.float()
        lp = torch.log_softmax(logits[:, ex["prompt_ids"].shape[1]:], -1).gather(
            -1, ex["completion_ids"][..., None]).squeeze(-1)
        ref += torch.where(v.masked, v.weight[:, None] * lp, 0.0)
    assert torch.allclose(logp, ref * batch.unit_mask, atol=1e-5)
    if name == "diffu_grpo":
        assert len(views) == 1 and views[0].masked.all() and views[0].prompt_masked.any()
        assert not views[0].prompt_masked[ex["prompt_mask"] == 0].any()  # padding is never "masked"
    if name == "coupled":  # the full view, then complementary views: each token scored once by the pair
        assert len(views) == 3 and views[0].masked.all() and torch.equal(views[0].weight, torch.full((4,), 0.5))
        scored = views[1].masked.int() + views[2].masked.int()
        assert (scored == 1).all()
        t = 1 / (2 * views[1].weight)
        assert ((t >= 0.2) & (t <= 0.8)).all() and torch.allclose(views[2].weight, 1 / (2 * (1 - t)))


def _completion_logps(p, ex, masked):
    """log p(y_u | completion positions `masked` replaced by the mask token), prompt visible."""
    ids = torch.cat([ex["prompt_ids"], ex["completion_ids"].masked_fill(masked, p.mask_id)], 1)
    attention = torch.cat([ex["prompt_mask"], torch.ones_like(ex["completion_ids"])], 1)
    logits = p.model(input_ids=ids, attention_mask=attention,
                     position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits.float()
    return torch.log_softmax(logits[:, ex["prompt_ids"].shape[1]:], -1).gather(
        -1, ex["completion_ids"][..., None]).squeeze(-1)


@pytest.mark.parametrize("full_view", [True, False])
def test_coupled_follows_diffucoder(full_view):
    """DiffuCoder's rule written out: t ~ U(0.2, 0.8) (the row's first draw), view 1 masks the
    tokens whose uniform is < t, view 2 the others; logp = (log p_full + coupled) / 2 with
    coupled = log p_1 / t on view 1's tokens, log p_2 / (1 - t) elsewhere (coupled / 2 alone
    without the full view)."""
    p = make_policy(estimator="coupled", coupled_full_view=full_view)
    batch = p.rollout(PROMPTS, 2, seeds=[1, 2])
    with torch.no_grad():
        logp, _ = p.logprobs(p.model, batch)
        ex = batch.extras
        gens = [torch.Generator().manual_seed(view_seed(int(s), int(ex["mask_pass"]))) for s in ex["mask_seed"]]
        t = torch.stack([0.2 + 0.6 * torch.rand((), generator=g) for g in gens])
        width = ex["completion_ids"].shape[1]
        first = torch.stack([torch.rand(width, generator=g) for g in gens]) < t[:, None]
        coupled = torch.where(first, _completion_logps(p, ex, first) / t[:, None],
                              _completion_logps(p, ex, ~first) / (1 - t[:, None]))
        full = _completion_logps(p, ex, torch.ones_like(first))
        ref = (full + coupled) / 2 if full_view else coupled / 2
    assert torch.allclose(logp, ref * batch.unit_mask, atol=1e-5)
    assert not torch.allclose(full, coupled)  # the two parts differ, so the test tells them apart


@pytest.mark.parametrize("name", ["diffu_grpo", "coupled", "elbo"])
def test_a_fixed_mask_gives_an_on_policy_ratio_of_exactly_one(name):
    p = make_policy(estimator=name)
    batch = p.rollout(PROMPTS, 3, seeds=[1, 2])
    for k in (0, 1):
        view = p.pass_view(batch, k)
        with torch.no_grad():
            old, _ = p.logprobs(p.model, view)
        new, _ = p.logprobs(p.model, view)
        assert torch.equal(torch.exp(new - old), torch.ones_like(new))
    first, _ = p.logprobs(p.model, p.pass_view(batch, 0))
    second, _ = p.logprobs(p.model, p.pass_view(batch, 1))
    assert not torch.allclose(first, second)  # a fresh mask for each update pass


@pytest.mark.parametrize("name", ["diffu_grpo", "coupled", "elbo"])
def test_a_row_scores_the_same_in_any_micro_batch(name):
    p = make_policy(estimator=name)
    batch = p.rollout(PROMPTS, 3, seeds=[1, 2])
    full, _ = p.logprobs(p.model, batch)
    for rows in ([0, 4], [5], [3, 1, 2]):
        part, _ = p.logprobs(p.model, batch.select(rows))
        width = part.shape[1]
        assert torch.allclose(part, full[rows][:, :width], atol=1e-5)


def test_elbo_variance_falls_with_more_time_points():
    p = make_policy(estimator="elbo", gen_length=16, block_length=16, steps=8)
    batch = p.rollout(PROMPTS, 2, seeds=[1, 2])
    variances = {}
    for k in (1, 8):
        p.cfg.elbo_points = k
        with torch.no_grad():
            draws = torch.stack([p.logprobs(p.model, p.pass_view(batch, s))[0].sum(1) for s in range(24)])
        variances[k] = draws.var(dim=0).mean().item()
    assert variances[8] < 0.75 * variances[1]  # measured: 132 vs 250


def test_supervised_loss_is_the_masked_diffusion_loss():
    p = make_policy()
    rows = [{"prompt": "1+2=", "target": "<a>3"}, {"prompt": "12+3=", "target": "15"}]
    state = p.sft_generator.get_state()
    loss = p.supervised_loss(p.model, rows, "target")
    gen = torch.Generator()
    gen.set_state(state)
    t = 1e-3 + (1 - 1e-3) * (torch.tensor([0.0, 1.0]) + torch.rand((), generator=gen)) / 2
    masked = torch.rand(2, 8, generator=gen) < t[:, None]
    total = 0.0
    for i, r in enumerate(rows):
        prompt = p.tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        target = p.tokenizer(r["target"], add_special_tokens=False)["input_ids"]
        target = torch.tensor(target + [p.eos_ids[0]] * (8 - len(target)))
        ids = torch.cat([torch.tensor(prompt), target.masked_fill(masked[i], p.mask_id)])[None]
        lp = torch.log_softmax(p.model(input_ids=ids).logits[0, len(prompt):].float(), -1)
        nll = -lp.gather(-1, target[:, None]).squeeze(-1)
        total += (nll * masked[i]).sum() / (t[i] * 8)
    assert torch.allclose(loss, total / 2, atol=1e-5)


RECIPE = {
    "task": "dlm",
    "policy": {"model": "tiny:dlm-char", "tiny_args": {"hidden": 32, "layers": 1, "heads": 2},
               "gen_length": 8, "block_length": 4, "steps": 4},
    "data": {"name": "arithmetic", "args": {"n_train": 32, "n_eval": 4, "digits": 1}},
    "rewards": {"digit_share": {"weight": 1.0}},
    "algorithm": {"group_size": 4, "mu": 2},
    "optim": {"lr": 1e-3, "prompts_per_step": 3, "micro_batch_size": 12},
    "logging": {"report_to": ["none"], "progress": False},
    "max_steps": 1,
}


@pytest.mark.parametrize("estimator,objective", [("diffu_grpo", "clip"), ("coupled", "clip"), ("elbo", "wd1")])
def test_streaming_and_a_training_step(tmp_path, estimator, objective):
    recipe = dict(RECIPE, reward_modules=[str(Path(__file__).parent / "digit_reward.py")])
    cfg = parse_config(recipe, [f"output_dir={tmp_path}", f"policy.estimator={estimator}",
                                f"algorithm.objective={objective}"])
    t = Trainer(cfg)
    batch = t.prepare_batch(1)
    assert batch.advantages.abs().sum() > 0
    assert_grads_close(*streamed_grads(t, batch, (12, 5)))
    t.optimizer.zero_grad(set_to_none=True)
    # ratio 1: pass 0's old log-probs use pass 0's masks; multi-step decoding is not the estimate (no rollout gap check)
    assert on_policy_step_changes(t, rollout_atol=None)


def test_each_pass_takes_its_ratio_under_its_own_mask(tmp_path):
    recipe = dict(RECIPE, reward_modules=[str(Path(__file__).parent / "digit_reward.py")])
    t = Trainer(parse_config(recipe, [f"output_dir={tmp_path}", "algorithm.mu=3", "optim.lr=0.0"]))
    batch = t.prepare_batch(1)
    chunks = t.updater.micro_batches(batch)
    seen = []
    original = t.updater.accumulate_gradients

    def spy(b, c, old, ref, with_entropy, **kwargs):
        fresh = t.updater.no_grad_logprobs(b, c, reference=False)
        seen.append((b.rollout.extras["mask_pass"], torch.equal(old, fresh)))
        return original(b, c, old, ref, with_entropy, **kwargs)

    t.updater.accumulate_gradients = spy
    t.updater.update(batch)
    assert chunks and seen == [(0, True), (1, True), (2, True)]  # lr 0: the model never moves


def test_a_saved_policy_reloads_bidirectional(tmp_path, policy):
    policy.save_pretrained(policy.model, tmp_path)
    again = DLMPolicy(DLMConfig(model=str(tmp_path), gen_length=8, block_length=4, steps=4))
    assert again.mask_id == policy.mask_id
    batch = policy.rollout(PROMPTS, 2, seeds=[1, 2])
    with torch.no_grad():
        assert torch.allclose(again.logprobs(again.model, batch)[0], policy.logprobs(policy.model, batch)[0],
                              atol=1e-5)


def test_joined_rollouts_score_as_drawn(policy):
    short, long = policy.rollout(["5+6="], 2, seeds=[1]), policy.rollout(["123+456="], 2, seeds=[2])
    joined = policy.concat([short, long])
    assert joined.extras["prompt_ids"].shape[1] == long.extras["prompt_ids"].shape[1]
    with torch.no_grad():
        both = policy.logprobs(policy.model, joined)[0]
        alone = torch.cat([policy.logprobs(policy.model, short)[0], policy.logprobs(policy.model, long)[0]])
    assert torch.allclose(both, alone, atol=1e-5)
