"""Asynchronous rollouts (docs/async.md): each row's weights version and the staleness statistics,
the decoupled (proximal) objective against hand-written references."""

import math

import pytest
import torch
from helpers import TINY_RECIPE

from mmrl.config.algorithm import AlgorithmConfig
from mmrl.config.parse import parse_config
from mmrl.core.objectives import policy_loss
from mmrl.core.rollout import Rollout, staleness_metrics
from mmrl.core.rollout_correction import importance_weights
from mmrl.train.trainer import Trainer


def trainer(tmp_path, *overrides):
    return Trainer(parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", *overrides]))


def test_staleness_metrics_against_hand_counts():
    metrics = staleness_metrics(torch.tensor([3, 2, 2, 0]), 3)  # 0, 1, 1, 3 steps behind
    assert metrics == {"rollout/staleness_mean": 1.25, "rollout/staleness_max": 3.0}
    assert staleness_metrics(torch.zeros(0, dtype=torch.long), 3) == {}


def test_the_version_is_kept_through_select_and_concat():
    def rollout(version):
        r = Rollout(torch.tensor([0, 0]), ["p", "p"], ["a", "b"], torch.ones(2, 3))
        r.stamp_version(version)
        return r
    both = Rollout.concat([rollout(4), rollout(7)])
    assert both.weights_version.tolist() == [4, 4, 7, 7]
    assert both.select([3, 0]).weights_version.tolist() == [7, 4]


def test_every_row_carries_the_weights_it_was_drawn_by_and_the_step_logs_staleness(tmp_path):
    t = trainer(tmp_path)
    metrics = t.train_step()
    assert metrics["rollout/staleness_mean"] == metrics["rollout/staleness_max"] == 0.0
    batch = t.prepare_batch(2)  # drawn by the weights after one update
    assert batch.rollout.weights_version.tolist() == [1] * len(batch.rollout)
    assert batch.metrics["rollout/staleness_max"] == 0.0
