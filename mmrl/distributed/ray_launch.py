"""Ray as the run's launcher (`mmrl train RECIPE --ray`, `launch: ray`; docs/distributed.md#several-machines-
with-ray): the only code that knows Ray. It places the run's roles, each process a Ray actor that runs the
role's command (the same `mmrl` commands as without Ray), its output in LOG_DIR/ROLE-INDEX.log:

- the trainer ranks, in one placement group packed on as few machines as fit, with torchrun semantics:
  each rank's actor sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0's machine and a
  free port there) and runs the same SPMD trainer; a rank that dies or fails stops the others (SIGTERM,
  SIGKILL after a grace time) and the run;
- the servers (rollout, reward), each role in a placement group spread over the machines; a server whose
  process dies takes its actor down with it (the actor exits), and Ray starts the actor again, which starts
  the server again (up to `restarts` times), announcing its new address where the trainer finds it.

On an existing cluster (`address`) or a local one. Every machine needs the same Python environment and
sees the run's output directory (a shared file system), as a multi-machine torchrun run does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mmrl.distributed.launcher import NODE_ADDRESS_ENV, PLACED_ENV
from mmrl.errors import UserError

GRACE_S = 15.0  # how long a rank or server may take to stop after SIGTERM
READY_TIMEOUT_S = 120.0  # how long the placement groups may wait for the cluster's resources
# the driver's environment that every role's process gets (a worker on another machine starts without it)
FORWARDED_PREFIXES = ("HF_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_", "MMRL_", "WANDB_", "NCCL_", "GLOO_", "OMP_",
                      "PYTHONPATH", "ACCELERATE_")


@dataclass
class Role:
    """Processes of one kind: `commands[i]` is process i's command line."""

    name: str
    commands: list[list[str]]
    cpus: float = 1.0
    gpus: float | None = None  # None: 1 where the cluster has GPUs, else 0
    ranks: bool = False  # trainer ranks (torchrun semantics); else servers
    restarts: int = 0    # servers: how many times Ray starts a dead one again


@dataclass
class Outcome:
    """How the run ended: every rank's exit code, and the first that failed (its role name, index, log)."""

    codes: list[int] = field(default_factory=list)
    failed: tuple[str, int, Path] | None = None
    why: str = ""


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class RoleProcess:
    """One role's process in a Ray actor: started by `__init__` for a server (watched: its death ends the
    actor, so Ray starts both again), by `run` for a trainer rank."""

    def __init__(self, command: list[str], log: str, env: dict[str, str], cwd: str, server: bool):
        import ray
        self.command, self.log, self.cwd = command, Path(log), cwd
        self.node = ray.util.get_node_ip_address()
        self.env = {**os.environ, **env, NODE_ADDRESS_ENV: self.node, PLACED_ENV: "1"}
        self.child: subprocess.Popen | None = None
        self.stopping = False
        if server:
            self._start({})
            threading.Thread(target=self._end_with_the_child, daemon=True).start()

    def node_and_port(self) -> tuple[str, int, str]:
        """This machine's address, a free port on it, and its Ray node id (rank 0's: the rendezvous)."""
        import ray
        return self.node, free_port(), ray.get_runtime_context().get_node_id()

    def run(self, env: dict[str, str]) -> int:
        """Run the command with `env` added (a trainer rank) to its end; its exit code."""
        self._start(env)
        return self.child.wait()

    def pid(self) -> int | None:
        return None if self.child is None else self.child.pid

    def stop(self, grace: float = GRACE_S) -> None:
        """SIGTERM to the process's group, SIGKILL if it is still there after `grace` seconds."""
        self.stopping = True
        if self.child is None or self.child.poll() is not None:
            return
        try:
            os.killpg(self.child.pid, signal.SIGTERM)
            self.child.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()
        except ProcessLookupError:
            pass

    def _start(self, env: dict[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "a") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} on {self.node}: {' '.join(self.command)}\n")
            out.flush()
            self.child = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
                                          env={**self.env, **env}, start_new_session=True)

    def _end_with_the_child(self) -> None:
        code = self.child.wait()
        if not self.stopping:  # the server died: so does its actor, which Ray starts again
            with open(self.log, "a") as out:
                out.write(f"--- the server exited with code {code}; its actor ends (Ray starts it again)\n")
            os._exit(1)


def _placement_group(role: Role, strategy: str):
    from ray.util.placement_group import placement_group
    bundle = {"CPU": role.cpus, **({"GPU": role.gpus} if role.gpus else {})}
    return placement_group([dict(bundle) for _ in role.commands], strategy=strategy, name=f"mmrl-{role.name}")


def _wait_ready(groups: list, roles: list[Role]) -> None:
    import ray
    ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=READY_TIMEOUT_S)
    if len(ready) < len(groups):
        asked = ", ".join(f"{r.name}: {len(r.commands)} x {{CPU: {r.cpus:g}, GPU: {r.gpus:g}}}" for r in roles)
        raise UserError(f"the Ray cluster cannot place the run within {READY_TIMEOUT_S:g}s: it has "
                        f"{ray.cluster_resources()}; the run asks for {asked} (placement.cpus / placement.gpus)")


def _actor(role: Role, group, index: int, log_dir: Path, env: dict[str, str], cwd: str):
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    remote = ray.remote(RoleProcess).options(
        num_cpus=role.cpus, num_gpus=role.gpus, max_restarts=role.restarts, max_concurrency=4,
        scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index))
    log = log_dir / f"{role.name}-{index}.log"
    return remote.remote(role.commands[index], str(log), env, cwd, not role.ranks)


def rank_envs(places: list[tuple[str, int, str]], gpus: float) -> list[dict[str, str]]:
    """torchrun's variables of each rank from where the ranks are (`places`: each rank's machine address, a
    free port there, its node id): rank 0's machine and port are the rendezvous. A rank with GPUs sees only
    its own (Ray sets CUDA_VISIBLE_DEVICES), so its local rank is 0; CPU ranks count along their machine."""
    master, port = places[0][0], places[0][1]
    envs = []
    for rank, (_, _, node) in enumerate(places):
        local = sum(1 for _, _, other in places[:rank] if other == node)
        on_node = sum(1 for _, _, other in places if other == node)
        env = {"RANK": str(rank), "WORLD_SIZE": str(len(places)), "MASTER_ADDR": master, "MASTER_PORT": str(port),
               "LOCAL_RANK": "0" if gpus else str(local), "LOCAL_WORLD_SIZE": "1" if gpus else str(on_node)}
        if not gpus:
            env["ACCELERATE_USE_CPU"] = "1"
        envs.append(env)
    return envs


def launch(roles: list[Role], log_dir: Path, address: str | None = None, say: Callable[[str], None] = print) -> Outcome:
    """Place `roles` (one of trainer ranks, any of servers) on the Ray cluster at `address` (None: a local one,
    with as many CPUs as the roles ask for where the machine has fewer), run the ranks to their end, then
    stop the servers; rank 0's output is shown through `say` as it comes."""
    import ray
    trainer = next(role for role in roles if role.ranks)
    servers = [role for role in roles if not role.ranks]
    local = {} if address else {"num_cpus": max(os.cpu_count() or 1, int(sum(r.cpus * len(r.commands) for r in roles)) + 1)}
    ray.init(address=address, log_to_driver=False, include_dashboard=False, **local)
    has_gpus = bool(ray.cluster_resources().get("GPU"))
    for role in roles:
        role.gpus = (1.0 if has_gpus else 0.0) if role.gpus is None else role.gpus
    groups, actors = [], []
    try:
        for role in [*servers, trainer]:
            groups.append(_placement_group(role, "PACK" if role.ranks else "SPREAD"))
        _wait_ready(groups, roles)
        env, cwd = forwarded_env(), os.getcwd()
        for role, group in zip(servers, groups):
            actors += [_actor(role, group, i, log_dir, env, cwd) for i in range(len(role.commands))]
        ranks = [_actor(trainer, groups[-1], i, log_dir, env, cwd) for i in range(len(trainer.commands))]
        actors += ranks
        placed = ", ".join(f"{r.name} x {len(r.commands)}" for r in roles)
        say(f"mmrl: placed on Ray ({ray.get_runtime_context().gcs_address}): {placed}; logs in {log_dir}/ROLE-INDEX.log")
        envs = rank_envs(ray.get([rank.node_and_port.remote() for rank in ranks]), trainer.gpus)
        return _run_ranks(ranks, envs, trainer, log_dir, say)
    finally:
        _stop(actors)
        for group in groups:
            ray.util.remove_placement_group(group)
        ray.shutdown()


def _run_ranks(ranks: list, envs: list[dict[str, str]], role: Role, log_dir: Path, say: Callable[[str], None]) -> Outcome:
    """Run every rank to its end; the first that fails (or whose actor dies) stops the others."""
    import ray
    from ray.exceptions import RayActorError
    refs = [actor.run.remote(env) for actor, env in zip(ranks, envs)]
    outcome = Outcome(codes=[0] * len(ranks))
    tail = LogTail(log_dir / f"{role.name}-0.log", say)
    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            tail.show()
            for ref in done:
                rank = refs.index(ref)
                try:
                    code = ray.get(ref)
                except RayActorError as e:  # the rank's machine or actor went away
                    code, outcome.why = -1, f"its Ray actor died ({type(e).__name__})"
                outcome.codes[rank] = code
                if code != 0 and outcome.failed is None:
                    outcome.failed = (role.name, rank, log_dir / f"{role.name}-{rank}.log")
                    _stop([a for i, a in enumerate(ranks) if i != rank])
    finally:
        tail.show()
    return outcome


def _stop(actors: list) -> None:
    """Stop the actors' processes (SIGTERM, then SIGKILL), then the actors, without restarts."""
    import ray
    from ray.exceptions import RayError
    waits = []
    for actor in actors:
        try:
            waits.append(actor.stop.remote())
        except RayError:
            pass
    ray.wait(waits, num_returns=len(waits), timeout=GRACE_S + 10)
    for actor in actors:
        ray.kill(actor, no_restart=True)


class LogTail:
    """The lines a log file gained since the last `show`, passed to `say` (rank 0's output on the console)."""

    def __init__(self, path: Path, say: Callable[[str], None]):
        self.path, self.say, self.offset = path, say, 0

    def show(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                text = f.read()
        except OSError:
            return
        complete = text.rfind(b"\n") + 1
        self.offset += complete
        for line in text[:complete].decode(errors="replace").splitlines():
            self.say(line)
