"""A run's timeline from its event log: the state of each learner and of the syncer over time, and each
fault that fired as a band with its start, its end and why it ends there.

Apart from the HTML page that draws them because these are readings of the event log that other views (the
CLI's final table, tools of users) can use without matplotlib. Times are seconds since the run's `run_start`
event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos.schedule import KILL_ACTIONS
from harness.metrics import fault_response
from harness.record import RunLog

Segment = tuple[str, float, float]
"""(state, t0, t1): a learner (or the syncer) was in `state` from t0 to t1, seconds since run start."""

STATE_COLORS: dict[str, str] = {
    "starting": "#c7c7c7",   # processes started, no step yet
    "training": "#2ca02c",   # stepping at full strength
    "slowed": "#bcbd22",     # a `slow` fault holds it to a fraction of the others' speed
    "shrunk": "#17becf",     # stepping with fewer chips (a chip killed, waiting to rejoin)
    "link_down": "#ff7f0e",  # stepping, but its link to the syncer is down
    "frozen": "#1f77b4",     # SIGSTOPped by a `freeze` fault
    "rejoining": "#9467bd",  # restarted, not stepping yet
    "down": "#d62728",       # killed, waiting for repair
    "done": "#f0f0f0",       # finished its steps
    "up": "#2ca02c",         # syncer serving
}
"""Every state a timeline row can be in, with its color."""


RECOVERED = {"learner_down": "until the restarted learner stepped again",
              "learner_shrink": "until the repaired chip rejoined", "syncer_down": "until the syncer was restored",
              "learner_leave": "until the learner rejoined the syncer"}
"""How a kill's band ends, by the first reaction to it (harness.metrics.fault_response)."""


# -- states from events ------------------------------------------------------------------------------------


@dataclass
class _Learner:
    """What is known about one learner at a point of the (time-sorted) event log."""

    stepping: bool = False
    done: bool = False
    down: bool = False
    restarted: bool = False
    frozen: bool = False
    slowed: bool = False
    link_down: bool = False
    missing: set[int] = field(default_factory=set)

    def state(self) -> str:
        """The one state shown; when several hold, the first of this order wins."""
        for name, holds in (("done", self.done), ("down", self.down), ("frozen", self.frozen),
                            ("rejoining", self.restarted), ("starting", not self.stepping),
                            ("link_down", self.link_down), ("shrunk", bool(self.missing)), ("slowed", self.slowed)):
            if holds:
                return name
        return "training"

    def apply(self, e: dict[str, Any]) -> None:
        kind, ev = e.get("kind"), e["ev"]
        if ev == "step":
            self.stepping, self.restarted = True, False
        elif ev == "learner_done":
            self.done = True
        elif ev == "learner_down":  # its processes are dead: no longer frozen, shrunk or linked
            self.down, self.stepping, self.frozen, self.link_down = True, False, False, False
            self.missing.clear()
        elif ev == "learner_restart":
            self.down, self.restarted = False, True
        elif ev in ("process_fault", "process_fault_off") and kind in ("freeze", "slow"):
            setattr(self, "frozen" if kind == "freeze" else "slowed", ev == "process_fault")
        elif ev == "learner_shrink":
            self.missing |= set(e.get("lost", []))
        elif ev in ("chip_joined", "chip_join_abandoned"):
            self.missing.discard(e.get("chip"))
        elif ev == "link_down" and not self.done:
            self.link_down = True
        elif ev == "link_up":
            self.link_down = False


def run_span(evs: list[dict[str, Any]]) -> tuple[float, float]:
    """(origin, end) of a time-sorted log: its run_start and run_end, else its first and last event."""
    t0 = next((e["t"] for e in evs if e["ev"] == "run_start"), evs[0]["t"])
    t1 = next((e["t"] for e in evs if e["ev"] == "run_end"), evs[-1]["t"])
    return t0, max(t0, t1)


def _learner_ids(evs: list[dict[str, Any]]) -> list[int]:
    n = next((e.get("learners", 0) for e in evs if e["ev"] == "run_start"), 0)
    seen = {e["learner"] for e in evs if isinstance(e.get("learner"), int)}
    return sorted(set(range(int(n))) | seen)


class _Row:
    """Builds one row's segments from state changes (zero-length segments dropped, equal neighbours merged)."""

    def __init__(self, state: str, t: float) -> None:
        self.segments: list[Segment] = []
        self.state, self.since = state, t

    def switch(self, state: str, t: float) -> None:
        if state == self.state:
            return
        self._close(t)
        self.state, self.since = state, t

    def _close(self, t: float) -> None:
        if t <= self.since:
            return
        if self.segments and self.segments[-1][0] == self.state and self.segments[-1][2] == self.since:
            self.segments[-1] = (self.state, self.segments[-1][1], t)
        else:
            self.segments.append((self.state, self.since, t))

    def finish(self, t: float) -> list[Segment]:
        self._close(t)
        return self.segments


def learner_timeline(events: Iterable[dict[str, Any]]) -> dict[int, list[Segment]]:
    """Per learner, its states over the run as [(state, t0, t1)], seconds since run start, contiguous.

    States (the first that holds wins): done (after learner_done), down (learner_down -> learner_restart),
    frozen (process_fault freeze -> process_fault_off), rejoining (learner_restart -> its next step),
    starting (run start -> its first step), link_down (link_down -> link_up), shrunk (learner_shrink ->
    every lost chip's chip_joined), slowed (process_fault slow -> process_fault_off), else training.
    """
    evs = sorted(events, key=lambda e: e["t"])
    if not evs:
        return {}
    t0, t_end = run_span(evs)
    ids = _learner_ids(evs)
    known = {m: _Learner() for m in ids}
    rows = {m: _Row("starting", 0.0) for m in ids}
    for e in evs:
        m = e.get("learner")
        if m not in known:
            continue
        known[m].apply(e)
        rows[m].switch(known[m].state(), _rel(e["t"], t0, t_end))
    return {m: row.finish(t_end - t0) for m, row in rows.items()}


def syncer_timeline(events: Iterable[dict[str, Any]]) -> list[Segment]:
    """The syncer's states: starting (to its first syncer_start), up, down (from its kill, or the supervisor
    seeing it dead, to its replacement's syncer_start), done (after syncer_done)."""
    evs = sorted(events, key=lambda e: e["t"])
    if not evs:
        return []
    t0, t_end = run_span(evs)
    row = _Row("starting", 0.0)
    for e in evs:
        ev = e["ev"]
        if ev == "syncer_start":
            row.switch("up", _rel(e["t"], t0, t_end))
        elif ev == "syncer_down" or (ev == "process_fault" and e.get("kind") == "kill_syncer"):
            row.switch("down", _rel(e["t"], t0, t_end))
        elif ev == "syncer_done":
            row.switch("done", _rel(e["t"], t0, t_end))
    return row.finish(t_end - t0)


def _rel(t: float, t0: float, t_end: float) -> float:
    return min(max(t, t0), t_end) - t0


def state_durations(segments: list[Segment]) -> dict[str, float]:
    """Seconds spent in each state, in order of first appearance."""
    out: dict[str, float] = defaultdict(float)
    for state, a, b in segments:
        out[state] += b - a
    return dict(out)


def fault_bands(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each fault that fired, as a band: index, action, learner, describe, start_s, end_s, until (why it ends
    there), missed (the fault hit nothing), detect_s and rejoin_s (kills). Kills end at their recovery."""
    evs = sorted(events, key=lambda e: e["t"])
    if not evs:
        return []
    t0, t_end = run_span(evs)
    ends = {e["index"]: e for e in evs if e["ev"] == "fault_end"}
    responses = {r["index"]: r for r in fault_response(RunLog.from_dicts(evs, strict=True).records)}
    out = []
    for f in (e for e in evs if e["ev"] == "fault_start"):
        i = f["index"]
        resp = responses.get(i, {})
        band = {"index": i, "action": f.get("action"), "learner": f.get("learner"), "describe": f.get("describe"),
                "trigger": f.get("reason"), "start_s": round(_rel(f["t"], t0, t_end), 3),
                "missed": f.get("missed"), "detect_s": resp.get("detect_s"), "rejoin_s": resp.get("rejoin_s")}
        if f.get("action") in KILL_ACTIONS:
            back = resp.get("detect_s") is not None and resp.get("rejoin_s") is not None
            end = f["t"] + resp["detect_s"] + resp["rejoin_s"] if back else t_end
            band["until"] = (RECOVERED.get(str(resp.get("reaction")), "recovered") if back
                             else "not recovered by run end")
        else:
            end = ends[i]["t"] if i in ends else t_end
            band["until"] = ends[i].get("reason", "fault_end") if i in ends else "still on at run end"
        band["end_s"] = round(_rel(end, t0, t_end), 3)
        out.append(band)
    return out
