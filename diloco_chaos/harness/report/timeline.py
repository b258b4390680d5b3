"""A run's timeline from its event log: the state of each learner and of the syncer over time, and each
fault that fired as a band with its start, its end and why it ends there.

Apart from the HTML page that draws them because these are readings of the event log that other views (the
CLI's final table, tools of users) can use without matplotlib. Times are seconds since the run's `run_start`
event.

Every function reads typed records (diloco_chaos/harness/record: a FinishedRun's `run.log.records`); decoded dicts are
still accepted and parsed on the way in (leniently, as RunLog.load parses a file), for callers not yet moved to records.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diloco_chaos.chaos.schedule import KILL_ACTIONS
from diloco_chaos.harness.record import Event, RunLog
from diloco_chaos.harness.record.learner import ChipJoined, LearnerDone, LinkDown, LinkUp, Step
from diloco_chaos.harness.record.run import (
    ChipJoinAbandoned,
    FaultEnd,
    FaultStart,
    LearnerDown,
    LearnerRestart,
    LearnerShrink,
    ProcessFault,
    ProcessFaultOff,
    RunEnd,
    RunStart,
    SyncerDown,
)
from diloco_chaos.harness.record.syncer import LearnerBye, LearnerJoin, SyncerDone, SyncerStart

Events = Iterable[Event | Mapping[str, Any]]
"""What the timeline functions take: records, or decoded events (parsed on the way in)."""

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
"""How a kill's band ends, by the first reaction to it (`fault_response`)."""


# -- faults: the reactions to each, and its end ------------------------------------------------------------

REACTIONS = ("learner_down", "learner_shrink", "learner_leave", "syncer_down")
BACK = {"learner_down": ("learner_restart",), "learner_shrink": ("chip_joined",),
        "syncer_down": ("syncer_restore", "lighthouse_ready")}
"""The record that says a reaction is over; the torchft target's coordinator, the Lighthouse, is back when a
restarted one is ready (it keeps no state to restore)."""


def concerns(f: FaultStart, e: Event) -> bool:
    """Whether reaction `e` concerns fault `f`'s target: a `syncer_down` belongs to a fault on the syncer
    (kill_syncer) and to nothing else; every other reaction names a learner and belongs to a fault on that
    learner (its processes, its host or its link). A syncer crash that happens while a link is degraded is not
    a reaction to the link fault."""
    on_syncer = f.action == "kill_syncer" or f.learner is None
    if e.ev == "syncer_down":
        return on_syncer
    return not on_syncer and _learner(e) == f.learner


@dataclass
class _Tracked:
    """One fault being followed: its first reaction, then the record that says it is back."""

    fault: FaultStart
    closed: bool = False
    """A lasting fault ended (its fault_end) before any reaction, or the fault hit nothing: no reaction counts."""
    reaction: Event | None = None
    restarted: bool = False
    """learner_down: the learner was restarted; it is back at its next step."""
    back: Event | None = None


class FaultReactions:
    """Follows each fault from its start to its first reaction and recovery, record by record (time order).

    One definition for the live run and the finished one: the supervisor's fault runner feeds it the records it
    tails and logs a kill's `fault_end` when `feed` says the kill recovered; `fault_response` feeds it a whole
    log. A reaction counts for a fault only if it concerns the fault's target (`concerns`), happened at or after
    its start, while it was on (a kill is on until its recovery), and is not a learner leaving after its own
    BYE (it finished its steps: it was not dropped). Back: a restarted learner's first step, the repaired
    chip's chip_joined, the syncer's syncer_restore, a dropped learner's learner_join."""

    def __init__(self) -> None:
        self.tracked: dict[int, _Tracked] = {}
        self._bye: dict[Any, float] = {}

    def feed(self, e: Event) -> list[int]:
        """Take one record; the indices of the kill faults it shows recovered (usually none)."""
        if isinstance(e, FaultStart):
            self.tracked[e.index] = _Tracked(e, closed=e.missed is not None)  # one that hit nothing: no reaction
            return []
        if isinstance(e, LearnerBye):
            self._bye.setdefault(e.learner, e.t)
        if isinstance(e, FaultEnd) and e.index in self.tracked and e.action not in KILL_ACTIONS:
            self.tracked[e.index].closed = True
        recovered = []
        for i, k in self.tracked.items():
            if k.back is not None:
                continue
            who = k.fault.learner
            if k.reaction is None:
                if (not k.closed and e.ev in REACTIONS and e.t >= k.fault.t and concerns(k.fault, e)
                        and not (e.ev == "learner_leave" and e.t >= self._bye.get(who, math.inf))):
                    k.reaction = e
                continue
            react = k.reaction.ev
            if react == "learner_down":
                if not k.restarted:
                    k.restarted = isinstance(e, LearnerRestart) and e.learner == who
                elif isinstance(e, Step) and e.learner == who:
                    k.back = e
            elif (react == "learner_leave" and isinstance(e, LearnerJoin) and e.learner == who) or (
                    e.ev in BACK.get(react, ()) and _learner(e, who) == who):
                k.back = e
            if k.back is not None and k.fault.action in KILL_ACTIONS:
                recovered.append(i)
        return recovered

    def row(self, index: int) -> dict[str, Any]:
        """The fault_response row of fault `index`."""
        k = self.tracked[index]
        f, react, back = k.fault, k.reaction, k.back
        return {"index": f.index, "action": f.action, "learner": f.learner,
                "detect_s": round(react.t - f.t, 3) if react else None,
                "reaction": react.ev if react else None,
                "rejoin_s": round(back.t - react.t, 3) if back is not None and react is not None else None}


def fault_response(evs: Sequence[Event]) -> list[dict[str, Any]]:
    """Per fault that hit a process or link: time to detect (fault start -> the first reaction to it: the
    supervisor's learner_down / learner_shrink / syncer_down, or the syncer dropping the learner), and time to
    rejoin (that reaction -> the learner stepping again, the repaired chip joined, or the syncer restored or
    the Lighthouse ready again).
    Each reaction is the fault's own (`concerns`: a syncer_down only for a fault on the syncer, a learner's
    reactions only for a fault on that learner), counted while the fault was on (`FaultReactions`): report.json,
    the HTML report and the live output all read this definition, so they agree. A kill whose `fault_end`
    recorded its recovery (the supervisor followed it live, its records in the order it read them) is measured
    from that record: its reaction and `ended_t`, so that two records written at nearly the same time by two
    processes cannot make report.json's figures and the fault's logged end disagree."""
    ordered = sorted(evs, key=lambda e: e.t)
    tracker = FaultReactions()
    for e in ordered:
        tracker.feed(e)
    rows = []
    for i in sorted(tracker.tracked, key=lambda i: (tracker.tracked[i].fault.t, i)):
        row, f = tracker.row(i), tracker.tracked[i].fault
        end = next((e for e in ordered if isinstance(e, FaultEnd) and e.index == i and e.ended_t is not None
                    and e.reaction is not None), None)
        react = end and next((e for e in ordered if e.ev == end.reaction and e.t >= f.t and concerns(f, e)), None)
        if end is not None and end.ended_t is not None and react is not None:
            row.update(detect_s=round(react.t - f.t, 3), reaction=react.ev, rejoin_s=round(end.ended_t - react.t, 3))
        rows.append(row)
    return rows


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

    def apply(self, e: Event) -> None:
        if isinstance(e, Step):
            self.stepping, self.restarted = True, False
        elif isinstance(e, LearnerDone):
            self.done = True
        elif isinstance(e, LearnerDown):  # its processes are dead: no longer frozen, shrunk or linked
            self.down, self.stepping, self.frozen, self.link_down = True, False, False, False
            self.missing.clear()
        elif isinstance(e, LearnerRestart):
            self.down, self.restarted = False, True
        elif isinstance(e, ProcessFault | ProcessFaultOff) and e.kind in ("freeze", "slow"):
            setattr(self, "frozen" if e.kind == "freeze" else "slowed", isinstance(e, ProcessFault))
        elif isinstance(e, LearnerShrink):
            self.missing |= set(e.lost)
        elif isinstance(e, ChipJoined | ChipJoinAbandoned):
            self.missing.discard(e.chip)
        elif isinstance(e, LinkDown) and not self.done:
            self.link_down = True
        elif isinstance(e, LinkUp):
            self.link_down = False


def records(events: Events) -> list[Event]:
    """The events as records sorted by time; decoded dicts among them are parsed (lenient, as RunLog.load)."""
    recs: list[Event] = []
    dicts: list[Mapping[str, Any]] = []
    for e in events:
        (recs if isinstance(e, Event) else dicts).append(e)  # type: ignore[arg-type]
    return sorted([*recs, *RunLog.from_dicts(dicts).records], key=lambda e: e.t)


def run_span(evs: list[Event]) -> tuple[float, float]:
    """(origin, end) of a time-sorted log: its run_start and run_end, else its first and last event."""
    t0 = next((e.t for e in evs if isinstance(e, RunStart)), evs[0].t)
    t1 = next((e.ended for e in evs if isinstance(e, RunEnd)), evs[-1].t)
    return t0, max(t0, t1)


def _learner(e: Event, default: Any = None) -> Any:
    return getattr(e, "learner", default)


def _learner_ids(evs: list[Event]) -> list[int]:
    n = next((e.learners for e in evs if isinstance(e, RunStart)), 0)
    seen = {m for m in map(_learner, evs) if isinstance(m, int)}
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


def learner_timeline(events: Events) -> dict[int, list[Segment]]:
    """Per learner, its states over the run as [(state, t0, t1)], seconds since run start, contiguous.

    States (the first that holds wins): done (after learner_done), down (learner_down -> learner_restart),
    frozen (process_fault freeze -> process_fault_off), rejoining (learner_restart -> its next step),
    starting (run start -> its first step), link_down (link_down -> link_up), shrunk (learner_shrink ->
    every lost chip's chip_joined), slowed (process_fault slow -> process_fault_off), else training.
    """
    evs = records(events)
    if not evs:
        return {}
    t0, t_end = run_span(evs)
    ids = _learner_ids(evs)
    known = {m: _Learner() for m in ids}
    rows = {m: _Row("starting", 0.0) for m in ids}
    for e in evs:
        m = _learner(e)
        if m not in known:
            continue
        known[m].apply(e)
        rows[m].switch(known[m].state(), _rel(e.t, t0, t_end))
    return {m: row.finish(t_end - t0) for m, row in rows.items()}


def syncer_timeline(events: Events) -> list[Segment]:
    """The syncer's states: starting (to its first syncer_start), up, down (from its kill, or the supervisor
    seeing it dead, to its replacement's syncer_start), done (after syncer_done)."""
    evs = records(events)
    if not evs:
        return []
    t0, t_end = run_span(evs)
    row = _Row("starting", 0.0)
    for e in evs:
        if isinstance(e, SyncerStart):
            row.switch("up", _rel(e.t, t0, t_end))
        elif isinstance(e, SyncerDown) or (isinstance(e, ProcessFault) and e.kind == "kill_syncer"):
            row.switch("down", _rel(e.t, t0, t_end))
        elif isinstance(e, SyncerDone):
            row.switch("done", _rel(e.t, t0, t_end))
    return row.finish(t_end - t0)


def _rel(t: float, t0: float, t_end: float) -> float:
    return min(max(t, t0), t_end) - t0


def state_durations(segments: list[Segment]) -> dict[str, float]:
    """Seconds spent in each state, in order of first appearance."""
    out: dict[str, float] = defaultdict(float)
    for state, a, b in segments:
        out[state] += b - a
    return dict(out)


def fault_end_t(e: FaultEnd) -> float:
    """When a fault's effect ended, by its fault_end: a kill's recovery (`ended_t`), else the event's `t`."""
    return e.ended_t if e.ended_t is not None else e.t


@dataclass(frozen=True)
class FaultSpan:
    """One fault that fired, with its start, its end and why it ends there: the one reading of a fault's span that
    report.json (`report_row`), the HTML page and the CLI's table (`band`) and replay (`replay_row`) all take."""

    index: int
    action: str
    learner: int | None
    describe: str
    trigger: str
    """Which trigger fired it (fault_start `reason`)."""
    start_s: float
    """Seconds since the run's origin (`origin`), rounded to ms."""
    end_s: float
    until: str
    """Why it ends at end_s (fault_end `reason`, or what the timeline read instead)."""
    missed: str | None
    reaction: str | None
    detect_s: float | None
    rejoin_s: float | None
    start_progress: dict[str, Any]
    """Training progress when it started: {"steps": {learner: step}, "merges": n}."""
    end_progress: dict[str, Any] | None
    """Training progress at its fault_end (None without one)."""
    origin: float
    """`t` the seconds count from: the run's run_start, else its first event."""

    def band(self) -> dict[str, Any]:
        """As a band of the HTML page and the CLI's table."""
        return {"index": self.index, "action": self.action, "learner": self.learner, "describe": self.describe,
                "trigger": self.trigger, "start_s": self.start_s, "missed": self.missed, "reaction": self.reaction,
                "detect_s": self.detect_s, "rejoin_s": self.rejoin_s, "until": self.until, "end_s": self.end_s}

    def report_row(self, start: float) -> dict[str, Any]:
        """As report.json `faults` lists it, in seconds since `start` (the report's origin: the same in a run)."""
        shift = self.origin - start
        return {"index": self.index, "describe": self.describe, "start_s": round(self.start_s + shift, 3),
                "start_reason": self.trigger, "start_progress": self.start_progress,
                "end_s": round(self.end_s + shift, 3), "end_reason": self.until, "end_progress": self.end_progress}

    def replay_row(self) -> dict[str, Any]:
        """As replay compares it: what fired, at which trigger, and the progress seen then."""
        return {"index": self.index, "describe": self.describe, "trigger": self.trigger,
                "steps": self.start_progress["steps"], "merges": self.start_progress["merges"]}


def fault_timeline(events: Events) -> list[FaultSpan]:
    """Each fault that fired, in firing order, as a FaultSpan (missed: the fault hit nothing; reaction, detect_s
    and rejoin_s: `fault_response`).

    One definition of a fault's span, read from the event log: from its `fault_start` to its `fault_end`
    (`fault_end_t`: a kill's fault_end is written at its recovery). A run that ended without a fault_end
    (it died) ends the span at the end of the run; a kill in a run written before kills ended at their
    recovery (its fault_end says "end of run", without `ended_t`) ends at the recovery `fault_response`
    measures."""
    evs = records(events)
    if not evs:
        return []
    t0, t_end = run_span(evs)
    ends = {e.index: e for e in evs if isinstance(e, FaultEnd)}
    responses = {r["index"]: r for r in fault_response(evs)}
    out = []
    for f in (e for e in evs if isinstance(e, FaultStart)):
        i = f.index
        resp = responses.get(i, {})
        fe = ends.get(i)
        if fe is not None and not (f.action in KILL_ACTIONS and fe.ended_t is None and fe.reason == "end of run"):
            end, until = fault_end_t(fe), fe.reason
        elif f.action in KILL_ACTIONS:  # an older run: a kill's fault_end came only at the end of the run
            back = resp.get("detect_s") is not None and resp.get("rejoin_s") is not None
            end = f.t + resp["detect_s"] + resp["rejoin_s"] if back else t_end
            until = RECOVERED.get(str(resp.get("reaction")), "recovered") if back else "not recovered by run end"
        else:
            end, until = t_end, "still on at run end"
        out.append(FaultSpan(index=i, action=f.action, learner=f.learner, describe=f.describe, trigger=f.reason,
                             start_s=round(_rel(f.t, t0, t_end), 3), end_s=round(_rel(end, t0, t_end), 3),
                             until=until, missed=f.missed, reaction=resp.get("reaction"),
                             detect_s=resp.get("detect_s"), rejoin_s=resp.get("rejoin_s"),
                             start_progress=f.progress, end_progress=fe.progress if fe is not None else None,
                             origin=t0))
    return out


def fault_bands(events: Events) -> list[dict[str, Any]]:
    """Each fault that fired, as a band (`FaultSpan.band` of `fault_timeline`): index, action, learner, describe,
    trigger, start_s, end_s, until (why it ends there), missed, reaction, detect_s and rejoin_s."""
    return [s.band() for s in fault_timeline(events)]
