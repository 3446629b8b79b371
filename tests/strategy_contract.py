"""The contract every distribution strategy keeps (mmrl/distributed/strategy.py), as one battery of
tests run under one and two gloo processes, as tests/adapter_contract.py does for adapters.

A new strategy opts in with a few lines in `tests/test_strategy_contract.py`:

    class TestMyStrategy(StrategyContract):
        strategy = "my_strategy"

and gets these checks on a tiny two-block model, against plain AdamW on one process:

* one step over micro-batches split between the processes (the trainer's scaling: each process's
  partial sum times the world size) gives the weights and the gradient norm of one whole batch;
* the frozen reference computes what the model computed before training, and takes no step;
* a non-finite gradient is seen (`gradients_finite`), dropped without a step, and the next step is
  the plain one;
* the whole weights `save` writes (the main process's ``model/``) compute what the trained model does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import free_port

HERE = Path(__file__).parent
TOL = 1e-5

CHECK = r'''
import copy, json, sys
from pathlib import Path
import torch
from torch import nn
from mmrl.config.parse import parse_config
from mmrl.distributed import build_strategy
from mmrl.cli.main import exit_without_teardown

ROWS, LR, CLIP = 8, 0.05, 0.5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.lin(x))


class Tiny(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).squeeze(-1)


class Saver:  # what an adapter's save_pretrained does with the whole weights
    def save_pretrained(self, model, path, state_dict=None):
        state = state_dict if state_dict is not None else model.state_dict()
        path.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().float().cpu() for k, v in state.items()}, path / "weights.pt")


def train_step(strategy, model, opt, x, y, chunks, scale=1.0):
    params = [p for p in model.parameters() if p.requires_grad]
    for k, rows in enumerate(chunks):
        last = k == len(chunks) - 1
        with strategy.no_sync(model, last):
            loss = ((model(x[rows]) - y[rows]) ** 2).sum() / ROWS * strategy.acc.num_processes * scale
            strategy.backward(model, loss, last)
    if not strategy.gradients_finite(model, params):
        return False, strategy.drop_gradients(model, opt, params)
    return True, strategy.step(model, opt, params)


def plain_step(model, opt, x, y):
    loss = ((model(x) - y) ** 2).sum() / ROWS
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
    opt.step()
    opt.zero_grad()
    return norm


name, out = sys.argv[1], Path(sys.argv[2])
cfg = parse_config({"distributed": {"strategy": name}, "optim": {"max_grad_norm": CLIP, "lr": LR},
                    "output_dir": str(out)})
torch.manual_seed(0)
model = Tiny()
whole = copy.deepcopy(model)
strategy = build_strategy(cfg)
acc = strategy.accelerator()
model.to(acc.device)
strategy.place(model)
frozen = strategy.frozen(copy.deepcopy(model).eval().requires_grad_(False))
strategy.shard(model)
model, opt = strategy.prepare(model, torch.optim.AdamW([p for p in model.parameters()], lr=LR))
g = torch.Generator().manual_seed(1)
x, y = torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, generator=g)
world, rank = acc.num_processes, acc.process_index
mine = torch.arange(ROWS)[rank * ROWS // world:(rank + 1) * ROWS // world]
chunks = [mine[:2], mine[2:]]  # two micro-batches on every process
with torch.no_grad():
    before = whole(x)
whole_opt = torch.optim.AdamW(whole.parameters(), lr=LR)

finite, norm = train_step(strategy, model, opt, x, y, chunks)
plain_norm = plain_step(whole, whole_opt, x, y)
with torch.no_grad(), strategy.gathered(model, always=True):
    after = model(x)
with torch.no_grad():
    expected, reference = whole(x), frozen(x)
bad_finite, bad_norm = train_step(strategy, model, opt, x, y, chunks, scale=float("inf"))
with torch.no_grad():
    after_drop = model(x)
train_step(strategy, model, opt, x, y, chunks)
plain_step(whole, whole_opt, x, y)
with torch.no_grad():
    second, expected_second = model(x), whole(x)
strategy.save(model, opt, Saver(), out / "checkpoint")
report = {"world": world, "finite": finite, "norm": norm, "plain_norm": plain_norm,
          "step_diff": float((after - expected).abs().max()),
          "reference_diff": float((reference - before).abs().max()),
          "bad_finite": bad_finite, "bad_norm": str(bad_norm),
          "drop_diff": float((after_drop - after).abs().max()),
          "second_step_diff": float((second - expected_second).abs().max())}
if acc.is_main_process:
    saved = Tiny()
    saved.load_state_dict(torch.load(out / "checkpoint" / "model" / "weights.pt"))
    with torch.no_grad():
        report["saved_diff"] = float((saved(x) - expected_second).abs().max())
    print(json.dumps(report))
exit_without_teardown(0)
'''


class StrategyContract:
    strategy: str                    # the registered name under test

    def available(self) -> bool:
        """Whether the strategy can run here (its backend installed)."""
        return True

    @pytest.fixture(scope="class", params=[1, 2], ids=["1 process", "2 processes"])
    @classmethod
    def report(cls, request, tmp_path_factory) -> dict:
        if not cls().available():
            pytest.skip(f"{cls.strategy}: its backend is not installed")
        tmp = tmp_path_factory.mktemp(f"{cls.strategy}-{request.param}")
        script = tmp / "check.py"
        script.write_text(CHECK)
        env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": f"{HERE.parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(request.param),
                    "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
        done = subprocess.run([*launcher, str(script), cls.strategy, str(tmp / "out")], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        report = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][0])
        assert report["world"] == request.param
        return report

    def test_one_step_is_plain_adamw_on_the_whole_batch(self, report):
        assert report["finite"]
        assert report["step_diff"] < TOL
        assert report["norm"] == pytest.approx(report["plain_norm"], rel=1e-4)

    def test_the_reference_is_the_model_before_training(self, report):
        assert report["reference_diff"] < TOL

    def test_a_nonfinite_gradient_is_dropped_without_a_step(self, report):
        assert not report["bad_finite"] and report["bad_norm"] == "nan"
        assert report["drop_diff"] == 0.0
        assert report["second_step_diff"] < TOL  # nothing of the dropped gradient leaked into the next step

    def test_saved_weights_are_the_trained_model(self, report):
        assert report["saved_diff"] < TOL
