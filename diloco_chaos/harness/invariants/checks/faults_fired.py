"""Invariant `faults_fired`: Every scheduled fault started and hit something.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from typing import Any

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.run import FaultStart


def _describe_fault(f: dict[str, Any]) -> str:
    who = "syncer" if f.get("learner") is None else f"learner {f['learner']}"
    return f"{f.get('action', '?')}({who})"


@register(order=40, bounds=(
    Bound("allow_missed", "count a fault whose target was already down as fired", False),))
def faults_fired(run: Run, *, allow_missed: bool = False) -> InvariantResult:
    """Every fault in config.json's `faults` has a `fault_start` with its index; one whose start logged
    `missed` (its target was already down, it hit nothing) does not count unless `allow_missed`.
    Figure: faults that fired; bound: faults scheduled."""
    r = _run(run)
    scheduled = list(r.config.get("faults", []))
    starts = {e.index: e for e in r.records(FaultStart)}
    never, missed = [], []
    for i, f in enumerate(scheduled):
        e = starts.get(i)
        if e is None:
            never.append(f"faults[{i}] {_describe_fault(f)}")
        elif e.missed is not None and not allow_missed:
            missed.append(f"faults[{i}] {e.describe}: {e.missed}")
    fired = len(scheduled) - len(never) - len(missed)
    parts = ([f"never fired: {'; '.join(never)}"] if never else []) + (
        [f"fired but hit nothing: {'; '.join(missed)}"] if missed else [])
    detail = "; ".join(parts) if parts else f"{len(scheduled)} scheduled"
    return InvariantResult("faults_fired", fired == len(scheduled), fired, len(scheduled), detail,
                           "faults fired", "", ">=")
