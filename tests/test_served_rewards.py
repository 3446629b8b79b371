"""Rewards served elsewhere (mmrl/serving/): `mmrl serve-reward` gives the values the reward gives in
process; the transport's timeouts, bounded retries, skip and stop; record and replay; a run that
launches its server; a run whose server dies stops, saves, and resumes to the uninterrupted run's
weights. Every server is a real HTTP server in a subprocess (tests/served.py)."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import torch
import yaml
from helpers import TINY_RECIPE
from PIL import Image
from safetensors.torch import load_file
from served import HERE, fault_command, free_port, running, serve_command

from mmrl.config.remote import ClientSettings, ServerLaunch
from mmrl.config.sections import RewardSpec
from mmrl.core.scoring import bind_reward, compute_rewards, get_reward
from mmrl.errors import UserError
from mmrl.registry import import_user_module, load_plugins
from mmrl.serving.launch import LaunchedServers
from mmrl.serving.remote_reward import RemoteReward, RemoteRewardError, served_reward
from mmrl.serving.transport import Transport

DIGITS = str(HERE / "digit_reward.py")
PROMPTS = ["1+1=", "2+2=", "3+1=", "4+4=", "1+2=", "2+5="]
COMPLETIONS = ["<answer>2</answer>", "5", "x<answer>4</answer>", "8 ", "<answer>3</answer>", "7x"]


@pytest.fixture(scope="module", autouse=True)
def plugins():
    load_plugins()
    import_user_module(DIGITS, "reward_modules")
    import_user_module(str(HERE / "image_reward.py"), "reward_modules")


@pytest.fixture(scope="module")
def digit_server():
    port = free_port()
    with running(serve_command("digit_share", port, "--reward-module", DIGITS), port) as (url, process):
        yield url, port
    assert process.returncode == 0  # SIGTERM: a clean shutdown


def remote(name, urls, **client):
    return RemoteReward(name, get_reward(name), Transport(urls, ClientSettings(**client)), {})


def test_served_rewards_give_the_in_process_values(digit_server):
    """A built-in reward with a column binding, and a user's reward over two urls: the same values,
    in requests of 2 rows."""
    port = free_port()
    columns = {"solution": ["2", "4", "4", "8", "3", "7"], "group_id": [0, 0, 1, 1, 2, 2]}
    faults_port = free_port()
    with running(serve_command("accuracy", port), port) as (url, _), \
            running(fault_command("die_after:1000", faults_port), faults_port) as (other, _):
        served = {"accuracy": served_reward("accuracy", RewardSpec(url=url, columns={"answer": "solution"},
                                                                   client=ClientSettings(batch_size=2))),
                  "digit_share": served_reward("digit_share", RewardSpec(url=[digit_server[0], other], client=ClientSettings(
                      batch_size=2, concurrency=3)))}
        local = {"accuracy": bind_reward("accuracy", None, {"answer": "solution"}),
                 "digit_share": bind_reward("digit_share")}
        got = compute_rewards(served, PROMPTS, COMPLETIONS, columns)
        want = compute_rewards(local, PROMPTS, COMPLETIONS, columns)
        with urllib.request.urlopen(other + "/count") as r:
            assert json.load(r)["score"] in (1, 2)  # the second url got its share of the 3 requests
    assert want["accuracy"].sum() > 0 and len(set(want["digit_share"].tolist())) > 2
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_an_image_reward_gets_the_images_it_gets_in_process():
    images = [Image.fromarray(np.full((4, 4, 3), v, dtype=np.uint8)) for v in (0, 100, 255)]
    port = free_port()
    with running(serve_command("mean_red", port, "--reward-module", str(HERE / "image_reward.py")), port) as (url, _):
        assert remote("mean_red", [url])(["a", "b", "c"], images) == get_reward("mean_red")(["a", "b", "c"], images)


@pytest.mark.parametrize("mode", ["hang", "error500"])
def test_a_failing_server_is_retried_a_bounded_number_of_times_then_stops(mode):
    port = free_port()
    with running(fault_command(mode, port), port) as (url, _):
        reward = remote("digit_share", [url], timeout_s=0.5, retries=2, backoff_s=0.05,
                        retry_statuses=[500, 503])
        started = time.monotonic()
        with pytest.raises(RemoteRewardError) as e:
            reward(PROMPTS, COMPLETIONS, group_id=[0, 0, 1, 1, 2, 2])
        assert time.monotonic() - started < 5
        with urllib.request.urlopen(url + "/count") as r:
            assert json.load(r)["score"] == 3  # the first try and two retries
    status = "timed out after 0.5s" if mode == "hang" else "HTTP 500"
    assert f"{url}/score answered" in str(e.value) and status in str(e.value)
    assert "after 3 attempts for rows 0-5 of 6 (prompt groups 0-2)" in str(e.value)


def test_skip_leaves_the_failed_rows_without_the_reward():
    port = free_port()
    counts = {}
    with running(fault_command("error500", port), port) as (url, _):
        reward = remote("digit_share", [url], retries=0, on_failure="skip", batch_size=4)
        values = compute_rewards({"digit_share": reward}, PROMPTS, COMPLETIONS, {}, counts)["digit_share"]
    assert values.isnan().all()
    assert counts == {"reward/digit_share/sent_rows": 6.0, "reward/digit_share/failed_rows": 6.0}


@pytest.mark.parametrize("mode,said", [("wrong_length", "answered 5 values for a request of 6 rows"),
                                       ("nan", "answered nan for row 0")])
def test_a_reply_that_is_not_a_reward_is_an_error_naming_the_server(mode, said):
    port = free_port()
    with running(fault_command(mode, port), port) as (url, _):
        with pytest.raises(RemoteRewardError, match=f"{url}/score {said}"):
            remote("digit_share", [url], on_failure="skip")(PROMPTS, COMPLETIONS)


def test_record_then_replay_without_the_server(digit_server, tmp_path):
    record = tmp_path / "answers.jsonl"
    settings = ClientSettings(batch_size=4)
    recorded = RemoteReward("digit_share", get_reward("digit_share"),
                            Transport([digit_server[0]], settings, record=str(record)), {})(PROMPTS, COMPLETIONS)
    replay = RemoteReward("digit_share", get_reward("digit_share"), Transport([], settings, replay=str(record)), {})
    assert replay(PROMPTS, COMPLETIONS) == recorded == get_reward("digit_share")(PROMPTS, COMPLETIONS)
    assert len(record.read_text().splitlines()) == 2
    with pytest.raises(RemoteRewardError, match="has no recorded answer for rows 4-5 of 6"):
        replay(PROMPTS, [*COMPLETIONS[:4], "other", "7x"])


def test_a_launched_server_that_is_not_ready_stops_with_its_log(tmp_path):
    port = free_port()
    spec = type("Spec", (), {"url": f"http://127.0.0.1:{port}",
                             "server": ServerLaunch(command="echo loading the judge; sleep 30", timeout_s=1.0)})
    started = time.monotonic()
    with pytest.raises(UserError, match=r"not ready at .*/health within 1s .*loading the judge"):
        LaunchedServers({"judge": spec}, tmp_path, is_main=True)
    assert time.monotonic() - started < 5


def train(recipe, out, *extra):
    cmd = [sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={out}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def served_recipe(tmp_path, name, url, **spec):
    cfg = dict(TINY_RECIPE, max_steps=3, rewards={"accuracy": {"weight": 1.0},
                                                   "digit_share": {"weight": 1.0, "url": url, **spec}})
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(yaml.safe_dump(cfg))
    return recipe


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """The tiny recipe's uninterrupted 3-step run, every reward in process."""
    tmp = tmp_path_factory.mktemp("served")
    recipe = tmp / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(dict(TINY_RECIPE, max_steps=3)))
    done = train(recipe, tmp / "whole")
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "whole"


def final_weights(out):
    return load_file(out / "checkpoints" / "step-000003" / "model" / "model.safetensors")


@pytest.mark.slow  # 19 s in the default run on 2 cores (2026-11-29); the default run stays under 15 min
def test_a_run_whose_server_dies_stops_saves_and_resumes_exactly(whole_run, tmp_path):
    port = free_port()
    recipe = served_recipe(tmp_path, "served", f"http://127.0.0.1:{port}",
                           client={"retries": 1, "backoff_s": 0.1})
    with running(fault_command("die_after:2", port), port):  # answers steps 1 and 2, dies in step 3
        stopped = train(recipe, tmp_path / "run")
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mmrl: error: reward 'digit_share': http://127.0.0.1:{port}/score answered a "
                           "connection error"), last
    assert "rows 0-15 of 16" in last and "checkpoints/step-000002" in last and "resume=true" in last
    with running(fault_command("die_after:1000", port), port):  # the server is back
        resumed = train(recipe, tmp_path / "run", "resume=true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want, got = final_weights(whole_run), final_weights(tmp_path / "run")
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_a_run_launches_its_server_and_skips_what_fails(tmp_path):
    """rewards.NAME.server starts the server before the first step and stops it with the run, here
    stopped by SIGTERM in step 1; with on_failure skip a server answering 500 leaves the step
    trained on the other reward."""
    port = free_port()
    command = " ".join(fault_command("error500", port))
    recipe = served_recipe(tmp_path, "launched", f"http://127.0.0.1:{port}", server={"command": command},
                           client={"retries": 0, "on_failure": "skip"})
    cfg = yaml.safe_load(recipe.read_text())
    cfg["rewards"]["killer"] = {"weight": 0.0}  # sends the run SIGTERM in step 1 (tests/kill_reward.py)
    cfg["reward_modules"].append(str(HERE / "kill_reward.py"))
    recipe.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "MMRL_TEST_KILL_AT": "1", "MMRL_TEST_KILL_SIGNAL": "SIGTERM"}
    done = subprocess.run([sys.executable, "-m", "mmrl", "train", str(recipe), f"output_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 128 + 15, done.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step-000001").is_dir()
    metrics = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward/digit_share/failed_frac"] == 1.0 and "reward/accuracy" in metrics
    assert (tmp_path / "run" / "servers" / "digit_share.log").exists()
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)


def test_remote_settings_that_cannot_work_are_refused_before_anything_loads():
    from mmrl.config.parse import ConfigError, parse_config
    from mmrl.train.plan.validate import validate
    rewards = {"accuracy": {"weight": 1.0},
               "digit_share": {"record": "a.jsonl", "replay": "a.jsonl", "client": {"batch_size": 0},
                               "server": {"command": "mmrl serve-reward digit_share"}}}
    with pytest.raises(ConfigError) as e:
        validate(parse_config(dict(TINY_RECIPE, rewards=rewards)))
    said = str(e.value)
    assert "rewards.digit_share.client.batch_size=0 must be >= 1" in said
    assert "rewards.digit_share: record and replay are both set" in said
    assert "rewards.digit_share.server needs rewards.digit_share.url" in said


def test_serve_reward_refuses_an_argument_the_reward_does_not_take(capsys):
    from mmrl.cli.main import main
    assert main(["serve-reward", "digit_share", "--reward-module", DIGITS, "--device", "cpu"]) == 2
    assert "mmrl serve-reward digit_share: the reward takes no argument 'device' (--device)" in capsys.readouterr().err
    assert main(["serve-reward", "no_such_reward"]) == 2
    assert "no_such_reward" in capsys.readouterr().err


def test_a_resumed_run_may_move_its_reward_server(tmp_path):
    from mmrl.train.safety.run_dir import resume_config_changes
    saved = {"rewards": {"my.py:fn": {"url": "http://a:1", "client": {"timeout_s": 5},
                                      "columns": {"url": "link"}, "weight": 1.0}}}
    (tmp_path / "config.json").write_text(json.dumps(saved))
    moved = {"rewards": {"my.py:fn": {"url": ["http://b:1", "http://c:1"], "client": {"timeout_s": 9},
                                      "columns": {"url": "link"}, "weight": 1.0}}}
    assert resume_config_changes(tmp_path, moved, "refuse") == {}
    moved["rewards"]["my.py:fn"]["columns"]["url"] = "other"  # a column named url is what the reward computes
    assert list(resume_config_changes(tmp_path, moved, "allow")) == ["rewards.my.py:fn.columns.url"]


def test_the_cache_answers_a_request_it_has_seen():
    port = free_port()
    with running(fault_command("die_after:1000", port), port) as (url, _):
        for cache in (True, False):
            reward = remote("digit_share", [url], cache=cache)
            assert reward(PROMPTS, COMPLETIONS) == reward(PROMPTS, COMPLETIONS)
        with urllib.request.urlopen(url + "/count") as r:
            assert json.load(r)["score"] == 1 + 2  # once with the cache, twice without


def test_a_launched_server_ends_when_its_run_is_killed(tmp_path):
    """A run killed outright (SIGKILL, or a second Ctrl-C) cannot stop its server: the kernel does."""
    port = free_port()
    command = " ".join(fault_command("die_after:1000", port))
    script = (f"import time; from mmrl.config.remote import ServerLaunch; from mmrl.serving.launch import LaunchedServers\n"
              f"spec = type('S', (), {{'url': 'http://127.0.0.1:{port}', 'server': ServerLaunch(command={command!r})}})\n"
              f"LaunchedServers({{'r': spec}}, {str(tmp_path)!r}, True); print('ready', flush=True); time.sleep(60)")
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert run.stdout.readline().strip() == "ready"
    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    run.kill()
    run.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            time.sleep(0.2)
        except OSError:
            return
    pytest.fail("the server outlived its killed run")


def test_a_group_reward_is_served_whole_groups_at_a_time():
    """win_rate compares the rows of a prompt group: requests of at most 5 rows hold whole groups of
    3 (one group each), and the server calls the reward per group, as the engine does in process."""
    prefer = {"prefer": f"{HERE / 'length_preference.py'}:longer"}
    columns = {"group_id": [0, 0, 0, 1, 1, 1]}
    port = free_port()
    with running(serve_command("win_rate", port), port) as (url, _):
        served = RemoteReward("win_rate", get_reward("win_rate"), Transport([url], ClientSettings(batch_size=5)),
                              prefer)
        got = compute_rewards({"win_rate": served}, PROMPTS, COMPLETIONS, columns)["win_rate"]
    want = compute_rewards({"win_rate": bind_reward("win_rate", prefer)}, PROMPTS, COMPLETIONS, columns)["win_rate"]
    assert len(set(want.tolist())) > 3 and torch.equal(got, want)


def test_a_placed_reward_server_that_dies_is_waited_for_at_its_new_address(tmp_path):
    """A placed server is found where it announced itself; when it stops answering, the request waits until
    a server announces itself in its place (a restart, here on another port), without spending a retry."""
    import threading

    import uvicorn

    from mmrl.serving.app_runner import bound_socket
    from mmrl.serving.server_app import reward_app
    from mmrl.serving.server_directory import ServerSlot, announce

    def start():
        sock = bound_socket("127.0.0.1", 0)
        server = uvicorn.Server(uvicorn.Config(reward_app("digit_share", get_reward("digit_share")), log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        announce(tmp_path / "reward-digit_share-0.json", f"http://127.0.0.1:{sock.getsockname()[1]}")
        return server, thread

    slot = ServerSlot.placed(tmp_path.parent, "x")
    slot.path = tmp_path / "reward-digit_share-0.json"
    reward = served_reward("digit_share", RewardSpec(client=ClientSettings(retries=0, cache=False)), [slot], wait_s=60)
    expected = get_reward("digit_share")(PROMPTS, COMPLETIONS)
    server, thread = start()
    assert reward(PROMPTS, COMPLETIONS) == expected
    server.should_exit = True
    thread.join()
    restarted = []
    threading.Timer(1.5, lambda: restarted.append(start())).start()
    assert reward(PROMPTS, COMPLETIONS) == expected  # waited for the new server (retries=0: no retry was spent)
    assert restarted
    restarted[0][0].should_exit = True
    restarted[0][1].join()
    with pytest.raises(UserError, match=r"server x did not answer within 1s; see its log .*x\.log"):
        served_reward("digit_share", RewardSpec(client=ClientSettings(retries=0, cache=False)), [slot], wait_s=1)(
            PROMPTS, COMPLETIONS)
def test_serve_reward_on_a_taken_port_says_so_in_one_line_and_never_claims_to_serve(capfd):
    """The port is bound before anything is printed: a busy one is one line naming it, exit code 2."""
    import socket

    from mmrl.cli.main import main
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve-reward", "digit_share", "--reward-module", DIGITS, "--port", str(port)]) == 2
    out, err = capfd.readouterr()
    assert " on http" not in out + err
    assert err.strip().count("\n") == 0, err
    assert err.startswith(f"mmrl: error: mmrl serve-reward: cannot listen on 127.0.0.1:{port} (")
    assert f"another server holds port {port}" in err


def test_url_and_replay_together_are_refused_naming_both(tmp_path):
    from mmrl.config.parse import ConfigError, parse_config
    from mmrl.train.plan.validate import validate
    rewards = {"accuracy": {"weight": 1.0}, "digit_share": {"url": "http://127.0.0.1:8002", "replay": "answers.jsonl"}}
    with pytest.raises(ConfigError, match=r"^rewards.digit_share.url and rewards.digit_share.replay are both set"):
        validate(parse_config(dict(TINY_RECIPE, rewards=rewards)))
