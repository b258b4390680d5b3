"""The torchrun launch backend (`[launch] backend = "torchrun"`): each learner's chips started by torchrun on
their host, process chaos through each host's agent.

Why: a cluster starts a job's processes with `torch.distributed.run` (torchrun) and its c10d rendezvous, not
with our forkserver; a chaos harness that is to run against such a deployment must survive that launcher: its
environment, its process tree (torchrun, then its workers), its reaction to a dead worker (it stops the
others and exits non-zero). With netns hosts each learner host is a network namespace on this machine, and
this module starts there, per learner:

1. a host agent (diloco_chaos/harness/hosts/agent.py), in the namespace, listening on the host's address; the supervisor
   connects and authenticates with the run's secret. Process chaos (kill_chip, kill_learner, crash_host,
   freeze, slow) and the worker pids it needs go through it: `send` / `chip_pids` below.
2. `ip netns exec <host> python -m torch.distributed.run --nnodes 1 --nproc-per-node C --rdzv-backend c10d
   --rdzv-endpoint 127.0.0.1:<port> --max-restarts 0 -m diloco_chaos.harness.hosts.torchrun_worker <spec file>`, the
   command a real host runs (docs/multi-host.md). Its workers run the same chip code as local chips.

One learner = one torchrun job of one node: its rendezvous is local to the host. The supervisor sees the
learner as that torchrun process (`TorchrunProc`, which looks like a multiprocessing.Process to it): exit 0 is
a finished learner; anything else a failed one, which the recovery policy restarts as a whole (a new torchrun,
a new generation), as torchrun itself would with --max-restarts but under the run's policy and repair delay.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import signal
import subprocess
from pathlib import Path
from typing import IO

from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.harness.hosts.agent import AgentClient, AgentError, AgentSpec, agent_main
from diloco_chaos.harness.hosts.base import HostsUnavailable, Proc, Routes, Spawner
from diloco_chaos.harness.hosts.netns_run import NetnsRun
from diloco_chaos.harness.hosts.torchrun_worker import PARENT_PID_ENV
from diloco_chaos.harness.hosts.workers import LOG_NAME, RDZV_PORT, SPEC_NAME, torchrun_command, write_spec
from diloco_chaos.harness.learner.chip import ChipSpec
from diloco_chaos.harness.run.procutil import die_with_parent


class TorchrunProc:
    """A torchrun process as the supervisor watches its chips: pid, exitcode, sentinel, is_alive, join."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, log: IO[bytes]) -> None:
        self.popen, self.name, self.log = popen, name, log
        self.pid = popen.pid
        self.sentinel = os.pidfd_open(popen.pid)

    @property
    def exitcode(self) -> int | None:
        code = self.popen.poll()
        if code is not None and not self.log.closed:
            self.log.close()
        return code

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self.exitcode  # noqa: B018 - closes the log once it exited

    def close(self) -> None:
        os.close(self.sentinel)


class TorchrunHosts:
    """The `Hosts` (diloco_chaos/harness/hosts/base.py) of `backend = "torchrun"` on netns hosts: the namespaces,
    the syncer's address and the kernel links are `netns`'s; per learner, its agent (process and connection),
    its spec file and its torchrun are this class's."""

    def __init__(self, netns: NetnsRun, run_dir: Path, secret: bytes, timeout_s: float, spawner: Spawner) -> None:
        self.netns, self.run_dir, self.secret, self.timeout_s, self.spawner = netns, run_dir, secret, timeout_s, spawner
        self.agents: dict[int, AgentClient] = {}
        self.agent_pids: dict[int, int] = {}
        self.started: list[TorchrunProc] = []

    @property
    def listen(self) -> str:
        return self.netns.listen

    @property
    def link_chaos(self) -> LinkChaos | None:
        return self.netns.link_chaos

    def connect(self, syncer_ports: list[int]) -> Routes:
        """The netns hosts' links, then every learner host's agent, started and connected (each within
        `timeout_s`)."""
        routes = self.netns.connect(syncer_ports)
        try:
            for m, host in enumerate(self.netns.hosts.hosts):
                self.start_agent(m, host.netns, host.address)
        except (AgentError, OSError) as e:
            raise HostsUnavailable(f"launch.backend = 'torchrun': {type(e).__name__}: {e}") from e
        return routes

    def start_agent(self, m: int, netns: str, address: str) -> None:
        """Start learner m's agent in its namespace (through the spawner, so it is one of the run's processes)
        and connect to it."""
        parent, child = multiprocessing.Pipe(duplex=False)
        spec = AgentSpec(str(self.run_dir / SPEC_NAME.format(m=m)), self.secret.hex(), address, netns=netns,
                         parent_pid=os.getpid(), accept_s=self.timeout_s)
        proc = self.spawner.start_process(f"learner{m}.agent", agent_main, (spec, child))
        child.close()
        if not parent.poll(self.timeout_s):
            raise AgentError(f"host agent of learner {m} did not report its port within {self.timeout_s}s")
        port = parent.recv()
        parent.close()
        self.agents[m] = AgentClient(address, port, self.secret, self.timeout_s)
        self.agent_pids[m] = proc.pid

    def start_learner(self, spec: ChipSpec) -> dict[int, Proc]:
        """Write learner m's spec and start its torchrun in its namespace: one process stands for every chip."""
        m = spec.learner
        path = self.run_dir / SPEC_NAME.format(m=m)
        write_spec(path, dataclasses.replace(spec, rank=0, parent_pid=self.agent_pids[m], netns=""))
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   **{PARENT_PID_ENV: str(self.agent_pids[m])})
        cmd = ["ip", "netns", "exec", self.netns.netns_of(m),
               *torchrun_command(spec.size, RDZV_PORT + spec.generation % 1000, str(path))]
        log = open(self.run_dir / LOG_NAME.format(m=m), "ab")  # noqa: SIM115 - closed by TorchrunProc
        # the kernel SIGKILLs torchrun if the supervisor dies (`ip netns exec` execs it: the setting carries over)
        popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=os.getcwd(), preexec_fn=functools.partial(die_with_parent, os.getpid()))
        proc = TorchrunProc(popen, f"learner{m}.torchrun", log)
        self.started.append(proc)
        self.spawner.register_process(proc.name, proc)
        return dict.fromkeys(range(spec.size), proc)

    def start_chip(self, spec: ChipSpec) -> Proc:
        raise NotImplementedError("launch.backend = 'torchrun' restarts a learner whole (no recovery.policy shrink)")

    def chip_pids(self, learner: int, chips: list[Proc]) -> list[int]:
        """Learner m's live worker pids by rank, as its agent sees them."""
        return self.agents[learner].pids()

    def send(self, learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        """diloco_chaos/chaos/processes.py's Signaller: learner m's agent signals them."""
        return self.agents[learner].signal(pids, sig, children)

    def close(self) -> None:
        """Hang up on every agent (each then kills what is left of its workers and exits), then close the netns
        hosts (their links, then the namespaces)."""
        try:
            for client in self.agents.values():
                try:
                    client.close()
                except OSError:
                    pass
            self.agents.clear()
            for proc in self.started:
                proc.close()
            self.started.clear()
        finally:
            self.netns.close()
