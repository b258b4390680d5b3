"""Invariant `apply_schedule`: A merged fragment is applied after step max(pulled + tau, arrived + 1), never earlier
or later.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from collections import defaultdict

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _diloco, _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import Apply, ApplyWait, Regroup
from diloco_chaos.harness.record.syncer import Merge
from diloco_chaos.trainers.config import DilocoConfig


@register(order=150, requires="fragmented", bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def apply_schedule(run: Run, *, show: int = 5) -> InvariantResult:
    """Every merged fragment a learner applied (`apply` events, with the step the value was pulled at, None
    for a value it did not take part in, and the step it arrived at) was applied after step
    max(pulled + tau, arrived + 1) with tau = diloco.overlap (arrived + 1 when pulled is None): no earlier, and
    no later unless a `regroup` of that learner's chips at a step in between held it back. Figure: applies off
    schedule. An apply bound by the schedule (pulled + tau > arrived + 1) is the kind that shows a shifted tau."""
    r = _run(run)
    measure = "applies off the tau schedule"
    tau = int(_diloco(r, "overlap", DilocoConfig().overlap))
    applies = r.records(Apply)
    if not applies:
        ok = not any(e.participants for e in r.records(Merge))
        return InvariantResult("apply_schedule", False, None, 0, "no apply was logged" +
                               ("" if ok else " although merges had participants") + ": nothing to check", measure)
    regroups: dict[int, list[int]] = defaultdict(list)
    for g in r.records(Regroup):
        regroups[g.learner].append(g.step)
    waited = {(w.learner, w.fragment, w.step) for w in r.records(ApplyWait) if w.outcome != "timed_out"}
    bad, unlogged, checked, by_schedule = [], 0, 0, 0
    for e in applies:
        if e.pulled is None or e.arrived is None:
            unlogged += 1
            continue
        m, step = e.learner, e.step
        for p, v, pulled, arrived in zip(e.fragments or [], e.versions or [], e.pulled, e.arrived, strict=True):
            if arrived is None:
                unlogged += 1
                continue
            checked += 1
            due = int(arrived) + 1 if pulled is None else max(int(pulled) + tau, int(arrived) + 1)
            if (m, p, step) in waited:  # diloco.apply_wait = block: waited for at this step, applied after it
                due = step
            by_schedule += pulled is not None and int(pulled) + tau > int(arrived) + 1
            held = any(int(arrived) <= g <= step for g in regroups[m])
            if step < due or (step > due and not held):
                bad.append(f"learner {m} applied fragment {p} v{v} after step {step}, due after {due} "
                           f"(pulled at {pulled}, arrived at {arrived}, tau {tau})")
    if unlogged:
        return InvariantResult("apply_schedule", False, None, 0, f"{unlogged} applied fragments without pulled / "
                               "arrived steps (an older learner): unverifiable", measure)
    detail = _listing(bad, show) if bad else (f"{checked} applied fragments on schedule, {by_schedule} of them "
                                              "due by pulled + tau rather than on arrival")
    return InvariantResult("apply_schedule", not bad, len(bad), 0, detail, measure)
