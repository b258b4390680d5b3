"""Invariant `quorum_ids_monotonic`: A replica's torchft quorum ids never decrease within one process.

Per trainer process (learner, rank, pid; a restarted rank starts afresh), the quorum ids it reports, in time
order, on `torchft_quorum` (a new quorum received), `torchft_sync` and `torchft_commit` records
(diloco_chaos/harness/record/torchft.py), never go down. An id that goes down means the process was put back into
an older configuration: e.g. a restarted Lighthouse numbering its quorums from 1 again while the replicas still
run (torchft 0.2.0 does reuse ids after a Lighthouse restart, docs/targets/torchft.md). Figure: decreases; bound
0. A run whose processes reported no quorum is a violation (no evidence).
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.checks.torchft._process import Process, name, process_of
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftCommit, TorchftQuorum, TorchftSync


@register(order=172, systems=("torchft",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def quorum_ids_monotonic(run: Run, *, show: int = 5) -> InvariantResult:
    """Each process's quorum ids never decrease (see the module docstring)."""
    r = _run(run)
    last: dict[Process, int] = {}
    problems: list[str] = []
    seen = 0
    for e in r.all_records:
        if not isinstance(e, TorchftQuorum | TorchftSync | TorchftCommit):
            continue
        p = process_of(e)
        seen += 1
        prev = last.get(p)
        if prev is not None and e.quorum_id < prev:
            problems.append(f"{name(p)} at {e.t - r.start:.3f} s: quorum {prev} -> {e.quorum_id} ({e.ev})")
        last[p] = max(e.quorum_id, prev if prev is not None else e.quorum_id)
    measure = "quorum id decreases"
    if seen == 0:
        return InvariantResult("quorum_ids_monotonic", False, None, 0, "no torchft quorum was reported: nothing to "
                               "check", measure)
    detail = _listing(problems, show) if problems else (
        f"{seen} quorum ids of {len(last)} processes, none lower than an earlier one")
    return InvariantResult("quorum_ids_monotonic", not problems, len(problems), 0, detail, measure)
