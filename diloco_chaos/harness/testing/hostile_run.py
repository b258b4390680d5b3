"""A real run attacked by hostile peers while it trains, and what its syncer's event log says about it.

Why: `tests/wire/test_hostile_peers.py` asserts, and `bench/fuzz.py --live` measures, the same thing: a live
syncer sent hostile frames (`diloco_chaos/harness/testing/hostile_peer.py`) from authenticated and unauthenticated peers
stays up, merges the real learners' pushes, closes each hostile connection with a logged reason, and leaks no socket.
`run_under_attack` runs the scenario with the real Supervisor and attacks from a thread once every learner
joined; `tally` matches each attempt with the syncer's `conn_closed` event (by the attacker's address, which
is the peer the syncer logs); `syncer_peers` lists the sockets the syncer process holds (psutil).

The run's secret is the Supervisor's own (`Supervisor.secret`, made per run): the Supervisor is built here as
`run_scenario` builds it, and the attack reads the attribute, so the production API is unchanged. The syncer's
port and pid come from its `syncer_start` event.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.supervisor import Supervisor
from diloco_chaos.harness.testing.hostile_peer import Attempt, HostileConfig, attack

__all__ = ["ACCEPTED", "HostileTally", "LiveAttack", "Outcome", "outcomes", "refusal", "run_under_attack",
           "syncer_peers", "tally"]

ACCEPTED = "(accepted by the wire)"
"""`HostileTally.refused_by`'s key for attempts no frame check refused (the algorithm refused their PUSH)."""


@dataclass
class HostileTally:
    """What the syncer's event log says about a list of attempts."""

    attempts: int = 0
    """Hostile connections opened."""
    frames: int = 0
    """Hostile frames sent on them."""
    by_kind: Counter[str] = field(default_factory=Counter)
    """Hostile frames sent, by attack."""
    authenticated: int = 0
    """Hostile frames sent after a passed handshake."""
    closed_logged: int = 0
    """Attempts whose connection the syncer logged as closed (`conn_closed` with a reason)."""
    closed_seen: int = 0
    """Attempts whose close the attacker saw (EOF or reset) in time."""
    reasons: Counter[str] = field(default_factory=Counter)
    """The syncer's close reasons (up to the first colon)."""
    refused_by: Counter[str] = field(default_factory=Counter)
    """The syncer's `frame_rejected` / `auth_failed` kinds for the attempts (what check refused them)."""
    unlogged: list[str] = field(default_factory=list)
    """Peers of attempts with no `conn_closed` event: each one a defect."""


def refusal(event: dict[str, Any]) -> str:
    """What refused a connection, from its `frame_rejected` or `auth_failed` event: the frame check's kind, or
    for a handshake that failed past the frame checks, the error's type (PermissionError: bad credentials)."""
    return str(event.get("kind") or str(event.get("error", "")).split(":")[0] or event.get("ev"))


LOG_GRACE_S = 1.0
"""How long after the attacker saw its close the syncer's events for that connection may still be written
(the syncer logs `conn_closed` just after closing)."""


@dataclass(frozen=True)
class Outcome:
    """One attempt with what the syncer logged about its connection."""

    attempt: Attempt
    closed: str | None
    """The syncer's `conn_closed` reason; None: no such event (a defect)."""
    refused: str | None
    """What refused it (`refusal` of its `frame_rejected` / `auth_failed` event); None: the wire accepted it."""


def outcomes(attempts: list[Attempt], events: Iterable[dict[str, Any]]) -> list[Outcome]:
    """Each attempt with the syncer's events about its connection: those naming its peer address, logged
    between its connect and `LOG_GRACE_S` after the attacker saw the close (client ports are reused, so the
    address alone does not identify a connection over a long attack)."""
    by_peer: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("peer") and e.get("ev") in ("conn_closed", "frame_rejected", "auth_failed"):
            by_peer.setdefault(str(e["peer"]), []).append(e)
    out = []
    for a in attempts:
        mine = [e for e in by_peer.get(a.peer, []) if a.opened <= e["t"] <= a.ended + LOG_GRACE_S]
        closed = next((str(e.get("reason")) for e in mine if e["ev"] == "conn_closed"), None)
        refused = next((refusal(e) for e in mine if e["ev"] != "conn_closed"), None)
        out.append(Outcome(a, closed, refused))
    return out


def tally(attempts: list[Attempt], events: Iterable[dict[str, Any]]) -> HostileTally:
    """Count the attempts' `outcomes`."""
    t = HostileTally(attempts=len(attempts))
    for o in outcomes(attempts, events):
        a = o.attempt
        t.frames += a.frames
        t.by_kind[a.kind] += a.frames
        t.authenticated += a.frames if a.authenticated else 0
        t.closed_seen += a.closed_by_syncer
        t.refused_by[o.refused or ACCEPTED] += 1
        if o.closed is not None:
            t.closed_logged += 1
            t.reasons[o.closed.split(":")[0]] += 1
        else:
            t.unlogged.append(a.peer)
    return t


def syncer_peers(pid: int, port: int) -> set[str]:
    """Remote ends ("host:port") of the TCP connections process `pid` holds open on its listening `port`."""
    out = set()
    for c in psutil.Process(pid).net_connections(kind="tcp"):
        if c.laddr and c.laddr.port == port and c.raddr:
            out.add(f"{c.raddr.ip}:{c.raddr.port}")
    return out


@dataclass
class LiveAttack:
    """One run under attack: the run's outcome and the attack's."""

    run_dir: Path
    report: dict[str, Any]
    """The run's report.json content."""
    events: list[dict[str, Any]]
    """The run's whole event log."""
    pids: list[int]
    """Every process of the run (for a no-survivors check)."""
    attempts: list[Attempt]
    """Every hostile connection, in order."""
    tally: HostileTally
    started: float = 0.0
    """Monotonic time the attack began (comparable with the events' `t`); 0 if it never did."""
    ended: float = 0.0
    leaked: set[str] = field(default_factory=set)
    """Hostile peers the syncer process still held a socket to, up to `leak_wait_s` after the attack ended."""
    peers_after: int = -1
    """The syncer's open connections on its port then (the learners' own: at most one each once settled)."""
    error: str = ""
    """Why the attack stopped early, if it did."""

    learner: int = -1
    """The learner id the authenticated attacks claimed (its real connection was replaced by each)."""

    def reconnects(self) -> int:
        """How often the attacked learner's link came back up after the attack began."""
        return sum(1 for e in self.events if e["ev"] == "link_up" and e.get("learner") == self.learner
                   and e["t"] >= self.started)

    def merges(self, start: float, end: float = float("inf")) -> int:
        return sum(1 for e in self.events if e["ev"] == "merge" and start <= e["t"] <= end)

    @property
    def syncer_up(self) -> bool:
        """The syncer never failed, and finished the run itself."""
        kinds = {e["ev"] for e in self.events}
        return "syncer_done" in kinds and not kinds & {"syncer_error", "syncer_down"}

    @property
    def steps(self) -> dict[int, int]:
        return {int(m): int(d["steps"]) for m, d in self.report["per_learner"].items()}


class _Watch:
    """What the attack needs from the run's events as they come: the syncer's port and pid, who joined."""

    def __init__(self, learners: int) -> None:
        self.learners = learners
        self.port = 0
        self.pid = 0
        self.joined: set[int] = set()
        self.ready = threading.Event()

    def __call__(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            if e["ev"] == "syncer_start":
                self.port, self.pid = e["port"], e["pid"]
            elif e["ev"] == "learner_join":
                self.joined.add(e["learner"])
        if self.port and len(self.joined) == self.learners:
            self.ready.set()


def _settle(pid: int, port: int, hostile: set[str], learners: int, timeout_s: float) -> tuple[set[str], int]:
    """Wait up to `timeout_s` for the syncer to hold no socket of a `hostile` peer and at most one connection per
    learner (a learner reconnecting holds two for a moment: its new one, and the old one about to be replaced);
    returns the hostile peers still held and the syncer's connections on its port, then."""
    deadline = time.monotonic() + timeout_s
    while True:
        peers = syncer_peers(pid, port)
        held = peers & hostile
        if (not held and len(peers) <= learners) or time.monotonic() >= deadline:
            return held, len(peers)
        time.sleep(0.05)  # polling the process's sockets until the condition holds or the bound passes


def run_under_attack(sc: Scenario, run_root: str | Path, frames: int, seed: int = 0, learner: int | None = None,
                     wait_s: float = 60.0, leak_wait_s: float = 5.0) -> LiveAttack:
    """Run `sc`; once every learner joined, send `frames` hostile frames to its syncer from a thread, as the
    learner `learner` (default: the last) for the authenticated ones. `wait_s` bounds the wait for the run to
    reach training and for the attack thread at the end; the attack stops early if the run ends first."""
    learners = sc.topology.learners
    target = learners - 1 if learner is None else learner
    watch = _Watch(learners)
    sup = Supervisor(sc, run_root, on_events=watch)
    attempts: list[Attempt] = []
    out: dict[str, Any] = {}
    run_over = threading.Event()

    def hostile() -> None:
        try:
            if not watch.ready.wait(wait_s):
                raise TimeoutError(f"the run did not reach training within {wait_s}s")
            cfg = HostileConfig(watch.port, learners, sup.secret, learner=target)
            out["started"] = time.monotonic()
            attack(cfg, frames, seed=seed, stop=run_over.is_set, into=attempts)
            out["ended"] = time.monotonic()
            out["leaked"], out["peers_after"] = _settle(watch.pid, watch.port, {a.peer for a in attempts}, learners,
                                                        leak_wait_s)
        except Exception as e:  # noqa: BLE001 - reported in LiveAttack.error; the run goes on regardless
            out["error"] = f"{type(e).__name__}: {e}"

    thread = threading.Thread(target=hostile, name="hostile", daemon=True)
    thread.start()
    try:
        res = sup.run()
    finally:
        run_over.set()
        thread.join(wait_s)
    if thread.is_alive():
        out["error"] = f"the attack thread did not end within {wait_s}s"
    events = read_events(res.run_dir / EVENTS_FILE)
    return LiveAttack(res.run_dir, res.report, events, res.pids + list(res.report.get("chip_pids", [])), attempts,
                      tally(attempts, events), out.get("started", 0.0), out.get("ended", 0.0),
                      out.get("leaked", set()), out.get("peers_after", -1), out.get("error", ""), target)
