"""The torchrun launch backend (`[launch] backend = "torchrun"`): each learner's chips started by torchrun on
their host, process chaos through each host's agent.

Why: a cluster starts a job's processes with `torch.distributed.run` (torchrun) and its c10d rendezvous, not
with our forkserver; a chaos harness that is to run against such a deployment must survive that launcher: its
environment, its process tree (torchrun, then its workers), its reaction to a dead worker (it stops the
others and exits non-zero). With netns hosts each learner host is a network namespace on this machine, and
this module starts there, per learner:

1. a host agent (diloco_chaos/harness/hosts/agent.py), in the namespace, listening on the host's address; the supervisor
   connects and authenticates with the run's secret. Process chaos (kill_chip, kill_learner, crash_host,
   freeze, slow) and the worker pids it needs go through it: `send` / `pids` below.
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
import os
import pickle
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from diloco_chaos.harness.hosts.agent import AgentClient, AgentError, AgentSpec, agent_main
from diloco_chaos.harness.hosts.torchrun_worker import PARENT_PID_ENV
from diloco_chaos.harness.learner.chip import ChipSpec
from diloco_chaos.harness.run.procutil import die_with_parent

if TYPE_CHECKING:
    from diloco_chaos.harness.hosts.netns_run import NetnsRun

RDZV_PORT = 29400
"""torchrun's rendezvous store port on the host (+ the learner's generation, so a restarted learner never
waits for the port of the one it replaces)."""
SPEC_NAME = "learner{m}.torchrun.spec"
LOG_NAME = "learner{m}.torchrun.log"


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


def torchrun_command(chips: int, rdzv_port: int, spec_path: str) -> list[str]:
    """The torchrun command line for one learner host (the same on a real machine, with its spec file)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(chips),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--max-restarts", "0",
            "--monitor-interval", "0.1", "-m", "diloco_chaos.harness.hosts.torchrun_worker", spec_path]


def write_spec(path: Path, spec: ChipSpec) -> None:
    """The learner's ChipSpec, readable by this user only (it holds the run's secret)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(spec, f)


@dataclass
class TorchrunHosts:
    """The torchrun side of one run: per learner, its agent (process and connection) and its spec file."""

    run_dir: Path
    secret: bytes
    timeout_s: float
    agents: dict[int, AgentClient] = field(default_factory=dict)
    agent_pids: dict[int, int] = field(default_factory=dict)
    started: list[TorchrunProc] = field(default_factory=list)

    def open(self, netns: NetnsRun | None, start: Any, ctx: Any) -> str | None:
        """Start every learner host's agent and connect to it; why that failed (None: it did not)."""
        if netns is None:
            return "needs launch.hosts = 'netns'"
        try:
            for m, host in enumerate(netns.hosts.hosts):
                self.start_agent(m, host.netns, host.address, start, ctx)
        except (AgentError, OSError) as e:
            return f"{type(e).__name__}: {e}"
        return None

    def start_agent(self, m: int, netns: str, address: str, start: Any, ctx: Any) -> None:
        """Start learner m's agent in its namespace (through the supervisor's `start(name, target, args)`, so it
        is one of the run's processes) and connect to it."""
        parent, child = ctx.Pipe(duplex=False)
        spec = AgentSpec(str(self.run_dir / SPEC_NAME.format(m=m)), self.secret.hex(), address, netns=netns,
                         parent_pid=os.getpid(), accept_s=self.timeout_s)
        proc = start(f"learner{m}.agent", agent_main, (spec, child))
        child.close()
        if not parent.poll(self.timeout_s):
            raise AgentError(f"host agent of learner {m} did not report its port within {self.timeout_s}s")
        port = parent.recv()
        parent.close()
        self.agents[m] = AgentClient(address, port, self.secret, self.timeout_s)
        self.agent_pids[m] = proc.pid

    def start_learner(self, m: int, netns: str, spec: ChipSpec) -> TorchrunProc:
        """Write learner m's spec and start its torchrun in its namespace."""
        path = self.run_dir / SPEC_NAME.format(m=m)
        write_spec(path, dataclasses.replace(spec, rank=0, parent_pid=self.agent_pids[m], netns=""))
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   **{PARENT_PID_ENV: str(self.agent_pids[m])})
        cmd = ["ip", "netns", "exec", netns,
               *torchrun_command(spec.size, RDZV_PORT + spec.generation % 1000, str(path))]
        log = open(self.run_dir / LOG_NAME.format(m=m), "ab")  # noqa: SIM115 - closed by TorchrunProc
        # the kernel SIGKILLs torchrun if the supervisor dies (`ip netns exec` execs it: the setting carries over)
        popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 cwd=os.getcwd(), preexec_fn=functools.partial(die_with_parent, os.getpid()))
        proc = TorchrunProc(popen, f"learner{m}.torchrun", log)
        self.started.append(proc)
        return proc

    def pids(self, m: int) -> list[int]:
        """Learner m's live worker pids by rank, as its agent sees them."""
        return self.agents[m].pids()

    def send(self, m: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        """diloco_chaos/chaos/processes.py's Signaller: learner m's agent signals them."""
        return self.agents[m].signal(pids, sig, children)

    def close(self) -> None:
        """Hang up on every agent (each then kills what is left of its workers and exits)."""
        for client in self.agents.values():
            try:
                client.close()
            except OSError:
                pass
        self.agents.clear()
        for proc in self.started:
            proc.close()
        self.started.clear()
