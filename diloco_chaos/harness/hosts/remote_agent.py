"""A host agent that serves runs from another machine (`[launch] hosts = "remote"`): it receives the learner's
spec over its connection, starts torchrun on its host, ships the workers' events and torchrun's exit back.

Why: across real machines there is no shared run directory. An operator starts one agent per learner host
(`python -m diloco_chaos.harness.hosts.agent --listen ADDR:PORT --secret-file F --work-dir DIR`) before any run; it
needs no spec at start and serves, one at a time, every supervisor that proves it holds the agents' secret. Per
connection (diloco_chaos/harness/hosts/agent_wire.py for the messages) it makes a fresh directory under its work dir
(0700) and, on each Start, writes the learner's spec there (0600: it holds the run's secret), with `run_dir` pointing to
that directory, so the workers (and their link process) append their events to a log on this host; it starts
torchrun with the same command line as on netns hosts (diloco_chaos/harness/hosts/workers.py), its workers tied to
the agent's pid. A tail thread sends the log's new complete lines (Events, at most MAX_BATCH lines each);
a watcher thread sends Exited with torchrun's exit code once it ends, after the last of its events. Process
chaos goes through Pids and Signal, limited to this connection's workers
(diloco_chaos/harness/hosts/workers.py `handle`).

When the supervisor hangs up (or the connection breaks: TCP keepalive notices a vanished machine within
KEEPALIVE_S), the agent kills what is left of the run's torchrun and workers, waits for them (bounded) and goes
back to accepting, or exits with `--once`. On SIGTERM it does the same and exits.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import pickle
import secrets
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from diloco_chaos.harness.hosts import agent_wire as w
from diloco_chaos.harness.hosts.torchrun_worker import PARENT_PID_ENV
from diloco_chaos.harness.hosts.workers import (
    LOG_NAME,
    SIGNALS,
    SPEC_NAME,
    WorkerCache,
    handle,
    keepalive,
    kill_workers,
    torchrun_command,
    write_spec,
)
from diloco_chaos.harness.learner.chip import ChipSpec
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.run.procutil import die_with_parent
from diloco_chaos.harness.wire.handshake import new_nonce, verify_challenge

log = logging.getLogger(__name__)

TAIL_S = 0.05
"""How often the tail thread looks for new event lines."""
MAX_BATCH = 512
"""Most lines in one Events message (a burst is sent as several)."""
IO_S = 30.0
"""Bound of the handshake's reads and of every send."""
STOP_S = 10.0
"""How long the agent waits for a torchrun it killed to be reaped."""
_conns = itertools.count()


@dataclass(frozen=True)
class RemoteAgentConfig:
    """The operator's settings (`python -m diloco_chaos.harness.hosts.agent --work-dir ...`)."""

    host: str
    """Address to listen on."""
    port: int
    """Port to listen on (0: any, logged)."""
    secret: bytes
    """The agents' secret, which a supervisor must prove it holds (from --secret-file)."""
    work_dir: str
    """Where each connection's directory is made (spec, events, torchrun's log)."""
    once: bool = False
    """Exit after serving one connection."""
    accept_s: float | None = None
    """With `once`: exit if no supervisor connects within this (None: wait as long as it takes)."""


class Session:
    """One supervisor's connection: its directory, its torchrun, the threads that report on it."""

    def __init__(self, cfg: RemoteAgentConfig, conn: socket.socket) -> None:
        self.cfg, self.conn = cfg, conn
        self.f = conn.makefile("rwb")
        self.send_lock = threading.Lock()
        self.tail_lock = threading.Lock()
        self.dir = Path(cfg.work_dir) / f"run-{os.getpid()}-{next(_conns)}-{secrets.token_hex(4)}"
        self.events_path = self.dir / EVENTS_FILE
        self.offset = 0
        self.partial = b""
        self.spec_path = ""
        self.popen: subprocess.Popen[bytes] | None = None
        self.cache: WorkerCache | None = None
        self.closed = threading.Event()

    def send(self, msg: w.Message) -> None:
        with self.send_lock:
            self.f.write(w.encode(msg))
            self.f.flush()

    def ship(self) -> None:
        """Send the event log's new complete lines (in batches)."""
        with self.tail_lock:
            if not self.events_path.exists():
                return
            with open(self.events_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
            self.offset += len(chunk)
            lines = (self.partial + chunk).split(b"\n")
            self.partial = lines.pop()
            text = [x.decode(errors="replace") for x in lines if x.strip()]
            for i in range(0, len(text), MAX_BATCH):
                self.send(w.Events(text[i:i + MAX_BATCH]))

    def tail(self) -> None:
        while not self.closed.wait(TAIL_S):
            try:
                self.ship()
            except (OSError, ValueError):  # the connection ended (ValueError: its file closed meanwhile)
                return

    def watch(self, popen: subprocess.Popen[bytes]) -> None:
        code = popen.wait()
        if self.closed.is_set():
            return
        try:
            self.ship()  # every event before the exit
            self.send(w.Exited(popen.pid, code))
        except (OSError, ValueError):
            pass

    def start(self, req: w.Start) -> w.Message:
        self.end_torchrun(signal.SIGKILL)
        try:
            spec = pickle.loads(w.unb64(req.spec))  # noqa: S301 - from an authenticated supervisor
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as e:
            return w.Failed(f"the spec cannot be read here: {type(e).__name__}: {e}")
        if not isinstance(spec, ChipSpec):
            return w.Failed(f"Start.spec is a {type(spec).__name__}, not a ChipSpec")
        secret = w.seal(self.cfg.secret, bytes.fromhex(req.seal_nonce), bytes.fromhex(req.sealed_secret))
        spec = dataclasses.replace(spec, run_dir=str(self.dir), secret_hex=secret.hex(), parent_pid=os.getpid(),
                                   netns="")
        path = self.dir / SPEC_NAME.format(m=req.learner)
        write_spec(path, spec)
        self.spec_path = str(path)
        self.cache = WorkerCache(self.spec_path)
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", **{PARENT_PID_ENV: str(os.getpid())})
        logf = open(self.dir / LOG_NAME.format(m=req.learner), "ab")  # noqa: SIM115 - closed below
        try:
            # started from the main thread: PR_SET_PDEATHSIG fires when that thread (the agent) ends
            self.popen = subprocess.Popen(torchrun_command(req.chips, req.rdzv_port, self.spec_path), env=env,
                                          stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                          preexec_fn=lambda: die_with_parent(os.getppid()))
        finally:
            logf.close()
        threading.Thread(target=self.watch, args=(self.popen,), name="torchrun-watch", daemon=True).start()
        return w.Started(self.popen.pid)

    def end_torchrun(self, sig: signal.Signals) -> list[int]:
        """Signal the connection's torchrun and its workers (their whole trees); reap torchrun if killed."""
        if self.popen is None:
            return []
        hit = []
        try:
            procs = [psutil.Process(self.popen.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.send_signal(sig)
                hit.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        if sig == signal.SIGKILL:
            kill_workers(self.spec_path)  # any worker torchrun no longer parents
            try:
                self.popen.wait(STOP_S)
            except subprocess.TimeoutExpired:
                log.warning("remote agent: torchrun %d not reaped within %ss", self.popen.pid, STOP_S)
            self.popen = None
        return hit

    def answer(self, req: w.Message) -> w.Message:
        if isinstance(req, w.Clock):
            return w.ClockReply(time.monotonic())
        if isinstance(req, w.Start):
            return self.start(req)
        if isinstance(req, w.Stop):
            sig = SIGNALS.get(req.signal)
            return w.Stopped(self.end_torchrun(sig)) if sig else w.Failed(f"unknown signal {req.signal!r:.30}")
        if not self.spec_path:
            return w.Failed("no learner started on this connection")
        if isinstance(req, w.Pids):
            assert self.cache is not None
            return w.PidsReply(self.cache.pids())
        if isinstance(req, w.Signal):
            got = handle(self.spec_path, {"op": "signal", "pids": req.pids, "signal": req.signal,
                                          "children": req.children}, self.cache)
            return w.Failed(str(got["error"])) if "error" in got else w.SignalReply(list(got["hit"]))
        return w.Failed(f"{type(req).__name__} is not a request")

    def serve(self) -> None:
        """Authenticate, then answer requests until the client hangs up."""
        self.conn.settimeout(IO_S)
        nonce = new_nonce()
        self.send(w.Hello(nonce.hex()))
        auth = w.read(self.f)
        if not isinstance(auth, w.Auth) or not verify_challenge(self.cfg.secret, nonce, w.AUTH_ID, auth.mac):
            self.send(w.Refused("authentication failed"))
            return
        self.dir.mkdir(mode=0o700, parents=True)  # only for a client that proved the secret
        self.send(w.Welcome(os.getpid(), str(self.dir)))
        self.conn.settimeout(None)  # idle between requests while the run lasts; sends stay bounded by keepalive
        keepalive(self.conn)
        if hasattr(socket, "TCP_USER_TIMEOUT"):  # a send the peer never acknowledges fails within IO_S
            self.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(IO_S * 1000))
        threading.Thread(target=self.tail, name="events-tail", daemon=True).start()
        while (req := w.read(self.f)) is not None:
            self.send(self.answer(req))

    def close(self) -> None:
        """End the session's processes and its connection. Never raises for a dead connection: a send that
        failed when the supervisor vanished (the events tail's, mid-batch) leaves bytes in the file's write
        buffer, and closing the file flushes them again (BrokenPipeError); raised here, it ended the agent."""
        self.closed.set()
        self.end_torchrun(signal.SIGKILL)
        try:
            self.f.close()
        except (OSError, ValueError) as e:
            log.info("remote host agent: unsent bytes of a dead connection dropped: %s", e)
        finally:
            self.conn.close()


_current: list[Session] = []


def serve_runs(cfg: RemoteAgentConfig) -> None:
    """Listen and serve one connection at a time (with `once`, one in all)."""
    def on_term(signum: int, frame: Any) -> None:
        for s in _current:
            s.closed.set()
            s.end_torchrun(signal.SIGKILL)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    os.makedirs(cfg.work_dir, mode=0o700, exist_ok=True)
    server = socket.create_server((cfg.host, cfg.port))
    log.info("remote host agent %d listening on %s:%d, work dir %s", os.getpid(), cfg.host,
             server.getsockname()[1], cfg.work_dir)
    server.settimeout(cfg.accept_s if cfg.once else None)
    try:
        while True:
            try:
                conn, peer = server.accept()
            except TimeoutError:
                log.warning("remote host agent: no supervisor within %ss", cfg.accept_s)
                return
            session = Session(cfg, conn)
            _current.append(session)
            try:
                session.serve()
            except (OSError, ValueError) as e:  # AgentProtocolError is a ValueError; so is malformed hex
                log.warning("remote host agent: connection from %s ended: %s", peer, e)
            finally:
                session.close()
                _current.remove(session)
            log.info("remote host agent: connection from %s ended; its processes are gone", peer)
            if cfg.once:
                return
    finally:
        server.close()
