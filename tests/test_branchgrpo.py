"""BranchGRPO (`policy.branching`): the tree rollout on tiny flow models (shared prefixes computed
once, each leaf the rollout its noise gives), and the tree advantages and depth pruning against
a hand transcription of the authors' functions (Fredreic1849/BranchGRPO,
fastvideo/train_branchgrpo_flux.py) on identical inputs."""

import math
import random
from collections import defaultdict

import pytest
import torch
from mmrl.tasks.diffusion.branching import Branching, edge_owners, node_rewards, pruned_units
from mmrl.tasks.diffusion.config import DiffusionConfig
from mmrl.tasks.diffusion.noise import NOISE_SALT
from mmrl.tasks.diffusion.policy import DiffusionPolicy
from mmrl.tasks.diffusion.samplers import SAMPLERS, gaussian_logprob

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.core.advantages import compute_advantages
from mmrl.core.seeding import derive_seed

SIZE = 32


def make(model, sampler, guided, **kw):
    return DiffusionPolicy(DiffusionConfig(model=model, height=SIZE, width=SIZE, num_steps=4, eval_num_steps=4,
                                           sampler=sampler, noise_level=0.7, classifier_free_guidance=guided, **kw))


def count_rows(model, calls):
    return model.register_forward_hook(
        lambda m, args, kwargs, out: calls.append((kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).shape[0]),
        with_kwargs=True)


@pytest.mark.parametrize("model,sampler,guided", [("tiny:sd3", "flow_sde", True), ("tiny:flux", "dance", False),
                                                  ("tiny:sd3", "cps", False), ("tiny:sd15", "ddim", True)])
def test_tree_rollout_runs_each_node_once_and_each_leaf_follows_its_noise(model, sampler, guided):
    tree = Branching(at=[0, 2], factor=2)
    policy = make(model, sampler, guided, branching=tree)
    calls = []
    hook = count_rows(policy.model, calls)
    try:
        batch = policy.rollout(["red circle", "blue square"], 4, seeds=[5, 6])
    finally:
        hook.remove()
    per_call = 2 if guided else 1  # CFG: one batched call on [uncond, cond]
    # depths 0..3 hold 1, 2, 2, 4 nodes per group: 9 node-steps per group, not 4 x 4
    assert sum(calls) == 2 * 9 * per_call and sum(calls) < 2 * 16 * per_call
    latents, levels = batch.extras["latents"], batch.extras["levels"][0].tolist()
    cond = {k: v for k, v in batch.extras.items() if k.startswith(("pos/", "neg/"))}
    step = SAMPLERS.get(sampler)
    seeds = [5, 6]
    last_noisy = True
    for row in range(8):
        g, j = divmod(row, 4)
        x = latents[row, 0:1]
        for k in range(4):
            width = [1, 2, 2, 4, 4][k + 1]
            first = j - j % (4 // width)  # the leaf whose noise the node after step k took
            gen = torch.Generator().manual_seed(derive_seed(seeds[g], NOISE_SALT, first))
            noise = [torch.randn(x.shape[1:], generator=gen) for _ in range(k + 1)][-1]
            with torch.no_grad():
                v = policy.family.predict(policy.model, x, batch.extras["timesteps"][0, k],
                                          {key: c[row:row + 1] for key, c in cond.items()}, 4.5, guided).float()
            mean, std = step(x.float(), v, levels[k], levels[k + 1], 0.7)
            x = mean + std * noise
            assert torch.allclose(latents[row, k + 1], x[0], rtol=1e-4, atol=1e-4), (row, k)  # float32 batching (thread counts)
            if std > 0:  # (CPS's last step, to sigma 0, is deterministic)
                assert math.isclose(float(batch.rollout_logp[row, k]), float(gaussian_logprob(x, mean, std)),
                                    rel_tol=1e-5, abs_tol=1e-5)
            last_noisy = std > 0 if k == 3 else last_noisy
    # each edge trained once, on the first row under its node; the leaves' own last step too where it drew noise
    owners = [[j % (4 // w) == 0 for w in (2, 2, 4)] + [last_noisy] for j in range(4)]
    assert batch.unit_mask.bool().tolist() == owners * 2


def test_the_first_leaf_is_the_plain_rollout_and_a_scaled_split_keeps_the_sampler_logprob():
    plain = make("tiny:sd3", "flow_sde", True).rollout(["red circle"], 4, seeds=[3])
    policy = make("tiny:sd3", "flow_sde", True, branching=Branching(at=[1, 2]))
    tree = policy.rollout(["red circle"], 4, seeds=[3])
    # (the denoiser runs on fewer rows in the tree: equal up to float32 batching)
    assert torch.allclose(tree.extras["latents"][0], plain.extras["latents"][0], atol=1e-5)
    assert torch.allclose(tree.extras["latents"][:, :2], plain.extras["latents"][:1, :2].expand(4, -1, -1, -1, -1),
                          atol=1e-5)
    assert not torch.allclose(tree.extras["latents"][1:, 2], plain.extras["latents"][1:, 2], atol=1e-3)
    policy.cfg.branching.noise_scale = 4.0
    scaled = policy.rollout(["red circle"], 4, seeds=[3])
    ex = scaled.extras
    assert torch.equal(ex["latents"][:, :2], tree.extras["latents"][:, :2])  # step 0 is no split
    # step 1 splits: the noise is 4x the sampler's, its log-prob still the sampler's Gaussian
    levels = ex["levels"][0].tolist()
    with torch.no_grad():
        cond = {k: v for k, v in ex.items() if k.startswith(("pos/", "neg/"))}
        v = policy.family.predict(policy.model, ex["latents"][:, 1], ex["timesteps"][0, 1], cond, 4.5, True).float()
    mean, std = SAMPLERS.get("flow_sde")(ex["latents"][:, 1].float(), v, levels[1], levels[2], 0.7)
    assert torch.allclose(ex["latents"][:, 2] - mean, 4.0 * (tree.extras["latents"][:, 2] - mean), atol=1e-4)
    assert torch.allclose(scaled.rollout_logp[:, 1], gaussian_logprob(ex["latents"][:, 2], mean, std), atol=1e-5)


# ----- the authors' functions, transcribed (train_branchgrpo_flux.py) -----------------------------
class AuthorsNode:
    def __init__(self, node_id, parent=None, step=0):
        self.node_id, self.parent, self.children, self.step = node_id, parent, [], step
        self.reward = self.advantage = None
        self.depth = 0 if parent is None else parent.depth + 1

    def is_leaf(self):
        return not self.children

    def get_all_leaf_descendants(self):
        if self.is_leaf():
            return [self]
        return [leaf for c in self.children for leaf in c.get_all_leaf_descendants()]


def authors_tree(steps, split_points, factor):
    """run_tree_sample_step's tree: every node one child per step, `factor` at a split point."""
    root = AuthorsNode("root")
    current = [root]
    for i in range(steps):
        new = []
        for node in current:
            for s in range(factor if i in split_points else 1):
                child = AuthorsNode(f"{node.node_id}_{i}_{s}", node, step=i + 1)
                node.children.append(child)
                new.append(child)
        current = new
    return root, current


def authors_node_rewards(root, leaf_rewards, leaf_nodes):
    """compute_node_rewards_from_leaves, use_prob_weighted=False."""
    for i, leaf in enumerate(leaf_nodes):
        leaf.reward = leaf_rewards[i]
    all_nodes = []

    def collect(node):
        all_nodes.append(node)
        for c in node.children:
            collect(c)
    collect(root)
    max_depth = max(n.depth for n in all_nodes)
    by_depth = {d: [] for d in range(max_depth + 1)}
    for n in all_nodes:
        by_depth[n.depth].append(n)
    for depth in reversed(range(max_depth)):
        for node in by_depth[depth]:
            if not node.is_leaf():
                node.reward = torch.stack([leaf.reward for leaf in node.get_all_leaf_descendants()]).mean()
    return all_nodes, by_depth


def authors_advantages(by_depth):
    """compute_hierarchical_advantages_by_depth."""
    out = {}
    for nodes in by_depth.values():
        if len(nodes) <= 1:
            for node in nodes:
                out[node.node_id] = torch.tensor(0.0)
        else:
            rewards = torch.stack([n.reward for n in nodes])
            std = rewards.std()
            adv = torch.zeros_like(rewards) if std < 1e-6 else (rewards - rewards.mean()) / (std + 1e-8)
            for i, node in enumerate(nodes):
                out[node.node_id] = adv[i]
    return out


def authors_edges(root, advantages):
    """collect_all_transitions: (parent step, child id, child depth, advantage) per edge."""
    edges = []

    def walk(node):
        for child in node.children:
            edges.append((node.step, child, child.depth, advantages[child.node_id]))
            walk(child)
    walk(root)
    return edges


def test_tree_advantages_match_the_authors_on_random_trees():
    rng = random.Random(0)
    algo = AlgorithmConfig(estimator="grpo", std="group", eps=1e-8)
    cases, worst = 0, 0.0
    for _ in range(60):
        steps = rng.randint(3, 10)
        factor = rng.choice([2, 2, 3])
        at = sorted(rng.sample(range(steps), rng.randint(1, min(3, steps))))
        group, groups = factor ** len(at), rng.randint(1, 3)
        leaf_rewards = torch.tensor([rng.choice([rng.random(), 0.5]) for _ in range(group * groups)],
                                    dtype=torch.float64)
        branching = Branching(at=at, factor=factor)
        ours = compute_advantages({"r": node_rewards(leaf_rewards, branching, group, steps)}, {"r": 1.0},
                                  torch.arange(groups).repeat_interleave(group), algo).advantages
        for g in range(groups):  # the authors build and normalise one tree per prompt
            root, leaves = authors_tree(steps, at, factor)
            _, by_depth = authors_node_rewards(root, leaf_rewards[g * group:(g + 1) * group], leaves)
            seen = torch.zeros(group, steps, dtype=torch.bool)
            for k, child, depth, adv in authors_edges(root, authors_advantages(by_depth)):
                assert depth == k + 1
                row = leaves.index(child.get_all_leaf_descendants()[0])  # the edge's first leaf
                worst = max(worst, abs(float(ours[g * group + row, k]) - float(adv)))
                seen[row, k] = True
                cases += 1
            assert (ours[g * group:(g + 1) * group][~seen] == 0).all()  # the rows sharing an edge
    print(f"tree advantages: {cases} edges, largest difference {worst:.2e}")
    assert cases > 2000 and worst < 1e-6, (cases, worst)


def test_every_edge_is_trained_once_as_the_authors_collect_transitions():
    """The trained units of a tree rollout are the authors' transitions (collect_all_transitions:
    every edge of the tree, the leaves' own last steps included), each on the first leaf under its
    child node; train_last_step: false leaves the last step out. Their published tree (20 steps
    split at 0, 3, 6, 9) has 218 edges, 16 of them the last step's."""
    root, _ = authors_tree(20, [0, 3, 6, 9], 2)
    edges = authors_edges(root, defaultdict(float))
    assert len(edges) == 218 and sum(k == 19 for k, *_ in edges) == 16
    assert int(edge_owners(Branching(at=[0, 3, 6, 9]), 16, 1, 20).sum()) == 218
    policy = make("tiny:flux", "dance", False, branching=Branching(at=[0, 2], factor=2))
    batch = policy.rollout(["red circle"], 4, seeds=[5])
    root, leaves = authors_tree(4, [0, 2], 2)
    theirs = torch.zeros(4, 4, dtype=torch.bool)
    for k, child, _, _ in authors_edges(root, defaultdict(float)):
        theirs[leaves.index(child.get_all_leaf_descendants()[0]), k] = True
    assert int(theirs.sum()) == 2 + 2 + 4 + 4 and torch.equal(batch.unit_mask.bool(), theirs)
    policy.cfg.branching.train_last_step = False
    untrained = policy.rollout(["red circle"], 4, seeds=[5])
    assert torch.equal(untrained.unit_mask.bool(), theirs & (torch.arange(4) < 3))


def authors_pruned_depths(depth_pruning, split_points, current_step, slide, interval, stop_depth=None):
    """train_one_step_tree's depth-pruning window."""
    base = sorted(depth_pruning)
    active = base
    if slide:
        stop = max(split_points) if split_points else 0
        if stop_depth is not None:
            stop = stop_depth
        shift = min(max(0, int(current_step // max(1, interval))), max(0, base[0] - stop))
        active = [d - shift for d in base]
    return set(active)


def test_depth_pruning_matches_the_authors_window():
    rng = random.Random(1)
    cases = 0
    for _ in range(200):
        steps = 20
        at = sorted(rng.sample(range(12), 4))
        first = rng.randint(1, 17)
        depths = list(range(first, first + rng.randint(1, 3)))
        slide_every = rng.choice([0, 1, 5, 30])
        stop = rng.choice([None, rng.randint(0, 12)])
        branching = Branching(at=at, depth_pruning=depths, prune_slide_every=slide_every, prune_stop_depth=stop)
        for step in (0, 3, 29, 30, 95, 400):
            theirs = authors_pruned_depths(depths, at, step, slide_every > 0, slide_every, stop)
            assert pruned_units(branching, step, steps).tolist() == [k + 1 in theirs for k in range(steps)]
            cases += 1
    assert cases == 1200


def test_a_pruned_depth_is_not_trained_and_settings_are_checked():
    policy = make("tiny:sd3", "flow_sde", False, branching=Branching(at=[0], depth_pruning=[2, 3]))
    batch = policy.rollout(["red circle"], 2, seeds=[1])
    # the split at step 0 gives each row its own edges: depths 2 and 3 pruned, the last step (depth 4) trained
    assert batch.unit_mask.bool().tolist() == [[True, False, False, True], [True, False, False, True]]
    with pytest.raises(ValueError, match="algorithm.group_size=4: policy.branching gives 2 \\*\\* 1"):
        policy.rollout(["red circle"], 4, seeds=[1])
    with pytest.raises(ValueError, match="policy.branching.at=\\[4\\]"):
        make("tiny:sd3", "flow_sde", False, branching=Branching(at=[4]))
    with pytest.raises(ValueError, match="policy.branching.factor=1"):
        Branching(at=[0], factor=1)
    from mmrl.tasks.diffusion.schedule import StepSchedule
    ode_split = make("tiny:sd3", "flow_sde", False, branching=Branching(at=[0]),
                     schedule=StepSchedule("window", start=1, size=2))
    with pytest.raises(ValueError, match="every split step must be a stochastic"):
        ode_split.rollout(["red circle"], 2, seeds=[1])


def test_the_plan_names_a_group_size_that_is_not_the_trees_before_loading(tmp_path):
    from mmrl.config.parse import ConfigError, load_recipe
    from mmrl.registry import RECIPES
    from mmrl.train.plan.validate import validate
    cfg = load_recipe(RECIPES.get("t2i_branchgrpo"), [f"output_dir={tmp_path}", "algorithm.group_size=8",
                                                      "policy.branching.at=[0,7]"])
    with pytest.raises(ConfigError) as err:
        validate(cfg, 1)
    assert "algorithm.group_size=8: policy.branching gives 2 ** 2 = 4 leaves" in str(err.value)
    assert "policy.branching.at=[0, 7]: a split step must be < policy.num_steps=6" in str(err.value)


def test_the_recipe_trains_a_step_on_tree_advantages(tmp_path):
    from mmrl.config.parse import load_recipe
    from mmrl.registry import RECIPES
    from mmrl.train.loop.trainer import Trainer
    cfg = load_recipe(RECIPES.get("t2i_branchgrpo"), [f"output_dir={tmp_path}", "optim.prompts_per_step=1",
                                                      "max_steps=1", "logging.progress=false",
                                                      "logging.report_to=[none]"])
    trainer = Trainer(cfg)
    batch = trainer.prepare_batch(1)
    tree = cfg.policy["branching"]
    assert batch.advantages.shape == (2 ** len(tree["at"]), cfg.policy["num_steps"])
    shared = ~edge_owners(Branching(**tree), 2 ** len(tree["at"]), 1, cfg.policy["num_steps"])
    assert (batch.advantages[shared] == 0).all() and (batch.advantages[~shared] != 0).any()
    metrics = trainer.train_step()
    assert metrics["ratio_max_dev"] == 0.0 and math.isfinite(metrics["loss"])
