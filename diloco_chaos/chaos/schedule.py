"""Fault schedules: what to break, when (by training progress or time), and until when.

A scenario's `[[faults]]` entries become `FaultSpec`s, validated with the rest
of the scenario before any process starts. While the run goes, the
supervisor feeds every event it reads into a `FaultSchedule`, whose `decide`
is a pure function of (progress, clock): it says which faults start and which
end now, each with the reason, and counts how often each fired so tests can
assert on it (the model is torchft's EventInjector: faults keyed by target and
step, with fire counters).

Triggers are by training progress wherever the behaviour is the point, so a
schedule means the same thing on a fast and a slow machine:
  * ``step``: learner ``learner``'s inner step (or, without ``learner``, the most
    advanced learner's) has reached the value;
  * ``merges``: the syncer has completed this many merges;
  * ``time_s``: seconds since the run started (only where time is the point,
    e.g. a partition in a synchronous baseline, where progress itself stops);
  * ``after`` (with ``after_s`` or ``after_steps``): a reaction of the run seen in its log, "rejoin" (learner
    ``learner`` training again after a repair) or "syncer_restored" (a restarted syncer restored its
    checkpoint), then that many seconds or the learner's steps more;
  * ``after_s`` alone (only in ``until``): seconds after the fault started.
Progress is observed from the event log, so a fault fires within one
supervisor poll (<= 50 ms) of the trigger; the `fault_start` event records
the actual progress at that moment. A reaction's time is when the supervisor
read its event (the schedule's own clock), so `decide` stays pure.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from diloco_chaos.chaos import faults as _faults
from diloco_chaos.chaos.faults.base import RepairParams, ScheduleError
from diloco_chaos.trainers.config import did_you_mean

LINK_ACTIONS = _faults.names(lambda k: k.target == "link")
"""Actions on one learner's link, carried out through its Toxiproxy proxy (diloco_chaos/chaos/links.py)."""

PROCESS_ACTIONS = _faults.names(lambda k: k.target != "link")
"""Actions on a run's processes, by pid (diloco_chaos/chaos/processes.py). Kills are one shot; a freeze lasts to
`until`. `kill_syncer` hits the synchronizer and is the only action without a `learner`."""

KILL_ACTIONS = _faults.names(lambda k: k.target != "link" and issubclass(k.params, RepairParams))
"""One-shot SIGKILLs; the supervisor restarts what they killed after `repair_s` (or recovery's default)."""

ACTIONS = _faults.names()
"""Every registered fault kind (diloco_chaos/chaos/faults/), in registration order."""

ACTION_PARAMS: dict[str, tuple[str, ...]] = {n: k.param_names() for n, k in _faults.kinds().items()}
"""action -> the parameter keys it accepts (derived from each kind's params dataclass)."""

PARAM_KEYS: tuple[str, ...] = tuple(dict.fromkeys(p for ps in ACTION_PARAMS.values() for p in ps))
"""Every parameter key of any kind: the flat keys a `[[faults]]` table may hold besides action, learner, at,
until."""

__all__ = ["ACTIONS", "ACTION_PARAMS", "KILL_ACTIONS", "LINK_ACTIONS", "PARAM_KEYS", "PROCESS_ACTIONS",
           "REACTIONS", "FaultSchedule", "FaultSpec", "Progress", "ScheduleError", "Transition", "Trigger",
           "config_table", "missing_reaction", "never_fires", "parse_fault", "reached"]


REACTIONS: dict[str, str] = {
    "rejoin": "learner `learner` is training again after a repair: its first step after its restart "
              "(`learner_restart`), or a repaired chip joining its group (`chip_joined`, recovery.policy shrink)",
    "syncer_restored": "a restarted syncer restored its checkpoint (`syncer_restore`; any shard)",
}
"""The reactions a trigger's `after` may name, and which events mark them."""


@dataclass(frozen=True)
class Trigger:
    """A moment in a run. Exactly one of step, merges, time_s, after is set, or (in `until` only) after_s alone.

    Written as a TOML inline table: `at = { step = 100, learner = 1 }`, `at = { merges = 5 }`,
    `at = { time_s = 2.5 }`, `at = { after = "rejoin", learner = 2, after_s = 0.5 }`,
    `at = { after = "syncer_restored" }`, `until = { after_s = 3.0 }`."""

    step: int | None = None
    """Inner step reached by `learner` (or by the most advanced learner when `learner` is unset)."""
    learner: int | None = None
    """Whose step counts for `step`, or whose rejoin for `after = "rejoin"` (needed there); with `step`, unset
    means the most advanced learner."""
    merges: int | None = None
    """Syncer merge count reached."""
    time_s: float | None = None
    """Seconds since the run started."""
    after: str | None = None
    """A reaction of the run to wait for: "rejoin" (learner `learner` training again after a repair: its first
    step after its restart, or a repaired chip joining its group) or "syncer_restored" (a restarted syncer, any
    shard, restored its checkpoint). The first such reaction counts; in `until`, the first after the fault
    started. Then `after_s` seconds or `after_steps` steps more (neither: at once). The scenario must hold a
    fault that can cause it (on that learner; a syncer fault), else it is refused as never firing."""
    after_s: float | None = None
    """With `after`: seconds after the reaction (as the supervisor read it, within one poll of its event).
    Alone (only valid in `until`): seconds after the fault started."""
    after_steps: int | None = None
    """With `after = "rejoin"` only: inner steps learner `learner` takes after the step it rejoined at."""

    def describe(self) -> str:
        if self.after is not None:
            what = f"learner {self.learner} rejoined" if self.after == "rejoin" else "the syncer restored"
            if self.after_steps is not None:
                return f"{self.after_steps} steps after {what}"
            return f"{self.after_s:g} s after {what}" if self.after_s else what
        if self.step is not None:
            who = f"learner {self.learner}" if self.learner is not None else "the most advanced learner"
            return f"{who} reached step {self.step}"
        if self.merges is not None:
            return f"syncer reached {self.merges} merges"
        if self.time_s is not None:
            return f"{self.time_s:g} s since run start"
        return f"{self.after_s:g} s after the fault started"


_SPEC_KEYS = ("action", "learner", "at", "until")


@dataclass(frozen=True)
class FaultSpec:
    """One scheduled fault: its kind (`action`), whom it hits, when, and the kind's parameters (`options`).

    A scenario writes the parameters as flat keys of the `[[faults]]` table (`latency_ms = 50`); `to_table`
    gives that form back. Reading a parameter by name (`spec.latency_ms`) gives its value, or None where it is
    unset or not a parameter of this kind."""

    action: str
    """A registered fault kind (diloco_chaos/chaos/faults/): degrade, partition, flap, reset_peer, slice, limit_data,
    kill_chip, kill_learner, crash_host, freeze, slow, kill_syncer, ..."""
    learner: int | None = None
    """The learner whose link (or process, for process actions) the fault hits; unset only for syncer kinds."""
    at: Trigger = field(default_factory=lambda: Trigger(time_s=0.0))
    """When the fault starts (default: at run start)."""
    until: Trigger | None = None
    """When it ends; unset means it lasts to the end of the run (and is removed then)."""
    options: Any = None
    """The kind's params dataclass (diloco_chaos/chaos/faults/<action>.py), each unset parameter None."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "options":
            raise AttributeError(name)
        if name in PARAM_KEYS:
            return getattr(self.options, name, None)
        raise AttributeError(f"{type(self).__name__} has no attribute or fault parameter {name!r}")

    @property
    def target_learner(self) -> int:
        """The learner a link or process fault hits (validated: set for every kind but the syncer's)."""
        if self.learner is None:
            raise ValueError(f"{self.action}: has no learner")
        return self.learner

    def params(self) -> dict[str, Any]:
        """The action's parameters that are set."""
        if self.options is None:
            return {}
        return {f.name: getattr(self.options, f.name) for f in dataclasses.fields(self.options)
                if getattr(self.options, f.name) is not None}

    def to_table(self) -> dict[str, Any]:
        """The flat `[[faults]]` table this spec was parsed from (unset entries left out); parse_fault reads it."""
        out: dict[str, Any] = {"action": self.action}
        if self.learner is not None:
            out["learner"] = self.learner
        out["at"] = {k: v for k, v in dataclasses.asdict(self.at).items() if v is not None}
        if self.until is not None:
            out["until"] = {k: v for k, v in dataclasses.asdict(self.until).items() if v is not None}
        return {**out, **self.params()}

    def describe(self) -> str:
        return _faults.get(self.action).label(self)


def _trigger(raw: Any, key: str, learners: int, is_until: bool) -> Trigger:
    if not isinstance(raw, dict):
        raise ScheduleError(f"{key} = {raw!r}: must be a table like {{ step = 100 }}")
    raw = {k: v for k, v in raw.items() if v is not None}
    allowed = ("step", "learner", "merges", "time_s", "after", "after_s", "after_steps")
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ScheduleError(f"unknown key {key}.{unknown[0]}{did_you_mean(unknown[0], allowed)}; "
                            f"allowed: {', '.join(allowed)}")
    if "after" in raw:
        return _reaction(raw, key, learners)
    kinds = [k for k in ("step", "merges", "time_s", "after_s") if k in raw]
    if "after_steps" in raw or (not is_until and "after_s" in raw) or len(kinds) != 1:
        heads = ("step", "merges", "time_s", "after") + (("after_s",) if is_until else ())
        raise ScheduleError(f"{key}: set exactly one of {', '.join(heads)}"
                            + ("" if is_until else " (after_s and after_steps count from an `after` reaction; "
                               "after_s alone is for `until`)"))
    for k, v in raw.items():
        if k in ("step", "learner", "merges"):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ScheduleError(f"{key}.{k} = {v!r}: must be an integer >= 0")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ScheduleError(f"{key}.{k} = {v!r}: must be a number >= 0")
    if "learner" in raw:
        if "step" not in raw:
            raise ScheduleError(f"{key}.learner: only valid together with {key}.step")
        if raw["learner"] >= learners:
            raise ScheduleError(f"{key}.learner = {raw['learner']}: must be in [0, {learners - 1}]")
    fields: dict[str, Any] = {k: (float(v) if k in ("time_s", "after_s") else v) for k, v in raw.items()}
    return Trigger(**fields)


def _reaction(raw: dict[str, Any], key: str, learners: int) -> Trigger:
    """A trigger on a reaction: `{ after = "rejoin", learner = 2, after_s = 0.5 }` (keys already known)."""
    after = raw["after"]
    if after not in REACTIONS:
        hint = did_you_mean(after, tuple(REACTIONS)) if isinstance(after, str) else ""
        raise ScheduleError(f"{key}.after = {after!r}{hint}: must be one of {', '.join(REACTIONS)}")
    others = sorted(set(raw) & {"step", "merges", "time_s"})
    if others:
        raise ScheduleError(f"{key}.{others[0]}: not with {key}.after (a trigger is one moment); use after_s or "
                            "after_steps to wait past the reaction")
    for k in ("learner", "after_steps"):
        v = raw.get(k)
        if k in raw and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ScheduleError(f"{key}.{k} = {v!r}: must be an integer >= 0")
    v = raw.get("after_s")
    if "after_s" in raw and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                             or v < 0):
        raise ScheduleError(f"{key}.after_s = {v!r}: must be a number >= 0")
    if "after_s" in raw and "after_steps" in raw:
        raise ScheduleError(f"{key}: set at most one of after_s, after_steps")
    if after == "rejoin":
        if "learner" not in raw:
            raise ScheduleError(f"{key}.learner: needed with {key}.after = 'rejoin' (whose rejoin), in "
                                f"[0, {learners - 1}]")
        if raw["learner"] >= learners:
            raise ScheduleError(f"{key}.learner = {raw['learner']}: must be in [0, {learners - 1}]")
    else:
        for k in ("learner", "after_steps"):
            if k in raw:
                raise ScheduleError(f"{key}.{k}: not with {key}.after = {after!r} (only with 'rejoin')")
    return Trigger(after=after, learner=raw.get("learner"),
                   after_s=float(raw["after_s"]) if "after_s" in raw else None, after_steps=raw.get("after_steps"))


def config_table(raw: Any, key: str, cls: type) -> dict[str, Any]:
    """A config table for dataclass `cls` (parsed TOML/JSON, or a `cls` instance) with its unset (None)
    entries dropped. Raises ScheduleError for a non-table or an unknown key, naming `key` and the fields."""
    if isinstance(raw, cls):
        raw = dataclasses.asdict(raw)  # type: ignore[call-overload]
    if not isinstance(raw, dict):
        raise ScheduleError(f"{key}: must be a table")
    raw = {k: v for k, v in raw.items() if v is not None}
    fields = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ScheduleError(f"unknown key {key}.{unknown[0]}{did_you_mean(unknown[0], fields)}; "
                            f"allowed: {', '.join(fields)}")
    return raw


def parse_fault(raw: Any, key: str, learners: int) -> FaultSpec:
    """Validate one `[[faults]]` table (as parsed from TOML or JSON, or a FaultSpec) into a FaultSpec: the keys
    common to every fault here, the parameters by the kind's module (diloco_chaos/chaos/faults/<action>.py)."""
    if isinstance(raw, FaultSpec):
        raw = raw.to_table()
    if not isinstance(raw, dict):
        raise ScheduleError(f"{key}: must be a table")
    raw = {k: v for k, v in raw.items() if v is not None}
    allowed = _SPEC_KEYS + PARAM_KEYS
    unknown = sorted(set(raw) - set(allowed))
    if unknown:
        raise ScheduleError(f"unknown key {key}.{unknown[0]}{did_you_mean(unknown[0], allowed)}; "
                            f"allowed: {', '.join(allowed)}")
    action = raw.get("action")
    kind = _faults.get(action, f"{key}.action")
    learner = raw.get("learner")
    if kind.target == "syncer":
        if learner is not None:
            raise ScheduleError(f"{key}.learner: {action} hits the syncer; leave learner unset")
    elif isinstance(learner, bool) or not isinstance(learner, int) or not 0 <= learner < learners:
        raise ScheduleError(f"{key}.learner = {learner!r}: must be in [0, {learners - 1}]")
    takes = kind.param_names()
    for k in raw:
        if k not in _SPEC_KEYS and k not in takes:
            raise ScheduleError(f"{key}.{k}: not a parameter of {action}{did_you_mean(k, takes)}; "
                                f"it takes {', '.join(takes) or 'no parameters'}")
    at = _trigger(raw["at"], f"{key}.at", learners, is_until=False) if "at" in raw else Trigger(time_s=0.0)
    until = _trigger(raw["until"], f"{key}.until", learners, is_until=True) if "until" in raw else None
    options = kind.parse_params({k: v for k, v in raw.items() if k in takes}, key)
    spec = FaultSpec(action=action, learner=learner, at=at, until=until, options=options)
    kind.check_required(spec, key)
    kind.validate(spec, key)
    return spec


@dataclass
class Progress:
    """What the run has done so far, as seen in its event log."""

    steps: dict[int, int] = field(default_factory=dict)
    """Highest inner step seen per learner."""
    merges: int = 0
    """Syncer merges seen."""
    rejoins: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    """Per learner, each time it rejoined (REACTIONS["rejoin"]): (elapsed_s when seen, the step it rejoined at)."""
    syncer_restores: list[float] = field(default_factory=list)
    """Each time a restarted syncer restored its checkpoint: elapsed_s when seen."""
    restarted: set[int] = field(default_factory=set)
    """Learners restarted whose first step since has not been seen yet (their rejoin is that step)."""

    def observe(self, events: list[dict[str, Any]], elapsed_s: float = 0.0) -> None:
        """Take in events read from the log at `elapsed_s` (the schedule's clock; the time a reaction is
        counted from)."""
        for e in events:
            ev = e.get("ev")
            if ev == "step":
                m = int(e["learner"])
                self.steps[m] = max(self.steps.get(m, 0), int(e["step"]))
                if m in self.restarted:
                    self.restarted.discard(m)
                    self.rejoins.setdefault(m, []).append((elapsed_s, int(e["step"])))
            elif ev == "merge":
                self.merges = max(self.merges, int(e.get("merges", self.merges + 1)))
            elif ev == "learner_restart":
                self.restarted.add(int(e["learner"]))
            elif ev == "chip_joined":
                self.rejoins.setdefault(int(e["learner"]), []).append((elapsed_s, int(e["step"])))
            elif ev == "syncer_restore":
                self.syncer_restores.append(elapsed_s)

    def as_dict(self) -> dict[str, Any]:
        return {"steps": {str(k): v for k, v in sorted(self.steps.items())}, "merges": self.merges}


def reached(trig: Trigger, progress: Progress, elapsed_s: float, started_at_s: float | None) -> bool:
    """Whether a trigger has been reached (pure). `started_at_s`: when the fault started (for after_s, and in
    `until` a reaction counts only from then)."""
    if trig.after is not None:
        since = started_at_s if started_at_s is not None else -math.inf
        if trig.after == "rejoin":
            assert trig.learner is not None
            seen = [(t, s) for t, s in progress.rejoins.get(trig.learner, []) if t >= since]
        else:
            seen = [(t, 0) for t in progress.syncer_restores if t >= since]
        if not seen:
            return False
        t, step = seen[0]
        if trig.after_steps is not None:
            assert trig.learner is not None
            return progress.steps.get(trig.learner, 0) >= step + trig.after_steps
        return elapsed_s - t >= (trig.after_s or 0.0)
    if trig.step is not None:
        if trig.learner is not None:
            return progress.steps.get(trig.learner, 0) >= trig.step
        return max(progress.steps.values(), default=0) >= trig.step
    if trig.merges is not None:
        return progress.merges >= trig.merges
    if trig.time_s is not None:
        return elapsed_s >= trig.time_s
    assert trig.after_s is not None
    return started_at_s is not None and elapsed_s - started_at_s >= trig.after_s


@dataclass(frozen=True)
class Transition:
    """One decision of the schedule: start or stop fault `index`, and why."""

    index: int
    start: bool
    reason: str


class FaultSchedule:
    """Which faults are due, given progress and time; counts starts and stops per fault."""

    def __init__(self, faults: tuple[FaultSpec, ...] | list[FaultSpec]) -> None:
        self.faults = list(faults)
        self.progress = Progress()
        self.started_at: list[float | None] = [None] * len(self.faults)
        self.fired = [0] * len(self.faults)
        self.cleared = [0] * len(self.faults)

    def active(self) -> list[int]:
        return [i for i, t in enumerate(self.started_at) if t is not None]

    def pending(self) -> bool:
        """Whether any fault is yet to start or to end by a trigger."""
        return any(self.fired[i] == 0 or (self.started_at[i] is not None and f.until is not None)
                   for i, f in enumerate(self.faults))

    def decide(self, elapsed_s: float) -> list[Transition]:
        """Faults to start and stop now (pure in progress and `elapsed_s`); records them as done."""
        out: list[Transition] = []
        for i, f in enumerate(self.faults):
            if self.started_at[i] is None and self.fired[i] == 0 and reached(f.at, self.progress, elapsed_s, None):
                self.started_at[i] = elapsed_s
                self.fired[i] += 1
                out.append(Transition(i, True, f.at.describe()))
            if (self.started_at[i] is not None and f.until is not None
                    and reached(f.until, self.progress, elapsed_s, self.started_at[i])):
                self.started_at[i] = None
                self.cleared[i] += 1
                out.append(Transition(i, False, f.until.describe()))
        return out

    def end_all(self) -> list[Transition]:
        """Stop every active fault (end of run, or failure)."""
        out = []
        for i in self.active():
            self.started_at[i] = None
            self.cleared[i] += 1
            out.append(Transition(i, False, "end of run"))
        return out


def never_fires(spec: FaultSpec, steps: int, run_s: float) -> str | None:
    """Why a fault can never start or can never end as written, or None: a step trigger past the run's last
    step (`steps` per learner), a time past its time limit (`run_s`), or an `until` that comes no later than
    its `at` on the same clock. A fault that cannot fire tests nothing, so it is refused before the run."""
    for name, trig in (("at", spec.at), ("until", spec.until)):
        if trig is None:
            continue
        if trig.step is not None and trig.step > steps:
            return f"{name}.step = {trig.step}: never reached, train.steps = {steps}"
        if trig.time_s is not None and trig.time_s >= run_s:
            return f"{name}.time_s = {trig.time_s:g}: never reached, timeouts.run_s = {run_s:g}"
        if trig.after is not None and trig.after_steps is not None and trig.after_steps >= steps:
            return f"{name}.after_steps = {trig.after_steps}: never reached, train.steps = {steps}"
        if trig.after is not None and trig.after_s is not None and trig.after_s >= run_s:
            return f"{name}.after_s = {trig.after_s:g}: never reached, timeouts.run_s = {run_s:g}"
    at, until = spec.at, spec.until
    if at is None or until is None:
        return None
    if at.step is not None and until.step is not None and at.learner == until.learner and until.step <= at.step:
        return f"until.step = {until.step}: must be after at.step = {at.step}"
    if at.merges is not None and until.merges is not None and until.merges <= at.merges:
        return f"until.merges = {until.merges}: must be after at.merges = {at.merges}"
    if at.time_s is not None and until.time_s is not None and until.time_s <= at.time_s:
        return f"until.time_s = {until.time_s:g}: must be after at.time_s = {at.time_s:g}"
    return None


def missing_reaction(index: int, schedule: tuple[FaultSpec, ...] | list[FaultSpec]) -> str | None:
    """Why fault `index`'s `after` reaction can never happen in this schedule, or None: a learner rejoins only
    after something hit it (another fault on that learner: a kill, or a freeze or link fault that makes it
    fail), a syncer is restored only after a syncer fault. Recovery settings are the scenario's rules."""
    spec = schedule[index]
    for name, trig in (("at", spec.at), ("until", spec.until)):
        if trig is None or trig.after is None:
            continue
        others = [f for i, f in enumerate(schedule) if i != index]
        if trig.after == "rejoin" and not any(f.learner == trig.learner for f in others):
            return (f"{name}.after = 'rejoin': no other fault hits learner {trig.learner}, so it never fails "
                    "and rejoins")
        if trig.after == "syncer_restored" and not any(_faults.get(f.action).target == "syncer" for f in others):
            return f"{name}.after = 'syncer_restored': no fault kills the syncer (kill_syncer), so none is restored"
    return None
