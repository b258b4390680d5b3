"""The trainer processes of the torchft reproductions: one rank of one torchft replica group, torch and torchft only.

What: `ddp` is torchft's fault-tolerant data parallel loop written out (start_quorum, allreduce of every gradient
through the Manager, should_commit, optimizer step only on commit); `diloco` is torchft.local_sgd.DiLoCo
(one fragment, sync_every inner steps, fragment_sync_delay 0). Both train a tiny model from the same seed in every
group, each group on its own data, and write one `sync` record per manager step: the step count after it, whether
it committed, the quorum id, the number of participants, the error if any, and a sha1 digest of the weights (for
DiLoCo taken right after a sync, when the model holds the global weights). `gates` hold a rank before the quorum
of a given manager step until the parent touches go-<label>-<step>: the parent acts on progress, never on time.
Every bound is explicit: Manager timeout, quorum_timeout, connect_timeout, quorum_retries and the Gloo timeout.
Why: the reproductions must exercise torchft's own code paths with nothing of the harness in between.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from reprolib import Child, Cluster, Recorder, free_port, wait_file

TEACHER_SEED = 7
_KEEP: list[Any] = []
"""Managers kept referenced until the fork wrapper's os._exit: dropping one at the function's return runs torchft's
Rust destructors, which on 0.2.0 did not return after a Lighthouse restart (the process hung past its `done`)."""


@dataclass(frozen=True)
class Spec:
    """What one trainer process is told (crosses the fork as a Python object)."""

    dir: Path
    label: str
    group: int
    rank: int = 0
    world: int = 1
    steps: int = 20
    min_replicas: int = 1
    quorum_retries: int = 0
    timeout_s: float = 3.0  # Manager timeout and ProcessGroupGloo timeout
    quorum_timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    gates: tuple[int, ...] = ()
    gate_timeout_s: float = 90.0
    sync_every: int = 4  # diloco only
    data_seed: int | None = None  # default: 1000 + group (every rank of a group sees the same data)


@dataclass
class Group:
    """Ports of one replica group's generation (a restarted group gets new ones)."""

    group: int
    world: int
    store_port: int = field(default_factory=free_port)
    manager_port: int = field(default_factory=free_port)

    def env(self, lighthouse_port: int, rank: int, job: str) -> dict[str, str]:
        return {"TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{lighthouse_port}", "REPLICA_GROUP_ID": str(self.group),
                "RANK": str(rank), "WORLD_SIZE": str(self.world), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.store_port), "TORCHFT_MANAGER_PORT": str(self.manager_port), "JOB_ID": job,
                "OMP_NUM_THREADS": "1"}


def digest(params: Any) -> str:
    h = hashlib.sha1()
    for p in params:
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:12]


def _setup(spec: Spec) -> tuple[Recorder, Any, Any]:
    # every bound is this Spec's: drop TORCHFT_* overrides (whole-second env values that beat the arguments)
    for key in [k for k in os.environ if k.startswith("TORCHFT_") and k not in ("TORCHFT_LIGHTHOUSE",
                                                                                "TORCHFT_MANAGER_PORT")]:
        del os.environ[key]
    rec = Recorder(spec.dir / f"{spec.label}.jsonl", label=spec.label, group=spec.group, rank=spec.rank)
    rec.capture_torchft_logs()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), spec.world, is_master=spec.rank == 0,
                          wait_for_workers=False, timeout=timedelta(seconds=30))
    return rec, torch, store


def _manager(spec: Spec, rec: Recorder, state_dict: Any, load_state_dict: Any) -> Any:
    import torchft

    pg = torchft.ProcessGroupGloo(timeout=timedelta(seconds=spec.timeout_s))
    return torchft.Manager(
        pg=pg, min_replica_size=spec.min_replicas, load_state_dict=load_state_dict, state_dict=state_dict,
        use_async_quorum=False, replica_id=f"group{spec.group}", rank=spec.rank, world_size=spec.world,
        hostname="127.0.0.1", timeout=timedelta(seconds=spec.timeout_s),
        quorum_timeout=timedelta(seconds=spec.quorum_timeout_s),
        connect_timeout=timedelta(seconds=spec.connect_timeout_s), init_sync=False,
        quorum_retries=spec.quorum_retries)


class _Gates:
    def __init__(self, spec: Spec, rec: Recorder) -> None:
        self.spec, self.rec = spec, rec
        self.passed: set[int] = set()

    def at(self, step: int) -> None:
        if step in self.spec.gates and step not in self.passed:
            self.passed.add(step)
            self.rec.emit("held", step=step)
            wait_file(self.spec.dir / f"go-{self.spec.label}-{step}", self.spec.gate_timeout_s)
            self.rec.emit("released", step=step)


def _sync_record(rec: Recorder, manager: Any, committed: bool, weights: str, **kw: Any) -> None:
    err = manager.errored()
    rec.emit("sync", step=manager.current_step(), committed=committed, quorum_id=manager._quorum_id,
             participants=manager.num_participants(), digest=weights, error=None if err is None else str(err)[:300],
             **kw)


def ddp(spec: Spec) -> None:
    rec, torch, _store = _setup(spec)
    gen = torch.Generator().manual_seed(spec.data_seed if spec.data_seed is not None else 1000 + spec.group)
    teacher = torch.randn(8, 4, generator=torch.Generator().manual_seed(TEACHER_SEED))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "opt": opt.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["opt"])
        rec.emit("heal_load")

    manager = _manager(spec, rec, state_dict, load_state_dict)
    _KEEP.append(manager)
    rec.emit("ready", step=manager.current_step())
    gates = _Gates(spec, rec)
    while manager.current_step() < spec.steps:
        gates.at(manager.current_step())
        manager.start_quorum()
        x = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x @ teacher)
        opt.zero_grad()
        loss.backward()
        works = [manager.allreduce(p.grad) for p in model.parameters()]
        for w in works:
            w.wait()
        committed = manager.should_commit()
        if committed:
            opt.step()
        _sync_record(rec, manager, committed, digest(model.parameters()), loss=round(loss.item(), 5))
    rec.emit("done", step=manager.current_step())
    # no manager.shutdown() and no drop (see _KEEP): the fork wrapper's os._exit ends the process, the kernel
    # closes its sockets


def diloco(spec: Spec) -> None:
    rec, torch, _store = _setup(spec)
    from torchft.local_sgd import DiLoCo

    gen = torch.Generator().manual_seed(spec.data_seed if spec.data_seed is not None else 1000 + spec.group)
    teacher = torch.randn(8, 4, generator=torch.Generator().manual_seed(TEACHER_SEED))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        rec.emit("heal_load", weights=digest(model.parameters()))

    manager = _manager(spec, rec, state_dict, load_state_dict)
    _KEEP.append(manager)
    rec.emit("ready", step=manager.current_step())
    gates = _Gates(spec, rec)
    inner_steps = 0
    with DiLoCo(manager, [model], inner, [outer], sync_every=spec.sync_every, backup_device=torch.device("cpu"),
                pin_memory=False):
        while manager.current_step() < spec.steps:
            if inner_steps % spec.sync_every == 0:
                gates.at(manager.current_step())
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), torch.tanh(x @ teacher))
            inner.zero_grad()
            loss.backward()
            before = len(rec.commits)
            inner.step()  # DiLoCo's hooks: the quorum, the pseudo-gradient allreduce, should_commit
            inner_steps += 1
            if len(rec.commits) > before:
                # right after a sync the model holds the global weights (fragment_update_alpha 0)
                _sync_record(rec, manager, rec.commits[-1], digest(model.parameters()), inner=inner_steps)
    rec.emit("done", step=manager.current_step())
    # no manager.shutdown() and no drop (see _KEEP): the fork wrapper's os._exit ends the process, the kernel
    # closes its sockets


def launch(cluster: Any, fn: Any, spec: Spec, group: Group, lighthouse_port: int) -> Any:
    """Fork one trainer rank of group (label spec.label) against the Lighthouse on lighthouse_port."""
    return cluster.fork(spec.label, fn, group.env(lighthouse_port, spec.rank, cluster.name), spec)


def syncs(records: list[dict[str, Any]], label: str) -> list[dict[str, Any]]:
    return [r for r in records if r["ev"] == "sync" and r["label"] == label]


def first(records: list[dict[str, Any]], label: str, ev: str, **match: Any) -> dict[str, Any] | None:
    for r in records:
        if r["label"] == label and r["ev"] == ev and all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def finish(c: Cluster, proc: Child, timeout_s: float) -> int:
    """Wait for the trainer's `done` record or its exit, then for its exit code."""
    c.wait(lambda: first(c.records(), proc.label, "done") or proc.poll() is not None, timeout_s,
           f"{proc.label} to finish or fail")
    return c.wait_exit(proc, 20)
