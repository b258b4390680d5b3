"""Shrinking a failing schedule toward a minimal one that still fails the same invariant (Hypothesis-style).

What: `candidates(trial, ...)` yields, in order, smaller variants of a schedule, each with what it changed:
drop one fault; one learner fewer; fewer steps; a shorter duration (a kill's repair_s, an `until = { after_s }`);
a trigger moved earlier (a step toward the window's first step, a reaction's after_s toward 0); a milder fault
(`SEVERITY`: less latency, more bandwidth, a faster straggler, a shorter flap duty, ...). `shrink` is the
greedy driver: it takes the first candidate that the injected `fails` predicate accepts, starts again from it,
and stops when no candidate fails or its run budget is spent. `RofN` is that predicate for real runs: runs are
not deterministic, so a candidate counts as failing only when it fails in `must_fail` of `tries` runs (it stops
as soon as the answer is known, and runs up to `width` tries at once).

A schedule that passes r of n can still fail only half the time (it passes 2 of 2 a quarter of the time), so
`shrink` also takes a `confirm` predicate (an `RofN` with more runs and a higher bar, e.g. 4 of 5): where the
greedy walk ends, the schedule it ended at is confirmed with fresh runs; one that does not repeat at that rate is
rejected and the walk backs up to the schedule before it, confirms that, and, with budget left, goes on from it
with the rejected one's sibling candidates. If even the start does not repeat, a few variants of it with a step
trigger moved later (`later`: the fault hits more state) are confirmed directly, and shrinking goes on from the
first that repeats. The result is the smallest schedule found that repeats at the rate asked for, or the start
with its measured rate when nothing did.

Why pure: the candidates are a function of the schedule alone and the predicate is injected, so the order,
the termination (every step halves a value toward a floor, or removes something) and the r-of-n counting are
unit-tested with fake predicates, without processes (tests/explore/test_shrink.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from diloco_chaos.chaos.faults.base import RepairParams
from diloco_chaos.chaos.schedule import FaultSpec, Trigger, parse_fault
from diloco_chaos.harness.explore.records import Trial

MIN_DURATION_S = 0.1
"""Durations are halved down to this (rounded to 0.1 s)."""
MIN_STEPS = 20
"""Runs are shortened down to this many steps (or the last trigger step plus a margin, whichever is more)."""
STABILIZE_TRIES = 4
"""Later-trigger variants of a start that does not repeat, confirmed directly, before giving up on it."""

SEVERITY: dict[str, tuple[str, float]] = {
    "latency_ms": ("down", 10.0), "jitter_ms": ("down", 0.0), "bandwidth_kbps": ("up", 100_000.0),
    "speed": ("up", 0.95), "duty": ("down", 0.05), "probability": ("down", 1e-7), "percent": ("down", 0.1),
    "bytes": ("up", float(1 << 24)), "delay_us": ("down", 0.0),
}
"""Parameter -> (the milder direction, the mildest value tried): a milder fault is that value, else halfway to it."""


@dataclass(frozen=True)
class Try:
    """One run of a candidate: whether it failed the invariant being shrunk, and its run directory."""

    failed: bool
    run_dir: str | None = None


def _replace(trial: Trial, i: int, spec: FaultSpec) -> Trial:
    return dataclasses.replace(trial, faults=(*trial.faults[:i], spec, *trial.faults[i + 1:]))


def _with(spec: FaultSpec, learners: int, **changes: Any) -> FaultSpec | None:
    """The spec with table entries changed (validated by the fault's own rules), None when refused."""
    try:
        return parse_fault({**spec.to_table(), **changes}, "faults[0]", learners)
    except ValueError:
        return None


def toward(value: float, limit: float, integral: bool = False) -> list[float]:
    """The values a shrink tries for one number, in order: the limit itself, then halfway to it (two significant
    digits, so halving ends in a few steps); none equal to `value`."""
    if value == limit:
        return []
    half = value + (limit - value) / 2
    half = float(round(half)) if integral else float(f"{half:.2g}")
    if abs(limit - half) >= abs(limit - value):  # rounding went back: halving is done
        half = limit
    return list(dict.fromkeys(x for x in (float(limit), half) if x != value))


def _steps_for(last: int) -> int:
    return max(MIN_STEPS, math.ceil(last * 10 / 9) + 2)


def _steps_needed(trial: Trial) -> int:
    """The fewest steps a run of `trial` can be cut to: past every step trigger with a margin of a tenth."""
    return _steps_for(max([t.step for f in trial.faults for t in (f.at, f.until) if t is not None
                           and t.step is not None], default=0))


TRIGGER_FLOOR = max(s for s in range(MIN_STEPS) if _steps_for(s) <= MIN_STEPS)
"""A trigger is moved earlier only down to this step (or first_step, if later): below it the run cannot be any
shorter, and an earlier trigger only gives the fault less state to hit (a restored syncer with fewer merges
behind it), which makes a failure repeat less often, not the incident smaller."""


def candidates(trial: Trial, first: int, min_learners: int = 2, learners_too: bool = True
               ) -> Iterator[tuple[str, Trial]]:
    """Smaller variants of `trial`, in the order they are tried, each with a description of the change."""
    n = len(trial.faults)
    if n > 1:
        for i, f in enumerate(trial.faults):
            yield f"drop faults[{i}] {f.describe()}", dataclasses.replace(
                trial, faults=trial.faults[:i] + trial.faults[i + 1:])
    hit = max([f.learner for f in trial.faults if f.learner is not None]
              + [t.learner for f in trial.faults for t in (f.at, f.until) if t is not None and t.learner is not None],
              default=-1)
    if learners_too and trial.learners > max(min_learners, hit + 1):
        yield f"learners {trial.learners} -> {trial.learners - 1}", dataclasses.replace(
            trial, learners=trial.learners - 1)
    need = _steps_needed(trial)
    if trial.steps > need:
        for steps in toward(trial.steps, need, integral=True):
            yield f"steps {trial.steps} -> {steps:g}", dataclasses.replace(trial, steps=int(steps))
    for i, f in enumerate(trial.faults):
        yield from _fault_candidates(trial, i, f, first)


def _fault_candidates(trial: Trial, i: int, f: FaultSpec, first: int) -> Iterator[tuple[str, Trial]]:
    """Shorter, earlier and milder versions of fault i."""
    m = trial.learners
    name = f"faults[{i}] {f.action}"
    if isinstance(f.options, RepairParams) and f.options.repair_s is not None:
        for d in toward(f.options.repair_s, MIN_DURATION_S):
            if d < f.options.repair_s and (s := _with(f, m, repair_s=d)) is not None:
                yield f"{name} repair_s {f.options.repair_s:g} -> {d:g}", _replace(trial, i, s)
    if f.until is not None and f.until.after is None and f.until.after_s is not None:
        for d in toward(f.until.after_s, MIN_DURATION_S):
            if d < f.until.after_s and (s := _with(f, m, until={"after_s": d})) is not None:
                yield f"{name} lasts {f.until.after_s:g} s -> {d:g} s", _replace(trial, i, s)
    at = f.at
    floor = max(first, TRIGGER_FLOOR)
    if at.step is not None and at.step > floor:
        for step in toward(at.step, floor, integral=True):
            if (s := _with(f, m, at=_trigger(at, step=int(step)))) is not None:
                yield f"{name} at step {at.step} -> {step:g}", _replace(trial, i, s)
    if at.after is not None and at.after_s:
        for d in toward(at.after_s, 0.0):
            if (s := _with(f, m, at=_trigger(at, after_s=d))) is not None:
                yield f"{name} {at.after_s:g} s after the reaction -> {d:g} s", _replace(trial, i, s)
    for key, value in f.params().items():
        if key not in SEVERITY or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        direction, limit = SEVERITY[key]
        if (value <= limit) if direction == "down" else (value >= limit):
            continue
        for new in toward(float(value), limit, isinstance(value, int)):
            typed = int(new) if isinstance(value, int) else new
            if (s := _with(f, m, **{key: typed})) is not None:
                yield f"{name} {key} {value:g} -> {new:g}", _replace(trial, i, s)


def later(trial: Trial, last: int) -> Iterator[tuple[str, Trial]]:
    """Variants of `trial` with one step trigger moved later (halfway to `last`, then to `last`): tried, each
    confirmed directly, when the schedule shrinking started from does not repeat at the rate asked for (a fault
    that hits more state fails more surely)."""
    for i, f in enumerate(trial.faults):
        at = f.at
        if at.step is None or at.step >= last:
            continue
        for step in dict.fromkeys((at.step + max(1, (last - at.step) // 2), last)):
            if (s := _with(f, trial.learners, at=_trigger(at, step=step))) is not None:
                yield f"faults[{i}] {f.action} at step {at.step} -> {step} (to repeat)", _replace(trial, i, s)


def _trigger(t: Trigger, **changes: Any) -> dict[str, Any]:
    return {k: v for k, v in {**dataclasses.asdict(t), **changes}.items() if v is not None}


@dataclass(frozen=True)
class Judgement:
    """Whether a candidate counts as failing, after how many runs (of which `fails` failed), and a failing run's
    directory."""

    failed: bool
    runs: int
    run_dir: str | None = None
    fails: int = 0


class RofN:
    """The shrink predicate for non-deterministic runs: a candidate fails when at least `must_fail` of up to
    `tries` runs fail. `attempt(trial, k)` makes k runs (at once where it can) and returns their `Try`s; rounds of
    at most `width` runs are made until the answer is known."""

    def __init__(self, attempt: Callable[[Trial, int], list[Try]], must_fail: int, tries: int, width: int = 1):
        if not 1 <= must_fail <= tries:
            raise ValueError(f"must_fail = {must_fail}: must be in [1, tries = {tries}]")
        self.attempt, self.must_fail, self.tries, self.width = attempt, must_fail, tries, max(1, width)

    def __call__(self, trial: Trial) -> Judgement:
        done = failed = 0
        evidence: str | None = None
        while failed < self.must_fail and failed + (self.tries - done) >= self.must_fail:
            k = min(self.width, self.tries - done, self.must_fail - failed)
            for t in self.attempt(trial, k):
                done += 1
                if t.failed:
                    failed += 1
                    evidence = evidence or t.run_dir
        return Judgement(failed >= self.must_fail, done, evidence, failed)


@dataclass(frozen=True)
class Repeat:
    """A confirmation of the schedule shrinking ended at: `fails` failures in `runs` fresh runs, and whether
    that meets the rate asked for."""

    fails: int
    runs: int
    confirmed: bool


@dataclass(frozen=True)
class Shrunk:
    """The smallest failing schedule found, a failing run of it, the steps taken and the runs spent."""

    trial: Trial
    run_dir: str | None
    steps: tuple[str, ...]
    """Each accepted change, in order, from the start to `trial`."""
    runs: int
    """Runs spent, confirmations included."""
    exhausted: bool
    """Whether the run budget ran out before every candidate of the last schedule was tried."""
    repeat: Repeat | None = None
    """The confirmation of `trial` (None: no `confirm` predicate was given)."""
    rejected: tuple[str, ...] = ()
    """Schedules the walk reached but that did not repeat at the rate asked for (their describe())."""


@dataclass
class _Node:
    trial: Trial
    run_dir: str | None
    what: str
    """The change that made it from its parent ("" for the start)."""


def shrink(start: Trial, fails: Callable[[Trial], Judgement], valid: Callable[[Trial], bool], *, first: int,
           max_runs: int, run_dir: str | None = None, learners_too: bool = True,
           on_step: Callable[[str, Trial], None] | None = None,
           confirm: Callable[[Trial], Judgement] | None = None,
           on_confirm: Callable[[Trial, Judgement], None] | None = None, last: int | None = None) -> Shrunk:
    """Greedy shrinking from `start` (a schedule known to fail, `run_dir` a failing run of it): take the first
    valid candidate `fails` accepts, repeat; where no candidate does (or `max_runs` runs are spent), confirm the
    schedule reached with `confirm` and back up past any that does not repeat; if even `start` does not, try it
    with a trigger moved later (toward `last`, when given) and go on from the first of those that repeats (see
    the module doc)."""
    chain = [_Node(start, run_dir, "")]
    judged: set[str] = set()
    """Candidates already run and found not failing, or rejected by a confirmation: not run again."""
    rejected: list[str] = []
    confirmed: dict[str, Repeat] = {}
    runs = 0
    exhausted = False
    stabilized = last is None

    def confirmation(node: _Node) -> Repeat:
        nonlocal runs
        repeat = confirmed.get(node.trial.key())
        if repeat is None and confirm is not None:
            c = confirm(node.trial)
            runs += c.runs
            if on_confirm is not None:
                on_confirm(node.trial, c)
            node.run_dir = node.run_dir or c.run_dir
            repeat = confirmed[node.trial.key()] = Repeat(c.fails, c.runs, c.failed)
        assert repeat is not None
        return repeat
    while True:
        progressed = False
        if not exhausted:
            for what, cand in candidates(chain[-1].trial, first, learners_too=learners_too):
                if runs >= max_runs:
                    exhausted = True
                    break
                key = cand.key()
                if key in judged or not valid(cand):
                    continue
                j = fails(cand)
                runs += j.runs
                if j.failed:
                    chain.append(_Node(cand, j.run_dir or chain[-1].run_dir, what))
                    if on_step is not None:
                        on_step(what, cand)
                    progressed = True
                    break
                judged.add(key)
        if progressed:
            continue
        if confirm is None:
            return _result(chain, runs, exhausted, None, rejected)
        backed = False
        while True:
            repeat = confirmation(chain[-1])
            if repeat.confirmed or len(chain) == 1:
                break
            rejected.append(chain[-1].trial.describe())
            judged.add(chain[-1].trial.key())
            chain.pop()
            backed = True
        if not repeat.confirmed and not stabilized:
            stabilized = True
            assert last is not None
            for what, cand in itertools.islice(((w, c) for w, c in later(chain[0].trial, last) if valid(c)),
                                               STABILIZE_TRIES):
                node = _Node(cand, None, what)
                tried = confirmation(node)
                if tried.confirmed:
                    chain.append(node)
                    repeat, backed = tried, True
                    if on_step is not None:
                        on_step(what, cand)
                    break
                rejected.append(cand.describe())
                judged.add(cand.key())
        if not repeat.confirmed or not backed or exhausted or runs >= max_runs:
            return _result(chain, runs, exhausted, repeat, rejected)
        # a confirmed schedule with budget left: go on from it past the rejected ones


def _result(chain: list[_Node], runs: int, exhausted: bool, repeat: Repeat | None, rejected: list[str]) -> Shrunk:
    return Shrunk(chain[-1].trial, chain[-1].run_dir, tuple(n.what for n in chain[1:]), runs, exhausted, repeat,
                  tuple(rejected))
