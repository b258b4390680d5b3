"""Invariant `no_global_downtime`: While at least K learners were alive, the global model never stood still longer
than a bound.

The global model advances at a merge of the built-in syncer or a committed torchft step
(diloco_chaos/harness/report/progress.py); alive is the syncer's view, or torchft's trainers' (`ALIVE`).

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from diloco_chaos.harness.algorithms.base import System
from diloco_chaos.harness.invariants.base import InvariantResult, Run, RunRecord, _run
from diloco_chaos.harness.invariants.registry import REQUIRED, Bound, register
from diloco_chaos.harness.record.learner import ChipError, ChipStart, LearnerDone
from diloco_chaos.harness.record.run import ProcessFault, SyncerDown
from diloco_chaos.harness.record.syncer import LearnerBye, LearnerJoin, LearnerLeave, SyncerStart, shard_of
from diloco_chaos.harness.report.metrics import downtime
from diloco_chaos.harness.report.progress import advance_times


def alive_intervals(run: Run, min_alive: int) -> list[tuple[float, float]]:
    """Intervals in which at least `min_alive` learners were alive, in the view of the system that ran the run
    (`ALIVE`, by its algorithm descriptor's `system`)."""
    r = _run(run)
    since: float | None = None
    out: list[tuple[float, float]] = []
    for t, alive in ALIVE.get(r.descriptor.system, trainer_alive)(r):
        if len(alive) >= min_alive and since is None:
            since = t
        elif len(alive) < min_alive and since is not None:
            out.append((since, t))
            since = None
    if since is not None:
        out.append((since, r.all_records[-1].t))
    return out


def syncer_alive(r: RunRecord) -> Iterator[tuple[float, set[int]]]:
    """The built-in system: (t, the learners alive) at each change of the syncer's view.

    Alive is the syncer's definition: an authenticated connection that has not said BYE. It is read from
    the `alive` set on `learner_join` / `learner_leave`, a `learner_bye` removes its learner, and a syncer
    that starts (`syncer_start`), is killed (`process_fault` kill_syncer) or is seen dead (`syncer_down`)
    has no learners: while the syncer is down nobody can advance the model, which is the syncer-restart
    bound's business, not this one's. With a sharded synchronizer (syncer.shards > 1) each shard keeps its
    own set (the shard is the event's `proc`, or `shard` on the supervisor's events) and a learner is alive
    while it is connected to any shard: while one shard is down the others still advance the global model,
    so a gap then counts."""
    by_shard: dict[int, set[int]] = defaultdict(set)  # shard -> learners connected to it
    for e in r.all_records:
        if isinstance(e, LearnerJoin | LearnerLeave):
            mine = by_shard[shard_of(e.proc)]
            if e.alive is not None:
                mine.clear()
                mine.update(e.alive)
            elif isinstance(e, LearnerJoin):  # a run written before the events carried `alive`
                mine.add(e.learner)
            else:
                mine.discard(e.learner)
        elif isinstance(e, LearnerBye):
            by_shard[shard_of(e.proc)].discard(e.learner)
        elif isinstance(e, SyncerStart):
            by_shard[shard_of(e.proc)].clear()
        elif isinstance(e, SyncerDown):
            by_shard[e.shard].clear()
        elif isinstance(e, ProcessFault) and e.kind == "kill_syncer":
            for k in list(by_shard) if e.shard is None else [e.shard]:
                by_shard[k].clear()
        else:
            continue
        yield e.t, set().union(*by_shard.values())


KILLS = ("kill_learner", "crash_host", "kill_chip")
"""Process faults after which a torchft replica group is gone until its restart (a killed rank takes its group)."""


def trainer_alive(r: RunRecord) -> Iterator[tuple[float, set[int]]]:
    """torchft (and any target without its own view): (t, the replica groups alive) at each change. A group is
    alive from its rank 0's `chip_start` (its trainer ready to join a quorum) to its `learner_done`, a
    `chip_error` of any of its ranks, or a kill of it (`process_fault` of a kind in KILLS naming it); a restart's
    `chip_start` makes it alive again."""
    alive: set[int] = set()
    for e in r.all_records:
        if isinstance(e, ChipStart) and e.rank == 0:
            alive.add(e.learner)
        elif isinstance(e, LearnerDone | ChipError):
            alive.discard(e.learner)
        elif isinstance(e, ProcessFault) and e.kind in KILLS and e.learner is not None:
            alive.discard(e.learner)
        else:
            continue
        yield e.t, set(alive)


ALIVE: dict[System, Callable[[RunRecord], Iterator[tuple[float, set[int]]]]] = {
    "builtin": syncer_alive, "torchft": trainer_alive}
"""Which learners are alive, as each system under test sees them; another target's (a plugin's) by its trainers'
records, as torchft's (`trainer_alive`)."""


@register(order=20, mode="when_bound", bounds=(
    Bound("bound_s", "longest merge gap allowed while >= min_alive learners are alive (s)", REQUIRED, low=0.0,
          renamed_from="downtime_bound_s", triggers=True),
    Bound("min_alive", "K, learners that must be alive for a gap to count (default diloco.min_quorum)", low=0)))
def no_global_downtime(run: Run, *, bound_s: float, min_alive: int | None = None) -> InvariantResult:
    """While at least K learners were alive (syncer's view, see `alive_intervals`; K = `min_alive`, default
    the scenario's diloco.min_quorum) and inside the training span (first to last inner step of any learner,
    as report.json's longest_gap_s), the longest interval without a merge is at most `bound_s`. The ends of
    each such interval count as gap ends, so a model that stands still from the moment the K-th learner
    joins until the next merge counts in full."""
    r = _run(run)
    k = r.min_quorum if min_alive is None else min_alive
    measure = f"longest gap with >= {k} learners alive"
    span = r.train_span()
    if span is None:
        return InvariantResult("no_global_downtime", False, None, bound_s, "no inner step was logged: no training "
                               "span to measure", measure, "s")
    merges = advance_times(r.all_records, r.algorithm)
    worst, where, covered = 0.0, (0.0, 0.0), 0.0
    for a, b in alive_intervals(r, k):
        a, b = max(a, span[0]), min(b, span[1])
        if b <= a:
            continue
        covered += b - a
        # downtime() with a zero allowance lists every gap between merges (and the interval's ends)
        for x, y in downtime(merges, a, b, window_s=0.0)["intervals"]:
            if y - x > worst:
                worst, where = y - x, (a + x - r.start, a + y - r.start)
    if covered == 0.0:
        return InvariantResult("no_global_downtime", False, None, bound_s,
                               f"never >= {k} learners alive during training: nothing to measure", measure, "s")
    detail = f"interval {where[0]:.3f}-{where[1]:.3f} s since run start; {covered:.3f} s with >= {k} alive checked"
    return InvariantResult("no_global_downtime", worst <= bound_s, round(worst, 3), bound_s, detail, measure, "s")
