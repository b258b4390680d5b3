"""A learner host's torchrun workers: the command that starts them, the spec file they read, and how an agent
finds and signals them (by their command line, limited to one run's workers and their descendants).

Why a module of its own: both agents use it, the per-run agent of netns hosts (diloco_chaos/harness/hosts/agent.py)
and the operator's agent of remote hosts (diloco_chaos/harness/hosts/remote_agent.py), and so does the supervisor's
side of the torchrun launch (diloco_chaos/harness/hosts/torchrun.py); it imports none of them.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from diloco_chaos.harness.learner.chip import ChipSpec

WORKER_MODULE = "diloco_chaos.harness.hosts.torchrun_worker"
"""The module torchrun starts (diloco_chaos/harness/hosts/torchrun_worker.py): how the agent recognises its run's
workers."""
LAUNCHER_MODULE = "torch.distributed.run"
"""torchrun's own command line names the worker module too."""
CACHE_S = 0.5
"""How long the agent reuses its list of workers while they all still run."""
KEEPALIVE_S = 20.0
"""5 s idle, then 3 probes 5 s apart (`keepalive`)."""
SIGNALS = {s.name: s for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT, signal.SIGTERM)}
RDZV_PORT = 29400
"""torchrun's rendezvous store port on the host (+ the learner's generation, so a restarted learner never
waits for the port of the one it replaces)."""
SPEC_NAME = "learner{m}.torchrun.spec"
LOG_NAME = "learner{m}.torchrun.log"


def workers(spec_path: str) -> list[psutil.Process]:
    """This host's live workers of the run, ordered by local rank (torchrun's LOCAL_RANK)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if WORKER_MODULE in cmd and spec_path in cmd and LAUNCHER_MODULE not in cmd:  # not torchrun itself
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
                rank = int(p.environ()["LOCAL_RANK"])
            except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
                continue
            found.append((rank, p))
    pids = {p.pid for _, p in found}
    # a host chip's link process is forked from it: same command line and environment, but a worker's child
    return [p for _, p in sorted(found, key=lambda x: x[0]) if _ppid(p) not in pids]


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a killed worker stays one until torchrun reaps it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _ppid(p: psutil.Process) -> int:
    try:
        return p.ppid()
    except psutil.NoSuchProcess:
        return -1


def allowed(spec_path: str) -> dict[int, psutil.Process]:
    """Every process the agent may signal: the run's workers and their descendants."""
    out: dict[int, psutil.Process] = {}
    for w in workers(spec_path):
        out[w.pid] = w
        try:
            out.update({c.pid: c for c in w.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
    return out


class WorkerCache:
    """`workers()` is a scan of /proc; a `slow` fault asks for the pids every CONTROL_TICK_S (20 ms). Kept for
    CACHE_S unless one of the cached workers has ended (a kill, a restart)."""

    def __init__(self, spec_path: str) -> None:
        self.spec_path = spec_path
        self.found: list[psutil.Process] = []
        self.at = -CACHE_S

    def pids(self) -> list[int]:
        now = time.monotonic()
        if now - self.at > CACHE_S or not all(_running(p) for p in self.found):
            self.found, self.at = workers(self.spec_path), now
        return [p.pid for p in self.found]


def handle(spec_path: str, req: dict[str, Any], cache: WorkerCache | None = None) -> dict[str, Any]:
    """One request: {"op": "pids"} -> {"pids": [...]} by local rank; {"op": "signal", "pids": [...],
    "signal": "SIGKILL", "children": bool} -> {"hit": [...]}; anything else -> {"error": why}."""
    op = req.get("op")
    if op == "pids":
        return {"pids": (cache or WorkerCache(spec_path)).pids()}
    if op == "signal":
        sig = SIGNALS.get(str(req.get("signal")))
        pids = req.get("pids")
        if sig is None or not isinstance(pids, list) or not all(isinstance(p, int) for p in pids):
            return {"error": f"malformed signal request: {req!r:.200}"}
        mine = allowed(spec_path)
        targets = []
        for pid in pids:
            if pid not in mine:
                return {"error": f"pid {pid} is not a worker of this run on this host"}
            targets.append(pid)
            if req.get("children"):
                try:
                    targets.extend(c.pid for c in mine[pid].children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        hit = []
        for pid in targets:
            try:
                mine[pid].send_signal(sig)
                hit.append(pid)
            except psutil.NoSuchProcess:
                pass
        return {"hit": hit}
    return {"error": f"unknown op {op!r:.50}"}


def keepalive(conn: socket.socket) -> None:
    """TCP keepalive probes: a silent, dead peer ends the connection within KEEPALIVE_S."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):  # Linux
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def kill_workers(spec_path: str) -> None:
    for p in allowed(spec_path).values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


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


