"""Served rollouts (`policy.rollout_engine: hf_server`, docs/distributed.md#served-rollouts): the rollout
record through the wire bit for bit, the server's protocol (weights versions, the staleness floor, the
newest weights first, requests it does not know), the client's requests moved off a server that stops
answering, and a served run at staleness 0 that is the synchronous run."""

import json
import time

import pytest
import torch
from helpers import TINY_RECIPE
from PIL import Image
from rollout_servers import ThreadServer, thread_servers

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.policy import Policy
from mmrl.core.rollout import Rollout
from mmrl.serving.rollout_client import RolloutServerError, ServedRollouts
from mmrl.serving.rollout_server import RolloutEngine, build_server_policy
from mmrl.serving.rollout_wire import decode_rollout, encode_rollout, read_request, rollout_request
from mmrl.serving.server_directory import ServerSlot, address_file, slot_name
from mmrl.serving.weights_push import WeightsPush
from mmrl.serving.wire import dumps
from mmrl.train.loop.trainer import Trainer
from mmrl.train.placement.placed_servers import server_commands
from mmrl.train.plan.validate import validate


def a_rollout() -> Rollout:
    """Every kind of value an adapter puts in a record: tensors of each dtype (bfloat16 and float64
    included), a list of per-row tensors, images, ints, a tuple, None fields and auxiliary rows."""
    gen = torch.Generator().manual_seed(0)
    r = Rollout(torch.tensor([0, 0, 1, 1]), ["p", "p", "q", "q"],
                [Image.new("RGB", (3, 2), (i * 40, 2, 3)) for i in range(4)], torch.ones(4, 3),
                columns={"completion_ids": [[1, 2], [3], [], [4]]},
                extras={"latents": torch.randn(4, 2, 3, generator=gen).to(torch.bfloat16),
                        "levels": torch.rand(4, 3, generator=gen, dtype=torch.float64),
                        "pixel_values": [torch.randn(i + 1, 5, generator=gen) for i in range(4)],
                        "mask_pass": 3, "shape": (2, 3), "stochastic": torch.tensor([True, False, True, True])},
                truncated=torch.tensor([False, True, False, False]), auxiliary=torch.tensor([False, False, False, True]),
                rollout_logp=torch.randn(4, 3, generator=gen))
    r.stamp_version(7)
    return r


def assert_same_value(a, b, where):
    if isinstance(a, Image.Image):  # decoded as a PNG file's image
        assert isinstance(b, Image.Image) and a.mode == b.mode and a.tobytes() == b.tobytes(), where
        return
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b)):
            assert_same_value(x, y, f"{where}[{k}]")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_value(a[k], b[k], f"{where}[{k!r}]")
    else:
        assert a == b, where


def test_a_rollout_travels_bit_for_bit():
    sent = a_rollout()
    got = decode_rollout(json.loads(dumps(encode_rollout(sent))))
    for name in ("group_id", "prompts", "completions", "unit_mask", "columns", "extras", "truncated", "auxiliary",
                 "rollout_logp", "weights_version"):
        assert_same_value(getattr(sent, name), getattr(got, name), name)
    assert got.weights_version.tolist() == [7] * 4


def test_what_cannot_travel_is_named():
    r = a_rollout()
    r.extras["schedule"] = object()
    with pytest.raises(TypeError, match=r"the rollout's extras\['schedule'\] cannot travel"):
        encode_rollout(r)


def test_a_request_reads_back_and_a_bad_one_is_refused():
    rows = [{"prompt": "1+2", "image": Image.new("L", (2, 2), 9), "boxes": (1, 2)}, {"prompt": "3+4"}]
    key, got, group_size, seeds, floor = read_request(json.loads(dumps(rollout_request((3, 0, 8), rows, 4, [11, 12], 2))))
    assert (key, group_size, seeds, floor) == ((3, 0, 8), 4, [11, 12], 2)
    assert_same_value(rows, got, "rows")
    body = rollout_request((3, 0, 8), rows, 4, [11], 2)
    with pytest.raises(ValueError, match="2 rows for 1 seeds"):
        read_request(json.loads(dumps(body)))


class ScaleCounter(Policy):
    """A one-weight policy whose completion is the weight its rollout saw (which weights drew it), and
    the group's seed; it counts its rollouts."""

    Config = dict

    def __init__(self):
        self.model = torch.nn.Linear(1, 1, bias=False)
        self.calls = 0

    def rollout(self, prompts, group_size, seeds, greedy=False):
        self.calls += 1
        rows = len(prompts) * group_size
        weight = float(self.model.weight.item())
        return Rollout(torch.arange(len(prompts)).repeat_interleave(group_size), [p for p in prompts for _ in range(group_size)],
                       [f"{weight:g}/{s}" for s in seeds for _ in range(group_size)], torch.ones(rows, 1))

    def pop_metrics(self):
        return {"calls": 1.0}

    def logprobs(self, model, batch, units=slice(None), with_entropy=False):
        raise NotImplementedError


def set_weight(model, value):
    with torch.no_grad():
        model.weight.fill_(value)


def test_a_request_waits_for_the_weights_its_step_may_be_drawn_by(tmp_path):
    """Nothing is drawn before the first weights; a request whose floor is newer than the server's weights
    waits for them; a transfer sent before a request is received before it is drawn."""
    trainer_model = torch.nn.Linear(1, 1, bias=False)
    slot_file = address_file(tmp_path, "rollout-0")
    with thread_servers([RolloutEngine(ScaleCounter(), "127.0.0.1")], [slot_file]) as (server,):
        slot = ServerSlot.placed(tmp_path, "rollout-0")
        push = WeightsPush([slot], trainer_model, "127.0.0.1")
        client = ServedRollouts([slot], max_behind=0, timeout_s=60, push=push)
        client.ask((1, 0, 0), ["a"], 2, [5])  # step 1: the weights after 0 updates
        time.sleep(1.0)
        assert server.engine.policy.calls == 0  # no weights yet: nothing drawn
        set_weight(trainer_model, 2.0)
        client.send_weights(trainer_model, 0)
        first, _ = client.take_scored((1, 0, 0), ["a"], 2, [5])
        assert first.completions == ["2/5", "2/5"] and first.weights_version.tolist() == [0, 0]
        client.ask((3, 0, 0), ["b"], 2, [6])  # step 3 needs the weights after 2 updates
        set_weight(trainer_model, 3.0)
        client.send_weights(trainer_model, 1)
        time.sleep(1.0)
        assert server.engine.policy.calls == 1  # version 1 < 2: still waiting
        set_weight(trainer_model, 4.0)
        client.send_weights(trainer_model, 2)
        third, _ = client.take_scored((3, 0, 0), ["b"], 2, [6])
        assert third.completions == ["4/6", "4/6"] and third.weights_version.tolist() == [2, 2]
        assert client.pop_metrics() == {"calls": 2.0}
        client.stop()


def test_requests_of_a_server_that_stops_answering_go_to_the_others_with_their_seeds(tmp_path):
    """Two servers, one stopped with a request in flight: the request is asked again of the other, with its
    seeds; a server started again in the dead one's place is connected, sent the latest weights, and
    serves again; a request the restarted server does not know is asked again."""
    trainer_model = torch.nn.Linear(1, 1, bias=False)
    files = [address_file(tmp_path, slot_name("rollout", i)) for i in range(2)]
    slots = [ServerSlot.placed(tmp_path, slot_name("rollout", i)) for i in range(2)]
    first, second = ThreadServer(RolloutEngine(ScaleCounter(), "127.0.0.1"), files[0]), \
        ThreadServer(RolloutEngine(ScaleCounter(), "127.0.0.1"), files[1])
    push = WeightsPush(slots, trainer_model, "127.0.0.1")
    client = ServedRollouts(slots, max_behind=0, timeout_s=60, push=push)
    try:
        set_weight(trainer_model, 1.0)
        client.send_weights(trainer_model, 4)
        client.ask((5, 0, 0), ["a"], 1, [10])
        client.ask((5, 0, 1), ["b"], 1, [11])  # one request on each server
        assert sorted(client.where.values()) == [0, 1]
        gone = client.where[(5, 0, 0)]
        [first, second][gone].stop()
        rollout, _ = client.take_scored((5, 0, 0), ["a"], 1, [10])
        assert rollout.completions == ["1/10"]  # drawn by the other server, from the same seed
        assert client.take_scored((5, 0, 1), ["b"], 1, [11])[0].completions == ["1/11"]
        back = ThreadServer(RolloutEngine(ScaleCounter(), "127.0.0.1"), files[gone])
        deadline = time.monotonic() + 30
        while gone not in push.versions() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert back.engine.version == 4  # connected by the push's watch and sent the latest weights
        client.servers[gone].checked = 0.0
        client.servers[1 - gone].in_flight = {(9, 9, 9)} | client.servers[1 - gone].in_flight  # make it the busier one
        client.ask((5, 1, 0), ["c"], 1, [12])
        assert client.where[(5, 1, 0)] == gone
        back.engine.answers.clear()
        back.engine.asked.clear()  # the request forgotten, as by a restart: 404, asked again
        assert client.take_scored((5, 1, 0), ["c"], 1, [12])[0].completions == ["1/12"]
    finally:
        client.stop()
        for server in (first, second):
            server.stop()


def test_a_failed_generation_stops_the_run_naming_the_server(tmp_path):
    class Failing(ScaleCounter):
        def rollout(self, prompts, group_size, seeds, greedy=False):
            raise ValueError("no such image: x.png")
    model = torch.nn.Linear(1, 1, bias=False)
    with thread_servers([RolloutEngine(Failing(), "127.0.0.1")]) as (server,):
        slot = ServerSlot("rollout-0", url=server.url)
        client = ServedRollouts([slot], 0, 60, WeightsPush([slot], model, "127.0.0.1"))
        client.send_weights(model, 0)
        with pytest.raises(RolloutServerError, match=r"rollout-0 .* failed on step 1's prompt groups from 0: HTTP 500: "
                                                     r"ValueError: no such image: x.png"):
            client.take_scored((1, 0, 0), ["a"], 1, [1])
        client.stop()


def run(tmp_path, name, *overrides, recipe=TINY_RECIPE, steps=3):
    out = tmp_path / name
    t = Trainer(parse_config(recipe, [f"output_dir={out}", f"max_steps={steps}", *overrides]))
    t.train()
    return t, [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.slow)])  # async: 10 s
def test_a_served_run_at_staleness_0_is_the_synchronous_run(tmp_path, mode):
    """Two servers building the policy from the recipe, the trainer pushing its weights after each update:
    the same rollouts (lengths, rewards), losses and weights as the trainer generating itself."""
    cfg = parse_config(TINY_RECIPE, [f"output_dir={tmp_path}/x"])
    sync, sync_lines = run(tmp_path, "sync")
    with thread_servers([RolloutEngine(build_server_policy(cfg), "127.0.0.1") for _ in range(2)]) as servers:
        urls = ",".join(s.url for s in servers)
        served, served_lines = run(tmp_path, "served", "policy.rollout_engine=hf_server", f"rollout.servers=[{urls}]",
                                   f"rollout.mode={mode}", "rollout.max_staleness=0")
        assert all(s.engine.version == 3 for s in servers)  # each was pushed every update's weights
    for a, b in zip(sync_lines, served_lines, strict=True):
        for key in ("reward_mean", "completion_length", "loss"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
        assert b["rollout/staleness_max"] == 0.0
    for (name, p), q in zip(sync.unwrapped.named_parameters(), served.unwrapped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6), name


@pytest.mark.parametrize("overrides, said", [
    (["placement.rollout=2"], "policy.rollout_engine is not a served engine"),
    (["policy.rollout_engine=hf_server"], "policy.rollout_engine=hf_server needs rollout servers"),
    (["policy.rollout_engine=hf_server", "placement.rollout=1", "rollout.servers=[http://a:1]"], "give one"),
    (["policy.rollout_engine=hf_server", "placement.rollout=1", "optim.lora.r=4"], "the servers take whole weights"),
    (["policy.rollout_engine=hf_server", "placement.rollout=1", "scoring.where=worker"], "the rollout servers do not score"),
    (["policy.rollout_engine=hf_server", "placement.rollout=1", "distributed.strategy=fsdp"], "use distributed.strategy=ddp"),
    (["placement.reward=1", "placement.rewards=[nope]"], "placement.rewards: 'nope' is not one of the rewards"),
    (["placement.rewards=[accuracy]"], "placement.reward is 0"),
    (["placement.trainer=2"], "placement.trainer=2 but 1 trainer process(es) joined"),
    (["placement.gpus={learner: 1}"], "placement.gpus: 'learner' is not a role"),
])
def test_placements_that_cannot_work_are_refused_before_anything_loads(overrides, said, no_model):
    with pytest.raises(ConfigError) as e:
        validate(parse_config(TINY_RECIPE, overrides))
    assert said in str(e.value)


def test_each_placed_server_is_started_with_the_run_recipe_and_its_address_file(tmp_path):
    cfg = parse_config(TINY_RECIPE, [f"output_dir={tmp_path}", "policy.rollout_engine=hf_server",
                                     "placement.rollout=2", "placement.reward=1", "placement.rewards=[accuracy]"])
    commands = server_commands(cfg, "r.yaml", ["seed=3"])
    assert list(commands) == ["rollout-0", "rollout-1", "reward-accuracy-0"]
    assert commands["rollout-1"][3:7] == ["serve-rollout", "r.yaml", "seed=3", "--host"]
    assert commands["rollout-1"][-1] == str(tmp_path / "servers" / "rollout-1.json")
    reward = commands["reward-accuracy-0"]
    assert reward[3:7] == ["serve-reward", "accuracy", "--reward-module", TINY_RECIPE["reward_modules"][0]]
    assert reward[-1] == str(tmp_path / "servers" / "reward-accuracy-0.json")
