"""Goodput and uptime from a run's event log (definitions, formulas and a worked example in docs/metrics.md).

goodput: the share of allocated chip-time spent on useful training, the paper's notion. A learner's C chips
are allocated from its first step to the end of training. A step's work is its chips x its interval (from the
learner's previous step, or from when it was ready after a (re)start), which includes its ordinary
communication: a data-parallel step's gradient exchange, a DiLoCo round's parameter exchange. A step's healthy
time is the median interval of its learner's neighbouring steps of the same `StepKind`; a step longer than
STALL_TOLERANCE x that is a stall (blocked on a peer, a collective or the syncer, or frozen) and counts only
the healthy time. A step counts only if its work reached the global model (decoupled: a merge took in a push
whose step range covers it, or its work on a fragment was overwritten by that fragment's merged value in the
overlap window, by design; diloco: its round was merged; ddp and elastic_ddp: its gradient was merged). Time a
learner is down, restarting or finished while others train is allocated and not useful. `credit_step` is the
pure per-step decision; `merged_fraction` keeps the stricter per-fragment figure and `compute_fraction` the
previous definition (time in the link to the syncer excluded).

uptime: the fraction of the training span in which the global model advanced within `window_s`, i.e. 1 - the
downtime, where downtime intervals are the gaps between consecutive merges (and the span's ends) longer than
`window_s`, each counted beyond its first `window_s`.

Every function reads typed event records (diloco_chaos/harness/record; a finished run's are `run.log.records` of its
FinishedRun, diloco_chaos/harness/run/rundir.py), not decoded dicts: a field the schema does not guarantee is None
on its record, never a missing key.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import Apply, ApplyWait, ChipStart, InitialPull, LearnerDone, Resume, Step
from diloco_chaos.harness.record.run import LearnerRestart, ProcessFault, ProcessFaultOff, SyncerDown
from diloco_chaos.harness.record.syncer import LearnerBye, LearnerJoin, LearnerLeave, Merge, SyncerStart, shard_of
from diloco_chaos.harness.report.elastic_phases import lost_to_rollback, rollbacks
from diloco_chaos.harness.report.progress import Advance, Progress, progress

DOWNTIME_WINDOW_S = 1.0
"""A gap between merges longer than this is downtime (beyond this allowance)."""

STALL_TOLERANCE = 5.0
"""A step may take up to this many times its healthy step time and count in full; a longer step is a stall and
counts only its healthy time. Ordinary jitter stays under it: on a shared 2-core machine a step slowed by a
neighbour's burst of CPU (an eval, a process starting) reaches 3-8 x its neighbours', while every fault the
harness injects blocks a learner for tens of healthy steps (docs/metrics.md has the figures)."""

HEALTHY_WINDOW = 4
"""A step's healthy time is the median interval of its learner's steps of the same kind within this many steps
before and after it: a local pace, so that a machine slowed for a while by other load sets the pace of its
steps, while a stall (one step blocked on a peer, a collective or the syncer) stands out against its
neighbours."""

MIN_HEALTHY_SAMPLES = 3
"""A window with fewer steps than this takes the median of every learner's steps of that kind instead."""


class StepKind(enum.Enum):
    """Steps whose healthy time is estimated apart: synchronous DiLoCo's round-closing step carries the whole
    round's exchange of every parameter, several times an inner step's time, and is routine."""

    INNER = "inner"
    ROUND_END = "round_end"


class StepCredit(enum.Enum):
    """How much of a step's interval counts as work (the verdict of `credit_step`)."""

    FULL = "within tolerance of the healthy step time: the whole interval is work"
    STALLED = "beyond tolerance: only the healthy step time is work, the rest was waiting"


def credit_step(interval_s: float, healthy_s: float, tolerance: float = STALL_TOLERANCE) -> tuple[float, StepCredit]:
    """Seconds of a step's interval that count as training work, and why: the whole interval when it is at most
    `tolerance` x the healthy step time, else the healthy step time alone (the excess is a stall)."""
    if interval_s <= tolerance * healthy_s:
        return interval_s, StepCredit.FULL
    return healthy_s, StepCredit.STALLED


@dataclass(frozen=True)
class StepSpan:
    """One logged inner step of a learner: when it ended, how long since the learner's previous step ended (or
    since it was ready after a (re)start: `first`), its chips and the host's seconds in its link (`sync_s`)."""

    learner: int
    step: int
    end: float
    interval_s: float
    chips: int
    kind: StepKind
    first: bool
    sync_s: float
    tokens: int = 0
    """Tokens the step trained (its learner's chips together)."""


@dataclass(frozen=True)
class DiscardedStep:
    """One step whose work never reached the global model, as `goodput` counted it in `discarded_chip_s` (the
    `work_kept` invariant attributes each to a cause)."""

    learner: int
    step: int
    end: float
    """When the step ended (event clock)."""
    chip_s: float
    """Its credited work: chips x its interval, or x its healthy time if it stalled."""
    tokens: int


@dataclass(frozen=True)
class LearnerGoodput:
    """One learner's side of goodput, chip-seconds."""

    allocated_chip_s: float
    """C x (the span's end - the start of its first step's credited work), or C x the span if it never stepped."""
    good_chip_s: float
    """Work on steps whose result reached the global model."""
    step_chip_s: float
    """Every logged step's interval x its chips."""
    stalled_chip_s: float
    """Intervals beyond their healthy time in stalled steps (waiting on a peer, a collective, the syncer)."""
    discarded_chip_s: float
    """Work on steps that never reached the global model (lost in a crash, superseded, never merged)."""
    healthy_step_s: dict[str, float]
    """Per StepKind value: the median over its steps of their healthy step time (seconds)."""
    stalls: int
    """Steps beyond STALL_TOLERANCE x their healthy time."""


@dataclass(frozen=True)
class Goodput:
    """Goodput of a run and its parts (docs/metrics.md has each formula)."""

    goodput: float | None
    """good_chip_s / allocated_chip_s: the share of allocated chip-time spent on useful training."""
    merged_fraction: float | None
    """Like goodput, each good step weighted by the share of the P fragments whose merges took it in."""
    compute_fraction: float | None
    """Good steps' time outside the link to the syncer (interval - sync_s, at most its credit) / allocated."""
    good_chip_s: float
    allocated_chip_s: float
    """Sum over learners of their allocated_chip_s."""
    span_s: float
    """The training span: from the first step's credited start to the last step's end."""
    stalled_chip_s: float
    discarded_chip_s: float
    idle_chip_s: float
    """Allocated and in no step: down, repaired, restarting, finished while others trained, or a chip missing
    from its learner's group."""
    tolerance: float
    per_learner: dict[str, LearnerGoodput]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _learner(e: Event, default: Any = None) -> Any:
    """The `learner` field of a record whose kind has one, else `default`."""
    return getattr(e, "learner", default)


def _step_spans(evs: Sequence[Event], prog: Progress) -> dict[int, list[StepSpan]]:
    """learner -> its logged inner steps in time order. A (re)started learner's first step counts from when it
    was last ready: rank 0's `chip_start`, the supervisor's `learner_restart`, the host's `initial_pull` or
    `resume` (a restarted learner's state from the syncer)."""
    out: dict[int, list[StepSpan]] = defaultdict(list)
    last: dict[int, float] = {}
    ready: dict[int, float] = {}
    marks = (Step, ChipStart, InitialPull, Resume, LearnerRestart)
    for e in sorted((e for e in evs if isinstance(e, marks)), key=lambda e: e.t):
        m, t = e.learner, e.t
        if not isinstance(e, Step):
            # a chip_start means ready only before the learner steps (a repaired chip joining a running group
            # under the shrink policy starts too); a restart begins with the supervisor's learner_restart
            if (e.rank if isinstance(e, ChipStart) else 0) == 0 and (not isinstance(e, ChipStart) or m not in last):
                ready[m] = t
                last.pop(m, None)
            continue
        first = m not in last
        begin = last.get(m, ready.get(m, t))
        s = e.step
        kind = StepKind.ROUND_END if prog.round_end(m, s) else StepKind.INNER
        out[m].append(StepSpan(m, s, t, max(0.0, t - begin), e.chips, kind, first, float(e.sync_s), int(e.tokens)))
        last[m] = t
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] + s[(n - 1) // 2]) / 2


def healthy_step_times(spans: dict[int, list[StepSpan]], window: int = HEALTHY_WINDOW) -> dict[int, list[float]]:
    """learner -> the healthy time of each of its steps (same order as `spans[learner]`): the median interval of
    the learner's steps of the same kind within `window` steps either side, first steps after a (re)start
    left out (they hold start-up); with fewer than MIN_HEALTHY_SAMPLES there, every learner's steps of that kind;
    with none, the step's own interval."""
    pooled: dict[StepKind, list[float]] = defaultdict(list)
    for xs in spans.values():
        for x in xs:
            if not x.first:
                pooled[x.kind].append(x.interval_s)
    overall = {k: _median(v) for k, v in pooled.items()}
    out: dict[int, list[float]] = {}
    for m, xs in spans.items():
        healthy = [0.0] * len(xs)
        for kind in {x.kind for x in xs}:
            idx = [i for i, x in enumerate(xs) if x.kind == kind]
            for j, i in enumerate(idx):
                near = [xs[k].interval_s for k in idx[max(0, j - window):j + window + 1] if not xs[k].first]
                healthy[i] = (_median(near) if len(near) >= MIN_HEALTHY_SAMPLES
                              else overall.get(kind, xs[i].interval_s))
        out[m] = healthy
    return out


def overwritten_in_overlap(evs: Sequence[Event]) -> dict[int, set[int]]:
    """Decoupled DiLoCo: learner -> steps whose work on some fragment was overwritten by that fragment's merged
    value, which by design arrives tau steps after the pull (steps after the learner's merged range, up to the
    `apply`). Their compute overlapped the exchange: useful work by the algorithm's design, not lost."""
    merged: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # (learner, fragment) -> (version, end)
    for e in evs:
        if isinstance(e, Merge) and e.fragment is not None and e.step_ranges is not None:
            for m, (_, b) in zip(e.participants, e.step_ranges, strict=False):
                merged[(m, e.fragment)].append((e.version, int(b)))
    out: dict[int, set[int]] = defaultdict(set)
    for e in evs:
        if not isinstance(e, Apply) or e.fragments is None:
            continue
        m, step = e.learner, e.step
        for p, v in zip(e.fragments, e.versions or [], strict=False):
            ends = [b for ver, b in merged.get((m, int(p)), []) if ver <= int(v) and b < step]
            if ends:
                out[m].update(range(max(ends) + 1, step + 1))
    return out


def goodput(evs: Sequence[Event], algorithm: str, learners: int, chips: int, fragments: int,
            sync_every: int, tolerance: float = STALL_TOLERANCE) -> Goodput:
    """The share of allocated chip-time spent on useful training: every step whose work reached the global
    model counts its chips x its interval, or x its healthy step time if it stalled (`credit_step`). A learner's
    chips are allocated from its first step's credited start (start-up before it is left out) to the span's
    end; a learner that never stepped, for the whole span."""
    return goodput_and_discards(evs, algorithm, learners, chips, fragments, sync_every, tolerance)[0]


def goodput_and_discards(evs: Sequence[Event], algorithm: str, learners: int, chips: int, fragments: int,
                         sync_every: int, tolerance: float = STALL_TOLERANCE) -> tuple[Goodput, list[DiscardedStep]]:
    """`goodput`, and the steps it counted as discarded (their chip_s add up to each learner's
    discarded_chip_s before rounding)."""
    dropped: list[DiscardedStep] = []
    prog = progress(evs, algorithm, fragments, sync_every)
    spans = _step_spans(evs, prog)
    healthy = healthy_step_times(spans)
    cover = prog.covered
    overlap = overwritten_in_overlap(evs) if algorithms.get(algorithm).fragmented else {}
    redone = rollbacks(evs)  # elastic_ddp's torchrun engine: steps after the checkpoint, lost and done again
    waited: dict[tuple[int, int], float] = defaultdict(float)  # diloco.apply_wait = block: lost chip-time
    for w in evs:
        if isinstance(w, ApplyWait):
            waited[(w.learner, w.step)] += w.waited_s
    credit = {m: [_less_wait(credit_step(x.interval_s, h, tolerance), x.interval_s - waited[(m, x.step)])
                  for x, h in zip(xs, healthy[m], strict=True)]
              for m, xs in spans.items()}
    begin = {m: xs[0].end - credit[m][0][0] for m, xs in spans.items()}
    start = min(begin.values(), default=0.0)
    end = max((x.end for xs in spans.values() for x in xs), default=0.0)
    per: dict[str, LearnerGoodput] = {}
    allocated = good_total = strict_total = compute_total = stalled_total = discarded_total = 0.0
    for m in range(learners):
        xs = spans.get(m, [])
        alloc = chips * (end - begin.get(m, start))
        good = stepped = stalled = discarded = 0.0
        stalls = 0
        for x, (c, verdict) in zip(xs, credit.get(m, []), strict=True):
            share = 0.0 if lost_to_rollback(redone, x.step, x.end) else cover[m].get(x.step, 0.0)
            stepped += x.chips * x.interval_s
            if not x.first:  # a first step's excess is start-up or restart, not waiting on others
                stalled += x.chips * (x.interval_s - c)
                stalls += verdict is StepCredit.STALLED
            if share > 0 or x.step in overlap.get(m, ()):
                good += x.chips * c
                strict_total += x.chips * c * min(1.0, share)
                compute_total += x.chips * min(c, max(0.0, x.interval_s - x.sync_s))
            else:
                discarded += x.chips * c
                dropped.append(DiscardedStep(m, x.step, x.end, x.chips * c, x.tokens))
        kinds = {x.kind for x in xs}
        typical = {k.value: round(_median([h for x, h in zip(xs, healthy[m], strict=True) if x.kind == k]), 5)
                   for k in sorted(kinds, key=lambda k: k.value)}
        per[str(m)] = LearnerGoodput(round(alloc, 3), round(good, 3), round(stepped, 3), round(stalled, 3),
                                     round(discarded, 3), typical, stalls)
        allocated += alloc
        good_total += good
        stalled_total += stalled
        discarded_total += discarded

    def ratio(x: float) -> float | None:
        return round(x / allocated, 4) if allocated > 0 else None

    return Goodput(ratio(good_total), ratio(strict_total), ratio(compute_total), round(good_total, 3),
                   round(allocated, 3), round(end - start, 3), round(stalled_total, 3), round(discarded_total, 3),
                   round(allocated - good_total - stalled_total - discarded_total, 3), tolerance, per), dropped


def _less_wait(credit: tuple[float, StepCredit], cap: float) -> tuple[float, StepCredit]:
    """A step's credit with its learner's apply waits (diloco.apply_wait = block) taken out: the wait is lost
    chip-time, counted as stalled, never as training."""
    return (min(credit[0], max(0.0, cap)), credit[1])


def downtime(merge_times: list[float], start: float, end: float,
             window_s: float = DOWNTIME_WINDOW_S) -> dict[str, Any]:
    points = [start, *sorted(t for t in merge_times if start <= t <= end), end]
    intervals = [(a + window_s, b) for a, b in zip(points, points[1:], strict=False) if b - a > window_s]
    down = sum(b - a for a, b in intervals)
    span = end - start
    return {"uptime": round(1 - down / span, 4) if span > 0 else None, "downtime_s": round(down, 3),
            "window_s": window_s, "intervals": [[round(a - start, 3), round(b - start, 3)] for a, b in intervals]}


def achieved_speeds(evs: Sequence[Event], learners: int) -> list[dict[str, Any]]:
    """For every `slow` fault: the learner's steps over the mean steps of the learners that were not slowed,
    in the window where all of them were training (from the fault's start to its end, or to the first of them
    finishing). That ratio is what a speed profile means: an older chip does `speed` x the steps of a new one."""
    ons = [e for e in evs if isinstance(e, ProcessFault) and e.kind == "slow"]
    offs = {e.learner: e.t for e in evs if isinstance(e, ProcessFaultOff) and e.kind == "slow"}
    slowed = {e.learner for e in ons}
    steps: dict[int | None, list[tuple[float, int]]] = defaultdict(list)
    done: dict[int | None, float] = {}
    for e in evs:
        if isinstance(e, Step):
            steps[e.learner].append((e.t, e.step))
        elif isinstance(e, LearnerDone):
            done[e.learner] = e.t
    refs: list[int | None] = [m for m in range(learners) if m not in slowed and steps.get(m)]
    out = []
    for on in ons:
        m = on.learner
        t0 = on.t
        t1 = min([offs.get(m, float("inf")), *(done.get(r, float("inf")) for r in [m, *refs])])
        if not refs or t1 == float("inf") or t1 <= t0:
            out.append({"learner": m, "speed": on.speed, "achieved": None, "window_s": 0.0})
            continue

        def progress(r: int | None, a: float = t0, b: float = t1) -> int:
            inside = [s for t, s in steps[r] if a <= t <= b]
            return max(inside) - min(inside) if len(inside) > 1 else 0

        ref = sum(progress(r) for r in refs) / len(refs)
        out.append({"learner": m, "speed": on.speed, "achieved": round(progress(m) / ref, 4) if ref else None,
                    "window_s": round(t1 - t0, 3), "steps": progress(m), "reference_steps": round(ref, 1)})
    return out


def _summary(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "max": None}
    s = sorted(xs)
    return {"n": len(s), "mean": round(sum(s) / len(s), 4), "p50": round(s[len(s) // 2], 4), "max": round(s[-1], 4)}


def merge_stats(evs: Sequence[Event], advances: Sequence[Advance]) -> dict[str, Any]:
    """Per advance of the global model (diloco_chaos/harness/report/progress.py: a merge, a committed torchft
    step): quorum size (participants) and tokens merged per learner (builtin: its c_tokens / P per merge of a
    fragment). Per merge of the built-in syncer: time waited for the quorum and in the grace window, and the
    staleness of each merged push (the fragment's version before this merge - the version the push was based
    on: 0 = the learner had the latest)."""
    merges = [e for e in evs if isinstance(e, Merge)]
    staleness: list[float] = []
    tokens: dict[str, float] = defaultdict(float)
    for e in merges:
        for i, _ in enumerate(e.participants):
            if e.base_versions is not None:
                staleness.append(float(e.version - 1 - e.base_versions[i]))
    for a in advances:
        for m, x in zip(a.participants, a.tokens, strict=False):
            tokens[str(m)] += x
    return {"quorum_size": _summary([float(len(a.participants)) for a in advances]),
            "quorum_wait_s": _summary([e.quorum_wait_s for e in merges if e.quorum_wait_s is not None]),
            "grace_wait_s": _summary([max(0.0, e.wait_s - e.quorum_wait_s) for e in merges
                                      if e.wait_s is not None and e.quorum_wait_s is not None]),
            "staleness_versions": _summary(staleness),
            "tokens_merged_per_learner": {m: round(v, 1) for m, v in sorted(tokens.items())}}


def learner_availability(evs: Sequence[Event], learners: int, start: float, end: float) -> dict[str, Any]:
    """Per learner: the fraction of [start, end] (the training span) it was alive as the syncer saw it, i.e.
    between its `learner_join` and the next `learner_leave` (or the syncer going down). With a sharded
    synchronizer, alive while connected to any shard (each shard's view is its events' `proc`)."""
    by_shard: dict[int, set[int]] = defaultdict(set)
    alive_since: dict[int, float] = {}
    up: dict[int, float] = defaultdict(float)
    for e in sorted(evs, key=lambda e: e.t):
        t = min(max(e.t, start), end)
        if isinstance(e, LearnerJoin):
            by_shard[shard_of(e.proc)].add(e.learner)
        elif isinstance(e, LearnerLeave | LearnerBye):
            by_shard[shard_of(e.proc)].discard(e.learner)
        elif isinstance(e, SyncerStart):
            by_shard[shard_of(e.proc)].clear()
        elif isinstance(e, SyncerDown):
            by_shard[e.shard].clear()
        else:
            continue
        alive = set().union(*by_shard.values())
        for m in alive - set(alive_since):
            alive_since[m] = t
        for m in set(alive_since) - alive:
            up[m] += t - alive_since.pop(m)
    for m, t0 in alive_since.items():
        up[m] += end - t0
    span = end - start
    return {str(m): round(up[m] / span, 4) if span > 0 else None for m in range(learners)}
