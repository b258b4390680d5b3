"""Invariant `commits_monotonic`: A replica's committed torchft step rises by 1 from one commit to the next, or
jumps forward only by a heal.

Per trainer process (learner, rank, pid: a restarted rank is a new process, whose manager starts from step 0 and
heals), the `torchft_sync` records with committed = true (diloco_chaos/harness/record/torchft.py), in time order:
each one's manager step must be the previous commit's + 1. A larger jump is allowed only when the process healed
since its previous commit (a sync with healed = true, this one included, or a `torchft_quorum` whose max step was
ahead of the process: it continued from a live peer's state). A step that repeats or goes back is a replica that
committed the same global step twice or rolled back; a jump without a heal skipped steps it never trained.
Figure: such commits; bound 0. A run without a committed sync has nothing to check, which is a violation (no
evidence).
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.checks.torchft._process import Process, name, process_of
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftQuorum, TorchftSync


@register(order=171, systems=("torchft",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def commits_monotonic(run: Run, *, show: int = 5) -> InvariantResult:
    """Each process's committed steps rise by exactly 1, or jump forward after a heal (see the module
    docstring)."""
    r = _run(run)
    last: dict[Process, int] = {}
    healed: dict[Process, bool] = {}
    problems: list[str] = []
    commits = 0
    for e in r.all_records:
        if isinstance(e, TorchftQuorum):
            p = process_of(e)
            if p in last and e.step > last[p]:
                healed[p] = True
            continue
        if not isinstance(e, TorchftSync):
            continue
        p = process_of(e)
        healed[p] = healed.get(p, False) or e.healed
        if not e.committed:
            continue
        commits += 1
        prev = last.get(p)
        if prev is not None and e.step != prev + 1 and not (e.step > prev + 1 and healed[p]):
            why = "repeated" if e.step == prev else "went back" if e.step < prev else "jumped without a heal"
            problems.append(f"{name(p)} at {e.t - r.start:.3f} s: step {prev} -> {e.step} ({why})")
        last[p], healed[p] = e.step, False
    measure = "commits out of sequence"
    if commits == 0:
        return InvariantResult("commits_monotonic", False, None, 0, "no committed torchft step: nothing to check",
                               measure)
    detail = _listing(problems, show) if problems else (
        f"{commits} commits of {len(last)} processes, each the previous step + 1 or after a heal")
    return InvariantResult("commits_monotonic", not problems, len(problems), 0, detail, measure)
