"""Several distillation teachers (`algorithm.distill.teachers`, `teacher_column`): each row scored by
the teacher its data column names, against each teacher's divergence on the whole batch computed
apart; the routing itself against a hand-written join; a teacher served by `mmrl serve-teacher`
against the same teacher in process; the recipe and data errors that name the field, row and value
before any model loads."""

import json
import random
import sys
import threading
import time

import pytest
import torch
import uvicorn
from helpers import TINY_RECIPE, tiny_overrides
from served import free_port, running

from mmrl.config.parse import ConfigError, parse_config
from mmrl.core.rollout import Rollout
from mmrl.data.validate import DataError
from mmrl.errors import UserError
from mmrl.serving.app_runner import bound_socket
from mmrl.serving.rollout_server import build_server_policy
from mmrl.serving.teacher_server import teacher_app
from mmrl.train.loop.teachers import Teachers
from mmrl.train.loop.trainer import Trainer
from mmrl.tasks.demos.synthetic.text_tasks import arithmetic_rows


def teacher(seed):
    return f"{{model: 'tiny:qwen2-char', tiny_args: {{hidden: 32, layers: 1, heads: 2, seed: {seed}}}}}"


def routed_recipe(tmp_path, *extra, sources=("add", "sub")):
    """Sums and differences, each row's teacher named by its `source` column."""
    rows = arithmetic_rows(24, 1, random.Random(0), ops="+-")
    for row in rows:
        row["source"] = sources[0] if "+" in row["prompt"] else sources[1]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = {**TINY_RECIPE, "data": {"path": str(path)}}
    return parse_config(recipe, tiny_overrides(tmp_path / "out") + [
        f"algorithm.distill.teachers={{add: {teacher(1)}, sub: {teacher(0)}}}",
        "algorithm.distill.teacher_column=source", *extra])


def test_each_row_is_scored_by_the_teacher_its_column_names(tmp_path):
    """add: a Qwen2 of another seed; sub: the student's own seed (zero signal on its rows)."""
    t = Trainer(routed_recipe(tmp_path, "optim.micro_batch_size=3"))
    batch = t.prepare_batch(1)
    d = t.updater.teacher_divergence(batch, t.updater.micro_batches(batch))
    r, mask = batch.rollout, batch.rollout.unit_mask.bool()
    add = torch.tensor([s == "add" for s in r.columns["source"]])
    assert add.any() and (~add).any()
    teachers = t.updater.teachers.modules
    with torch.no_grad():
        student = t.policy.logprobs(t.model, r)[0]
        by_add, by_sub = (student - t.policy.logprobs(teachers[n], r)[0] for n in ("add", "sub"))
    rows_add, rows_sub = mask & add[:, None], mask & ~add[:, None]
    assert torch.allclose(d[rows_add], by_add[rows_add], atol=1e-5)
    assert torch.allclose(d[rows_sub], by_sub[rows_sub], atol=1e-5)
    assert by_sub[rows_sub].abs().max() < 1e-5 < by_add[rows_add].abs().max()  # the two teachers differ
    assert not torch.allclose(d[rows_sub], by_add[rows_sub], atol=1e-5)  # a sub row by add's teacher differs


def test_a_routed_loss_form_step_trains(tmp_path):
    t = Trainer(routed_recipe(tmp_path, "algorithm.distill.divergence=jsd", "algorithm.distill.form=loss"))
    before = {n: p.detach().clone() for n, p in t.unwrapped.named_parameters()}
    assert t.train_step()["distill_loss_divergence"] > 1e-4
    assert any(not torch.equal(before[n], p) for n, p in t.unwrapped.named_parameters())


def fake_batch(names):
    n = len(names)
    return Rollout(group_id=torch.arange(n), prompts=[""] * n, completions=[""] * n, unit_mask=torch.ones(n, 2),
                   columns={"source": list(names)}, extras={"row": torch.arange(n)})


def test_routing_joins_each_teachers_rows_in_order_and_keeps_processes_in_step():
    """score(teacher, rows) = teacher's number x 10 + the row's index: the join puts each row's own
    teacher's value in its place; in step, a teacher with no rows still runs once (on the first row)."""
    calls = []

    def score(teacher, rows):
        calls.append((teacher.number, rows.extras["row"].tolist()))
        return (teacher.number * 10 + rows.extras["row"].float())[:, None].expand(-1, 2).requires_grad_()

    modules = {name: torch.nn.Module() for name in ("a", "b", "c")}
    for number, module in enumerate(modules.values(), 1):
        module.number = number
    teachers = Teachers(modules, "source")
    out = teachers.routed(fake_batch(["b", "a", "b"]), score, in_step=False)
    assert out[:, 0].tolist() == [20.0, 11.0, 22.0] and calls == [(1, [1]), (2, [0, 2])]
    calls.clear()
    out = teachers.routed(fake_batch(["b", "a", "b"]), score, in_step=True)
    assert out[:, 0].tolist() == [20.0, 11.0, 22.0] and calls == [(1, [1]), (2, [0, 2]), (3, [0])]
    assert out.requires_grad  # the idle teacher's pass is in the graph, at zero


@pytest.mark.parametrize("overrides,message", [
    ([f"algorithm.distill.teachers={{a: {teacher(1)}, b: {teacher(2)}}}"], "set algorithm.distill.teacher_column"),
    ([f"algorithm.distill.teacher={teacher(1)}", f"algorithm.distill.teachers={{a: {teacher(1)}}}"], "not both"),
    ([f"algorithm.distill.teacher={teacher(1)}", "algorithm.distill.teacher_column=source"], "none are named"),
    (["algorithm.distill.teachers={a: {modle: x}, b: {model: x}}", "algorithm.distill.teacher_column=source"],
     "algorithm.distill.teachers.a.modle"),
    (["algorithm.distill.teachers={a: {model: ./nowhere}}"], r"algorithm.distill.teachers.a.model: local path"),
])
def test_teachers_recipe_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path) + overrides))


def test_a_row_naming_no_teacher_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    import mmrl.train.loop.parts as parts
    monkeypatch.setattr(parts, "build_parts", lambda *a: pytest.fail("a model was built"))
    with pytest.raises(DataError, match=r"column 'source'.*names no teacher .*\['add', 'sub'\].*'mul'"):
        Trainer(routed_recipe(tmp_path, sources=("add", "mul")))


def served_against_in_process(tmp_path, url):
    """The divergence of a student's rollouts from the teacher at `url` against the same teacher (the
    tiny Qwen2 of seed 1) built in process; a step trains with the served one."""
    served = Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "served") + [
        f"algorithm.distill.teacher={{url: '{url}'}}", "optim.micro_batch_size=3"]))
    batch = served.prepare_batch(1)
    d = served.updater.teacher_divergence(batch, served.updater.micro_batches(batch))
    assert served.train_step()["distill_divergence"] != 0
    local = Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path / "local") + [
        f"algorithm.distill.teacher={teacher(1)}", "optim.micro_batch_size=3"]))
    want = local.updater.teacher_divergence(batch, local.updater.micro_batches(batch))
    mask = batch.rollout.unit_mask.bool()
    assert want[mask].abs().max() > 1e-3 and torch.allclose(d[mask], want[mask], atol=1e-5)


def test_a_teacher_app_gives_the_in_process_teachers_divergence(tmp_path):
    """The teacher server's app (uvicorn, in a thread of this process) with the teacher's policy."""
    policy = build_server_policy(parse_config(TINY_RECIPE, ["policy.tiny_args.seed=1"]), "cpu")
    sock = bound_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(teacher_app(policy, "test"), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        served_against_in_process(tmp_path, f"http://127.0.0.1:{sock.getsockname()[1]}")
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.mark.slow  # ~25 s: the server's process imports torch and transformers
def test_mmrl_serve_teacher_gives_the_in_process_teachers_divergence(tmp_path):
    """`mmrl serve-teacher` (a real server in a subprocess) with the teacher's recipe."""
    recipe = tmp_path / "teacher.yaml"
    recipe.write_text(json.dumps(TINY_RECIPE))
    port = free_port()
    command = [sys.executable, "-m", "mmrl", "serve-teacher", str(recipe), "policy.tiny_args.seed=1", "--port", str(port)]
    with running(command, port) as (url, _):
        served_against_in_process(tmp_path, url)


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.distill.teacher={url: 'http://127.0.0.1:1'}", "algorithm.distill.divergence=jsd"],
     "divergence='jsd' needs the teacher's model in this process"),
    (["algorithm.distill.teacher={url: 'localhost:80'}"], r"algorithm.distill.teacher.url='localhost:80'"),
    (["algorithm.distill.teacher={url: 'http://127.0.0.1:1', model: x}"], "a served teacher is its url alone"),
])
def test_served_teacher_recipe_errors_name_the_field(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path) + overrides))


def test_a_teacher_server_that_does_not_answer_is_named(tmp_path, monkeypatch):
    """Named before any model loads (the student's included)."""
    import mmrl.train.loop.parts as parts
    monkeypatch.setattr(parts, "build_policy", lambda *a: pytest.fail("a model was built"))
    with pytest.raises(UserError, match=r"algorithm.distill.teachers.far.url: no teacher server answers at "
                                        r"http://127.0.0.1:\d+ \(start one with `mmrl serve-teacher"):
        Trainer(parse_config(TINY_RECIPE, tiny_overrides(tmp_path) + [
            f"algorithm.distill.teachers={{far: {{url: 'http://127.0.0.1:{free_port()}'}}}}"]))
