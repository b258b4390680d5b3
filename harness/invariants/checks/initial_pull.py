"""Invariant `initial_pull`: A restarted learner applied every fragment before its first step.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list it.
"""

from __future__ import annotations

import math

from harness.invariants.base import InvariantResult, Run, _run
from harness.invariants.checks._common import _listing
from harness.invariants.registry import Bound, register


@register(order=160, algorithms=("decoupled",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def initial_pull(run: Run, *, show: int = 5) -> InvariantResult:
    """Every learner restarted to resume at a step > 0 (`learner_restart.start_step`) logged an `initial_pull`
    before its first step that applied all of the fragments, each at least at the version the syncer sent it
    when it rejoined (`learner_join.versions`); a learner that failed again before its pull is not counted.
    Figure: restarts whose initial pull was missing or incomplete. No restart: holds, nothing to check."""
    r = _run(run)
    measure = "restarts without a complete initial pull"
    restarts = [e for e in r.of("learner_restart") if int(e.get("start_step", 0)) > 0]
    if not restarts:
        return InvariantResult("initial_pull", True, 0, 0, "no learner was restarted past step 0", measure)
    bad, checked = [], 0
    for rs in restarts:
        m, t0 = int(rs["learner"]), float(rs["t"])
        again = min((float(e["t"]) for e in r.of("learner_down") if int(e["learner"]) == m and float(e["t"]) > t0),
                    default=math.inf)
        pull = next((e for e in r.of("initial_pull") if int(e["learner"]) == m and t0 < float(e["t"]) < again), None)
        first = next((float(e["t"]) for e in r.of("step") if int(e["learner"]) == m and t0 < float(e["t"]) < again),
                     None)
        if pull is None:
            if first is not None:
                bad.append(f"learner {m} restarted at {t0 - r.start:.3f} s stepped without an initial pull")
            continue  # failed again before its pull: nothing promised
        checked += 1
        join = next((e for e in r.of("learner_join") if int(e["learner"]) == m and float(e["t"]) > t0
                     and "versions" in e), None)
        applied = {int(p): int(v) for p, v in pull.get("applied", [])}
        short = [p for p, v in enumerate(join["versions"]) if applied.get(p, -1) < int(v)] if join else []
        if int(pull["fragments"]) < int(pull["of"]) or short:
            bad.append(f"learner {m} restarted at step {rs['start_step']}: initial pull applied {pull['fragments']} "
                       f"of {pull['of']} fragments" + (f", fragments {short} below the version sent on rejoin"
                                                       if short else ""))
    detail = _listing(bad, show) if bad else f"{checked} restart(s), each pulled every fragment first"
    return InvariantResult("initial_pull", not bad, len(bad), 0, detail, measure)
