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
from dataclasses import dataclass
from typing import Any

from diloco_chaos.harness.hosts.workers import WorkerCache, handle, keepalive, kill_workers
from diloco_chaos.harness.wire.handshake import new_nonce, sign_challenge, verify_challenge

log = logging.getLogger(__name__)

MAX_LINE = 1 << 16
"""Longest request or answer line accepted (a pid list is far shorter)."""
AUTH_ID = -1
"""The id signed in the agent's challenge (learner ids are >= 0, so an agent's proof is no learner's)."""


class AgentError(RuntimeError):
    """The agent refused a request, failed authentication or did not answer in time."""


@dataclass(frozen=True)
class AgentSpec:
    """Everything an agent needs; picklable (the supervisor starts one per netns host)."""

    spec_path: str
    """The learner's worker spec file (diloco_chaos/harness/hosts/workers.py): its workers name it on their command
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
        kill_workers(spec.spec_path)
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
        keepalive(conn)       # a supervisor's machine that vanishes without closing is noticed within KEEPALIVE_S
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
        kill_workers(spec.spec_path)


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
        kill_workers(spec.spec_path)
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
