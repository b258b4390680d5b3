"""The supervisor's side of `[launch] hosts = "remote"`: learner hosts on other machines, each reached through
the host agent an operator started there (diloco_chaos/harness/hosts/remote_agent.py), with no filesystem shared.

Why: across machines the supervisor can neither fork a learner's processes nor read what they write. Per
learner it connects to the agent named in `[launch] agents`, proves it holds the agents' secret
(`launch.agent_secret_file`, the HMAC challenge of diloco_chaos/harness/wire/handshake.py), measures the agent's clock,
and then, for each generation of the learner, sends its spec (Start: the ChipSpec pickled, the run's secret sealed) and
gets torchrun's pid back. A reader thread per connection takes what the agent sends unprompted: the workers'
event lines, appended to the run's events.jsonl (so the report, the invariants and replay read one log as
with local processes), and torchrun's exit code, which `RemoteLearner` hands to the supervisor as a local
process's exit code (its `sentinel` becomes readable), so the restart policy applies unchanged. A connection
that breaks counts as the learner's exit with LOST_CODE.

Clocks: each event's `t` is CLOCK_MONOTONIC of the machine that wrote it. At connect the supervisor asks the
agent for its clock CLOCK_SAMPLES times and keeps the sample with the shortest round trip: if the agent's
reading lies inside that round trip, the two share one clock (one machine: netns hosts) and `t` is kept; else
the offset to the round trip's midpoint (NTP-style, accurate to half the round trip) is subtracted from every
shipped event's `t`. Both figures are in the `agent_connected` event.

`RemoteHosts` is the `Hosts` (diloco_chaos/harness/hosts/base.py) of that launch: like
diloco_chaos/harness/hosts/torchrun.py `TorchrunHosts`, one process stands for each learner's chips, and the
supervisor's process chaos goes through the agents.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pickle
import queue
import secrets
import signal
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any

from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.hosts import agent_wire as w
from diloco_chaos.harness.hosts.agent import AgentError
from diloco_chaos.harness.hosts.agent_wire import parse_agent
from diloco_chaos.harness.hosts.base import HostsUnavailable, Proc, Routes, Spawner
from diloco_chaos.harness.hosts.workers import RDZV_PORT
from diloco_chaos.harness.learner.chip import ChipSpec
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.run import AgentConnected
from diloco_chaos.harness.wire.handshake import sign_challenge

log = logging.getLogger(__name__)

CLOCK_SAMPLES = 5
LOST_CODE = 255
"""The exit code a learner gets when its agent's connection breaks."""


def read_secret(path: str) -> bytes:
    """The agents' secret (hex) from a file only its owner can read; ValueError if others can, or it is empty."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: mode {stat.S_IMODE(mode):o}: must be readable by its owner only (chmod 600)")
    with open(path) as f:
        secret = bytes.fromhex(f.read().strip())
    if not secret:
        raise ValueError(f"{path}: empty")
    return secret


def clock_offset(t0: float, t1: float, agent_now: float) -> tuple[float, float, bool]:
    """(offset, round trip, same clock) of one clock sample: asked at `t0`, answered `agent_now`, received at `t1`
    (this machine's CLOCK_MONOTONIC). A reading inside [t0, t1] is the same clock (offset 0); else the offset to
    the midpoint, accurate to half the round trip."""
    same = t0 <= agent_now <= t1
    return (0.0 if same else agent_now - (t0 + t1) / 2), t1 - t0, same


def shift_lines(lines: list[str], offset_s: float) -> list[str]:
    """Event lines with `t` moved onto this machine's clock (`t - offset_s`); unchanged when the offset is 0. A
    line that is not an event with a numeric `t` is dropped."""
    if not offset_s:
        return lines
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
            rec["t"] = float(rec["t"]) - offset_s
            out.append(json.dumps(rec, separators=(",", ":")))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return out


class AgentConnection:
    """One authenticated connection to a remote agent: requests one at a time, a reader thread for the rest."""

    def __init__(self, learner: int, address: str, secret: bytes, timeout_s: float, events_path: Path) -> None:
        self.learner, self.address, self.secret, self.timeout_s = learner, address, secret, timeout_s
        host, port = parse_agent(address)
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.f = self.sock.makefile("rwb")
        try:
            hello = w.expect(w.read(self.f), w.Hello)
            self._send(w.Auth(sign_challenge(secret, bytes.fromhex(hello.nonce), w.AUTH_ID)))
            welcome = w.expect(w.read(self.f), w.Welcome)
            self.agent_pid, self.work_dir = welcome.agent_pid, welcome.work_dir
            self.local_address = self.sock.getsockname()[0]
            self.offset_s, self.rtt_s, self.same_clock = self._clock()
        except BaseException:
            self.f.close()
            self.sock.close()
            raise
        self.sock.settimeout(None)  # the reader thread waits as long as the run lasts; requests are bounded below
        self.replies: queue.Queue[w.Message | None] = queue.Queue()
        self.lock = threading.Lock()
        self.events_fd = os.open(events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.learner_proc: RemoteLearner | None = None
        self.exits: dict[int, int] = {}  # torchrun pid -> exit code, reported before its learner was attached
        self.exit_lock = threading.Lock()
        self.lost = False
        self.reader = threading.Thread(target=self._read, name=f"agent{learner}-reader", daemon=True)
        self.reader.start()

    def _send(self, msg: w.Message) -> None:
        self.f.write(w.encode(msg))
        self.f.flush()

    def _clock(self) -> tuple[float, float, bool]:
        best: tuple[float, float, float] | None = None
        for _ in range(CLOCK_SAMPLES):
            t0 = time.monotonic()
            self._send(w.Clock())
            now = w.expect(w.read(self.f), w.ClockReply).now
            t1 = time.monotonic()
            if best is None or t1 - t0 < best[1] - best[0]:
                best = (t0, t1, now)
        assert best is not None
        return clock_offset(*best)

    def _read(self) -> None:
        try:
            while (msg := w.read(self.f)) is not None:
                if isinstance(msg, w.Events):
                    self._append(msg.lines)
                elif isinstance(msg, w.Exited):
                    with self.exit_lock:
                        if self.learner_proc is not None and self.learner_proc.pid == msg.torchrun_pid:
                            self.learner_proc.ended(msg.code)
                        else:  # before its Started reply was taken (a torchrun that failed at once)
                            self.exits[msg.torchrun_pid] = msg.code
                else:
                    self.replies.put(msg)
        except (OSError, ValueError) as e:
            log.warning("agent of learner %d (%s): connection ended: %s", self.learner, self.address, e)
        self.lost = True
        self.replies.put(None)
        with self.exit_lock:
            if self.learner_proc is not None:
                self.learner_proc.ended(LOST_CODE)

    def _append(self, lines: list[str]) -> None:
        """The workers' events into the run's log, `t` moved onto this machine's clock if the agent's differs."""
        lines = shift_lines(lines, self.offset_s)
        if lines:
            os.write(self.events_fd, ("\n".join(lines) + "\n").encode())

    def request(self, msg: w.Message, reply: type[Any]) -> Any:
        """Send one request and wait (timeout_s at most) for its reply; AgentError if refused, late or lost."""
        with self.lock:
            if self.lost:
                raise AgentError(f"agent {self.address}: the connection is lost")
            try:
                self._send(msg)
                got = self.replies.get(timeout=self.timeout_s)
            except queue.Empty:  # a reply that comes later would answer the next request: the connection is done
                self._hang_up()
                raise AgentError(f"agent {self.address}: no answer to {type(msg).__name__} within "
                                 f"{self.timeout_s}s") from None
            except OSError as e:
                raise AgentError(f"agent {self.address}: {e}") from e
        if got is None:
            raise AgentError(f"agent {self.address} closed the connection")
        try:
            return w.expect(got, reply)
        except w.AgentProtocolError as e:
            raise AgentError(f"agent {self.address}: {e}") from e

    def attach(self, proc: RemoteLearner) -> None:
        """`proc` is the learner's torchrun now: its Exited (even one already received) ends it."""
        with self.exit_lock:
            self.learner_proc = proc
            if proc.pid in self.exits:
                proc.ended(self.exits.pop(proc.pid))

    def _hang_up(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._hang_up()
        self.reader.join(self.timeout_s)
        self.f.close()
        self.sock.close()
        os.close(self.events_fd)


class RemoteLearner:
    """A learner's torchrun on a remote host, as the supervisor watches a process: pid, exitcode, sentinel,
    is_alive, join; `signal_tree` instead of signalling a local pid (the pid is the remote host's)."""

    def __init__(self, conn: AgentConnection, pid: int, name: str) -> None:
        self.conn, self.pid, self.name = conn, pid, name
        self.exitcode: int | None = None
        self._read_fd, self._write_fd = os.pipe()
        self.sentinel = self._read_fd
        self._done = threading.Event()

    def ended(self, code: int) -> None:
        if self._done.is_set():
            return
        self.exitcode = code
        self._done.set()
        os.write(self._write_fd, b"x")

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def signal_tree(self, sig: int) -> None:
        """The agent signals torchrun and its workers."""
        if self.exitcode is None:
            try:
                self.conn.request(w.Stop(signal.Signals(sig).name), w.Stopped)
            except AgentError as e:
                log.warning("%s: %s", self.name, e)

    def close(self) -> None:
        self._done.set()  # a late `ended` writes nothing to the closed pipe
        for fd in (self._read_fd, self._write_fd):
            os.close(fd)


class RemoteHosts:
    """Every learner's agent connection for one run (`[launch] hosts = "remote"`)."""

    def __init__(self, sc: Scenario, conns: dict[int, AgentConnection], secret: bytes, run_secret: bytes,
                 spawner: Spawner) -> None:
        self.sc, self.conns, self.secret, self.run_secret, self.spawner = sc, conns, secret, run_secret, spawner
        self.started: list[RemoteLearner] = []

    @classmethod
    def open(cls, sc: Scenario, run_dir: Path, run_secret: bytes, events: EventLog, spawner: Spawner) -> RemoteHosts:
        """Connect to every learner's agent; HostsUnavailable says which failed and why."""
        try:
            secret = read_secret(sc.launch.agent_secret_file)
        except (OSError, ValueError) as e:
            raise HostsUnavailable(f"launch.agent_secret_file: {e}") from e
        conns: dict[int, AgentConnection] = {}
        try:
            for m, address in enumerate(sc.launch.agents):
                try:
                    c = AgentConnection(m, address, secret, sc.timeouts.startup_s, run_dir / EVENTS_FILE)
                except (OSError, ValueError) as e:  # AgentProtocolError is a ValueError
                    raise HostsUnavailable(f"launch.agents[{m}] = {address!r}: {type(e).__name__}: {e}") from e
                conns[m] = c
                events.write(AgentConnected(learner=m, address=address, agent_pid=c.agent_pid, work_dir=c.work_dir,
                                            local_address=c.local_address, clock_offset_s=c.offset_s,
                                            rtt_s=round(c.rtt_s, 6), same_clock=c.same_clock))
            local = {c.local_address for c in conns.values()}
            if len(local) != 1:
                raise HostsUnavailable(f"launch.agents: the agents are reached from different local addresses "
                                       f"{sorted(local)}: the syncer and the store listen on one (route every "
                                       "agent through one interface)")
        except BaseException:
            for c in conns.values():
                c.close()
            raise
        return cls(sc, conns, secret, run_secret, spawner)

    @property
    def listen(self) -> str:
        """Where the syncer and the store listen: this machine's address on its route to the agents."""
        return next(iter(self.conns.values())).local_address

    def connect(self, syncer_ports: list[int]) -> Routes:
        return Routes.direct(self.sc.topology.learners, syncer_ports)

    @property
    def link_chaos(self) -> LinkChaos | None:
        """None: no proxy on remote hosts (links.proxy auto or off, validated), nothing here carries faults."""
        return None

    def start_learner(self, spec: ChipSpec) -> dict[int, Proc]:
        """Send learner m's spec to its agent and have it start torchrun there: one process for every chip."""
        m = spec.learner
        conn = self.conns[m]
        nonce = secrets.token_bytes(16)
        blank = dataclasses.replace(spec, rank=0, secret_hex="", netns="")
        started = conn.request(w.Start(m, spec.size, RDZV_PORT + spec.generation % 1000,
                                       w.b64(pickle.dumps(blank)),
                                       w.seal(self.secret, nonce, self.run_secret).hex(), nonce.hex()), w.Started)
        proc = RemoteLearner(conn, started.torchrun_pid, f"learner{m}.torchrun")
        conn.attach(proc)
        self.started.append(proc)
        self.spawner.register_process(proc.name, proc)
        return dict.fromkeys(range(spec.size), proc)

    def start_chip(self, spec: ChipSpec) -> Proc:
        raise NotImplementedError("launch.hosts = 'remote' restarts a learner whole (no recovery.policy shrink)")

    def chip_pids(self, learner: int, chips: list[Proc]) -> list[int]:
        return list(self.conns[learner].request(w.Pids(), w.PidsReply).pids)

    def send(self, learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        return list(self.conns[learner].request(w.Signal(pids, sig.name, children), w.SignalReply).hit)

    def close(self) -> None:
        """Hang up on every agent: each kills what is left of its run's processes."""
        for c in self.conns.values():
            c.close()
        self.conns.clear()
        for p in self.started:
            p.close()
        self.started.clear()
