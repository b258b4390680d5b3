"""Invariant `rejoined`: Every failed learner was back within a bound after its repair delay.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.registry import REQUIRED, Bound, register
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.run import ChipRepairSkipped, LearnerDown, LearnerRestart
from diloco_chaos.harness.record.syncer import LearnerJoin
from diloco_chaos.harness.record.torchft import TorchftSync


@register(order=50, mode="when_bound", bounds=(
    Bound("within_s", "longest delay from repair done to back (joined and stepping) (s)", REQUIRED, low=0.0,
          renamed_from="rejoin_within_s", triggers=True),))
def rejoined(run: Run, *, within_s: float) -> InvariantResult:
    """Every failed learner (a `learner_down`: the supervisor saw one of its chips die and will restart it)
    was back within `within_s` after its repair delay ended: back = both the syncer logged its `learner_join`
    (on the torchft target: the group committed a step in a quorum, a committed `torchft_sync`) and it logged
    an inner `step`, after its `learner_restart`. A failure the supervisor chose not to repair (a
    `chip_repair_skipped` before any restart: on torchft, when no other replica group is left to heal from) is
    not expected back and not counted. Figure: the longest delay from
    learner_down.t + repair_s to being back (inf if it never came back, or failed again first)."""
    r = _run(run)
    downs = r.records(LearnerDown)
    if not downs:
        return InvariantResult("rejoined", True, 0.0, within_s, "no learner failed", "longest rejoin delay", "s")
    worst, worst_detail = -math.inf, ""
    skipped = 0
    for d in downs:
        m, t_down = d.learner, d.t
        ready = t_down + float(d.repair_s)
        again = next((e.t for e in downs if e.learner == m and e.t > t_down), math.inf)
        restart = next((e for e in r.records(LearnerRestart) if e.learner == m and t_down < e.t < again), None)
        if restart is None and any(e.learner == m and t_down < e.t < again for e in r.records(ChipRepairSkipped)):
            skipped += 1  # not restarted by design (torchft: no live group left to heal from): not expected back
            continue
        back = math.inf
        if restart is not None:
            t0 = restart.t
            join = next((e.t for e in r.records(LearnerJoin) if e.learner == m and t0 < e.t), math.inf)
            # the torchft target has no syncer: a replica group joins when it commits in a quorum again
            join = min(join, next((e.t for e in r.records(TorchftSync) if e.learner == m and e.committed
                                   and t0 < e.t), math.inf))
            step = next((e.t for e in r.records(Step) if e.learner == m and t0 < e.t), math.inf)
            back = max(join, step)
        if back >= again:
            back = math.inf
        delay = back - ready
        if delay > worst:
            how = ("never back" if back == math.inf else
                   f"back {back - r.start:.3f} s since run start")
            worst, worst_detail = delay, (f"learner {m} down at {t_down - r.start:.3f} s, repair done at "
                                          f"{ready - r.start:.3f} s, {how}")
    if worst == -math.inf:
        return InvariantResult("rejoined", True, 0.0, within_s, f"{len(downs)} failure(s), each repair skipped "
                               "(chip_repair_skipped: not restarted)", "longest rejoin delay", "s")
    figure = round(worst, 3) if math.isfinite(worst) else math.inf
    detail = (f"{len(downs)} failure(s)" + (f" ({skipped} not restarted: chip_repair_skipped)" if skipped else "")
              + f"; worst: {worst_detail}")
    return InvariantResult("rejoined", figure <= within_s, figure, within_s, detail, "longest rejoin delay", "s")
