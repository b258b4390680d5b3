"""Invariant `initial_pull`: A restarted learner applied every fragment before its first step.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import InitialPull, Step
from diloco_chaos.harness.record.run import LearnerDown, LearnerRestart
from diloco_chaos.harness.record.syncer import LearnerJoin


@register(order=160, requires="fragmented", bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def initial_pull(run: Run, *, show: int = 5) -> InvariantResult:
    """Every learner restarted to resume at a step > 0 (`learner_restart.start_step`) logged an `initial_pull`
    before its first step that applied all of the fragments, each at least at the version the syncer sent it
    when it rejoined (`learner_join.versions`); a learner that failed again before its pull is not counted.
    Figure: restarts whose initial pull was missing or incomplete. No restart: holds, nothing to check."""
    r = _run(run)
    measure = "restarts without a complete initial pull"
    restarts = [e for e in r.records(LearnerRestart) if e.start_step > 0]
    if not restarts:
        return InvariantResult("initial_pull", True, 0, 0, "no learner was restarted past step 0", measure)
    bad, checked = [], 0
    for rs in restarts:
        m, t0 = rs.learner, rs.t
        again = min((e.t for e in r.records(LearnerDown) if e.learner == m and e.t > t0), default=math.inf)
        pull = next((e for e in r.records(InitialPull) if e.learner == m and t0 < e.t < again), None)
        first = next((e.t for e in r.records(Step) if e.learner == m and t0 < e.t < again), None)
        if pull is None:
            if first is not None:
                bad.append(f"learner {m} restarted at {t0 - r.start:.3f} s stepped without an initial pull")
            continue  # failed again before its pull: nothing promised
        checked += 1
        join = next((e for e in r.records(LearnerJoin) if e.learner == m and e.t > t0 and e.versions is not None),
                    None)
        applied = {int(p): int(v) for p, v in pull.applied}
        short = [p for p, v in enumerate(join.versions or []) if applied.get(p, -1) < int(v)] if join else []
        if pull.fragments < pull.of or short:
            bad.append(f"learner {m} restarted at step {rs.start_step}: initial pull applied {pull.fragments} "
                       f"of {pull.of} fragments" + (f", fragments {short} below the version sent on rejoin"
                                                    if short else ""))
    detail = _listing(bad, show) if bad else f"{checked} restart(s), each pulled every fragment first"
    return InvariantResult("initial_pull", not bad, len(bad), 0, detail, measure)
