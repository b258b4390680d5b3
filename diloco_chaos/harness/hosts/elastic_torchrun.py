"""elastic_ddp's torchrun engine (`[elastic] engine = "torchrun"`): every chip of every learner is a worker of
one torchrun elastic job on this machine, and torchrun, not the supervisor, restarts them.

Why: the in-place regroup (engine "regroup") drops only the lost learner from the global group and costs the
survivors 0.01-0.04 s; production elastic data parallel on torch (`torchrun --max-restarts=N`, c10d rendezvous)
stops *every* worker on a membership change, rendezvous again, re-creates the process groups and reloads the
last checkpoint. This engine runs that, so its measured cost is the one compare weighs.

The job: `python -m diloco_chaos.harness.hosts.elastic_agent <events> --nnodes 1:1 --nproc-per-node M*C
--max-restarts elastic.max_restarts --rdzv-backend c10d --rdzv-endpoint <the run's TCPStore> --rdzv-conf
is_host=false,join_timeout=...,read_timeout=...,close_timeout=... --monitor-interval 0.1 -m
diloco_chaos.harness.hosts.elastic_worker <spec>`: torchrun's own main, its phases timed
(diloco_chaos/harness/hosts/elastic_agent.py). Global rank g is learner g // C, chip g % C
(diloco_chaos/harness/hosts/elastic_worker.py).

One node of M x C workers, not M nodes of C: torchrun stops and restarts the workers of the agent whose
worker failed, and other agents follow only when their monitor sees a node waiting at the rendezvous (a
further monitor interval and a last-call wait per restart). With one agent a lost chip stops every worker at
once, which is what production's job does on any failure; the phases measured are the same ones. The
rendezvous runs on the run's TCPStore (is_host=false: the agent is a client of the supervisor's store).

The supervisor sees the job as one process standing for every chip (`TorchrunProc`, as the torchrun launch
backend does): exit 0 is every learner done; anything else is the job failed (its restarts used), which fails
the run. Faults reach the workers by their pids (`chip_pids`: the agent's descendants running the worker
module, by the RANK torchrun gave them). Link proxies are the local hosts' (`LocalHosts`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.hosts.base import Proc, Routes, Spawner
from diloco_chaos.harness.hosts.local import LocalHosts
from diloco_chaos.harness.hosts.torchrun import TorchrunProc
from diloco_chaos.harness.hosts.workers import write_spec
from diloco_chaos.harness.learner.chip import ChipSpec
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.run.procutil import die_with_parent
from diloco_chaos.harness.run.rundir import LOGS_DIR

WORKER_MODULE = "diloco_chaos.harness.hosts.elastic_worker"
AGENT_MODULE = "diloco_chaos.harness.hosts.elastic_agent"
SPEC_NAME = "elastic.torchrun.spec"
LOG_NAME = "torchrun.log"
CHECKPOINT_NAME = "elastic.ckpt"
"""The job's checkpoint in the run directory (written by global rank 0, read by every restart and the syncer)."""
MONITOR_INTERVAL_S = 0.1
"""torchrun's --monitor-interval: how often its agent polls its workers (detect is at most this plus a poll)."""
RUN_ID = "diloco-chaos-elastic"


def checkpoint_path(run_dir: str | os.PathLike[str]) -> str:
    return os.path.join(run_dir, CHECKPOINT_NAME)


def agent_command(sc: Scenario, events_file: str, store_port: int, spec_path: str) -> list[str]:
    """The launcher's command line: torchrun's arguments after the events file (module docstring)."""
    e, chips = sc.elastic, sc.topology.learners * sc.topology.chips_per_learner
    rdzv = (f"is_host=false,join_timeout={e.rdzv_timeout_s:g},read_timeout={e.rdzv_timeout_s:g},"
            f"close_timeout={e.rdzv_timeout_s:g},timeout={e.rdzv_timeout_s:g}")
    return [sys.executable, "-m", AGENT_MODULE, events_file, "--nnodes", "1:1", "--nproc-per-node", str(chips),
            "--max-restarts", str(e.max_restarts), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{store_port}", "--rdzv-id", RUN_ID, "--rdzv-conf", rdzv,
            "--monitor-interval", f"{MONITOR_INTERVAL_S:g}", "-m", WORKER_MODULE, spec_path]


class ElasticTorchrunHosts:
    """The `Hosts` (diloco_chaos/harness/hosts/base.py) of engine torchrun: this machine, one torchrun job."""

    def __init__(self, sc: Scenario, run_dir: Path, events: EventLog, spawner: Spawner) -> None:
        self.sc, self.run_dir, self.spawner = sc, run_dir, spawner
        self.local = LocalHosts(sc, events, spawner)
        self.job: TorchrunProc | None = None

    @property
    def listen(self) -> str:
        return self.local.listen

    def connect(self, syncer_ports: list[int]) -> Routes:
        return self.local.connect(syncer_ports)

    @property
    def link_chaos(self) -> LinkChaos | None:
        return self.local.link_chaos

    def start_learner(self, spec: ChipSpec) -> dict[int, Proc]:
        """The first call starts the job for every learner; each learner's chips are that one process."""
        if spec.generation > 0:
            raise RuntimeError("elastic.engine = 'torchrun': torchrun restarts the job, the supervisor never does")
        if self.job is None:
            path = self.run_dir / SPEC_NAME
            write_spec(path, dataclasses.replace(spec, learner=0, rank=0))
            cmd = agent_command(self.sc, str(self.run_dir / EVENTS_FILE), spec.store_port, str(path))
            env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", LOGLEVEL="INFO")
            (self.run_dir / LOGS_DIR).mkdir(exist_ok=True)
            log = open(self.run_dir / LOGS_DIR / LOG_NAME, "ab")  # noqa: SIM115 - closed by TorchrunProc
            # the kernel SIGKILLs the agent if the supervisor dies; its workers die with it (their own pdeathsig)
            popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=os.getcwd(), preexec_fn=functools.partial(die_with_parent, os.getpid()))
            self.job = TorchrunProc(popen, "torchrun.agent", log)
            self.spawner.register_process(self.job.name, self.job)
        return dict.fromkeys(range(spec.size), self.job)

    def start_chip(self, spec: ChipSpec) -> Proc:
        raise RuntimeError("elastic.engine = 'torchrun': a lost chip restarts the whole job (no shrink)")

    def chip_pids(self, learner: int, chips: list[Proc]) -> list[int]:
        """Learner `learner`'s live worker pids by chip: the job's workers whose RANK is in its range."""
        if self.job is None or self.job.exitcode is not None:
            return []
        c = self.sc.topology.chips_per_learner
        return [p.pid for _, p in sorted(w for w in workers(self.job.pid) if w[0] // c == learner)]

    def send(self, learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        return self.local.send(learner, pids, sig, children)

    def close(self) -> None:
        if self.job is not None:
            self.job.close()
        self.local.close()


def workers(agent_pid: int) -> list[tuple[int, psutil.Process]]:
    """(global rank, process) of the agent's live workers (not their link processes, which share the command)."""
    try:
        procs = psutil.Process(agent_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found: dict[int, tuple[int, psutil.Process]] = {}
    for p in procs:
        try:
            if WORKER_MODULE not in p.cmdline() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            found[p.pid] = (int(p.environ()["RANK"]), p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
            continue
    out = []
    for rank, p in found.values():
        try:
            if p.ppid() not in found:
                out.append((rank, p))
        except psutil.NoSuchProcess:
            continue
    return out
