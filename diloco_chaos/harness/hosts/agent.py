"""The per-host agent of the torchrun launch backend: process chaos on a learner host, by pid, on request.

Why: with `[launch] backend = "torchrun"` a learner's chips are torchrun's workers on their own host, not the
supervisor's children, and on another machine their pids mean nothing to the supervisor. One agent per learner
host does there what diloco_chaos/chaos/processes.py does here: it lists the host's worker pids by local rank and sends
them signals (SIGKILL for kill_chip / kill_learner / crash_host, SIGSTOP / SIGCONT for freeze and slow), with
or without their child processes (the host chip's link process).

Safety: the agent only ever signals the workers of its own run (processes whose command line is
`diloco_chaos.harness.hosts.torchrun_worker <the run's spec file>`) and their descendants; any other pid is refused. A
client must first prove it holds the run's secret: the agent sends a random nonce, the client answers with the same
HMAC the wire protocol's handshake uses (diloco_chaos/harness/wire/handshake.py). Requests and answers are JSON lines.

Life: the agent serves one supervisor connection. It exits when that connection closes, when nobody connects
within `accept_s`, when its parent (the supervisor, on one machine) dies, or on SIGTERM; and as it exits it
SIGKILLs its workers, so no process of the run outlives it (the workers also watch the agent's pid).

That is the agent of one run, started by the supervisor with the spec file at hand. The operator's agent of
`[launch] hosts = "remote"`, which receives each run's spec over its connection and starts torchrun itself, is
diloco_chaos/harness/hosts/remote_agent.py (`main` below starts either).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import psutil

from diloco_chaos.harness.wire.handshake import new_nonce, sign_challenge, verify_challenge

log = logging.getLogger(__name__)

WORKER_MODULE = "diloco_chaos.harness.hosts.torchrun_worker"
"""The module torchrun starts (diloco_chaos/harness/hosts/torchrun_worker.py): how the agent recognises its run's
workers."""
LAUNCHER_MODULE = "torch.distributed.run"
"""torchrun's own command line names the worker module too."""
MAX_LINE = 1 << 16
"""Longest request or answer line accepted (a pid list is far shorter)."""
AUTH_ID = -1
"""The id signed in the agent's challenge (learner ids are >= 0, so an agent's proof is no learner's)."""
CACHE_S = 0.5
"""How long the agent reuses its list of workers while they all still run."""
KEEPALIVE_S = 20.0
"""5 s idle, then 3 probes 5 s apart (`_keepalive`)."""
SIGNALS = {s.name: s for s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT, signal.SIGTERM)}


class AgentError(RuntimeError):
    """The agent refused a request, failed authentication or did not answer in time."""


@dataclass(frozen=True)
class AgentSpec:
    """Everything an agent needs; picklable (the supervisor starts one per netns host)."""

    spec_path: str
    """The learner's worker spec file (diloco_chaos/harness/hosts/torchrun.py): its workers name it on their command
    line."""
    secret_hex: str
    """The run's secret, which a client must prove it holds."""
    host: str
    """Address to listen on (the learner host's address)."""
    port: int = 0
    """0: any free port, reported to the parent."""
    netns: str = ""
    """Network namespace to enter first (netns hosts); "": this machine's."""
    parent_pid: int | None = None
    """Exit when this pid is gone (the supervisor, on one machine); None on a real host."""
    accept_s: float = 60.0
    """Exit if no client has connected within this."""
    io_s: float = 30.0
    """Bound of one request's read or write once connected; the supervisor's idle connection is kept open."""


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


def _allowed(spec_path: str) -> dict[int, psutil.Process]:
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
        allowed = _allowed(spec_path)
        targets = []
        for pid in pids:
            if pid not in allowed:
                return {"error": f"pid {pid} is not a worker of this run on this host"}
            targets.append(pid)
            if req.get("children"):
                try:
                    targets.extend(c.pid for c in allowed[pid].children(recursive=True))
                except psutil.NoSuchProcess:
                    pass
        hit = []
        for pid in targets:
            try:
                allowed[pid].send_signal(sig)
                hit.append(pid)
            except psutil.NoSuchProcess:
                pass
        return {"hit": hit}
    return {"error": f"unknown op {op!r:.50}"}


def _read_line(f: Any) -> dict[str, Any] | None:
    line = f.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        raise AgentError("line too long")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise AgentError("a request must be a JSON object")
    return value


def _send(f: Any, obj: dict[str, Any]) -> None:
    f.write(json.dumps(obj).encode() + b"\n")
    f.flush()


def serve(spec: AgentSpec, server: socket.socket) -> None:
    """Accept one client, authenticate it, answer its requests until it hangs up; then kill the workers."""
    secret = bytes.fromhex(spec.secret_hex)
    server.settimeout(spec.accept_s)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        log.warning("host agent: no client within %ss", spec.accept_s)
        _kill_workers(spec.spec_path)
        return
    try:
        conn.settimeout(spec.io_s)
        f = conn.makefile("rwb")
        nonce = new_nonce()
        _send(f, {"nonce": nonce.hex()})
        auth = _read_line(f)
        if auth is None or not verify_challenge(secret, nonce, AUTH_ID, auth.get("auth", "")):
            _send(f, {"error": "authentication failed"})
            return
        _send(f, {"ok": True, "pid": os.getpid()})
        conn.settimeout(None)  # idle between requests for as long as the run lasts; EOF ends it, and
        _keepalive(conn)       # a supervisor's machine that vanishes without closing is noticed within KEEPALIVE_S
        cache = WorkerCache(spec.spec_path)
        while True:
            req = _read_line(f)
            if req is None:
                return
            _send(f, handle(spec.spec_path, req, cache))
    except (OSError, ValueError, AgentError) as e:
        log.warning("host agent: connection ended: %s", e)
    finally:
        conn.close()
        _kill_workers(spec.spec_path)


def _keepalive(conn: socket.socket) -> None:
    """TCP keepalive probes: a silent, dead peer ends the connection within KEEPALIVE_S."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):  # Linux
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)


def _kill_workers(spec_path: str) -> None:
    for p in _allowed(spec_path).values():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def agent_main(spec: AgentSpec, report: Any = None) -> None:
    """Entry point (forkserver child on one machine, or `python -m diloco_chaos.harness.hosts.agent` on a real host):
    listen, report the port through `report` (a pipe end) if given, serve."""
    if spec.netns:
        from diloco_chaos.harness.hosts.netns import enter_netns

        enter_netns(spec.netns)
    if spec.parent_pid is not None:
        from diloco_chaos.harness.run.procutil import become_run_process, stderr_to_file

        become_run_process(spec.parent_pid)
        stderr_to_file(os.path.dirname(spec.spec_path),  # learner<m>.agent, beside its torchrun's log
                       os.path.basename(spec.spec_path).replace(".torchrun.spec", ".agent"))

    def on_term(signum: int, frame: Any) -> None:
        _kill_workers(spec.spec_path)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    server = socket.create_server((spec.host, spec.port))
    if report is not None:
        report.send(server.getsockname()[1])
        report.close()
    try:
        serve(spec, server)
    finally:
        server.close()


class AgentClient:
    """The supervisor's connection to one host agent (one request at a time, bounded)."""

    def __init__(self, host: str, port: int, secret: bytes, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.f = self.sock.makefile("rwb")
        hello = _read_line(self.f)
        if hello is None or "nonce" not in hello:
            raise AgentError(f"host agent {host}:{port} sent no challenge")
        _send(self.f, {"auth": sign_challenge(secret, bytes.fromhex(hello["nonce"]), AUTH_ID)})
        ok = _read_line(self.f)
        if ok is None or not ok.get("ok"):
            raise AgentError(f"host agent {host}:{port} refused us: {ok}")
        self.agent_pid = int(ok["pid"])
        self.lock = threading.Lock()  # the supervisor's thread and a `slow` controller's share the connection

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            _send(self.f, req)
            got = _read_line(self.f)
        if got is None:
            raise AgentError("host agent closed the connection")
        if "error" in got:
            raise AgentError(str(got["error"]))
        return got

    def pids(self) -> list[int]:
        return [int(p) for p in self.request({"op": "pids"})["pids"]]

    def signal(self, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        got = self.request({"op": "signal", "pids": pids, "signal": sig.name, "children": children})
        return [int(p) for p in got["hit"]]

    def close(self) -> None:
        try:
            self.f.close()
        finally:
            self.sock.close()


def main(argv: list[str] | None = None) -> None:
    """Run an agent on a real learner host (docs/multi-host.md). With `--work-dir` (`[launch] hosts = "remote"`):
    `python -m diloco_chaos.harness.hosts.agent --listen 0.0.0.0:29600 --secret-file agents.secret --work-dir
    /var/lib/dc` serves every supervisor that proves the secret (diloco_chaos/harness/hosts/remote_agent.py). With
    `--spec`: one run whose spec file is already on this host."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="host:port to listen on")
    ap.add_argument("--secret-file", required=True, help="file holding the secret (hex), mode 0600")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--work-dir", help="serve remote runs: each connection gets a directory here")
    mode.add_argument("--spec", help="serve one run: its learner's worker spec file, as torchrun's workers name it")
    ap.add_argument("--once", action="store_true", help="with --work-dir: exit after one connection")
    ap.add_argument("--accept-s", type=float, default=None,
                    help="exit if no supervisor connects within this (--spec: default 600; --work-dir: with --once)")
    ap.add_argument("--pid-file", default="", help="write the agent's pid here (the workers' DILOCO_CHAOS_PARENT_PID)")
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    with open(a.secret_file) as f:
        secret_hex = f.read().strip()
    if a.pid_file:
        with open(a.pid_file, "w") as f:
            f.write(str(os.getpid()))
    logging.basicConfig(level=logging.INFO)
    if a.work_dir:
        from diloco_chaos.harness.hosts.remote_agent import RemoteAgentConfig, serve_runs

        serve_runs(RemoteAgentConfig(host, int(port), bytes.fromhex(secret_hex), a.work_dir, a.once, a.accept_s))
        return
    agent_main(AgentSpec(a.spec, secret_hex, host, int(port), accept_s=a.accept_s or 600.0))

if __name__ == "__main__":
    main()
