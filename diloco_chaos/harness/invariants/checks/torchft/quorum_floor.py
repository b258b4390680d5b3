"""Invariant `quorum_floor`: No torchft step was committed by a quorum of fewer than torchft.min_replicas groups.

Every `torchft_sync` record with committed = true (diloco_chaos/harness/record/torchft.py) carries the number of
replica groups in its quorum (`participants`); none may be below the scenario's torchft.min_replicas (the
Lighthouse's --min_replicas, which promises that no quorum is formed with fewer). A commit below it would mean
that a smaller set of groups than configured advanced the global model alone. Figure: the smallest quorum that
committed; bound min_replicas. A run without a committed sync is a violation (no evidence).
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftSync


@register(order=173, systems=("torchft",), bounds=(
    Bound("min_replicas", "smallest quorum allowed to commit (default the scenario's torchft.min_replicas)", low=1),
    Bound("show", "problems listed in the detail", 5, low=0)))
def quorum_floor(run: Run, *, min_replicas: int | None = None, show: int = 5) -> InvariantResult:
    """Every committed step's quorum has at least `min_replicas` participants (see the module docstring)."""
    r = _run(run)
    floor = int(r.config.get("torchft", {}).get("min_replicas", 1)) if min_replicas is None else min_replicas
    commits = [e for e in r.records(TorchftSync) if e.committed]
    measure = "smallest quorum that committed"
    if not commits:
        return InvariantResult("quorum_floor", False, None, floor, "no committed torchft step: nothing to check",
                               measure, "", ">=")
    low = [e for e in commits if e.participants < floor]
    problems = [f"learner {e.learner} rank {e.rank} step {e.step} (quorum {e.quorum_id}) at {e.t - r.start:.3f} s: "
                f"{e.participants} participants" for e in low]
    smallest = min(e.participants for e in commits)
    detail = _listing(problems, show) if problems else f"{len(commits)} commits, every quorum >= {floor}"
    return InvariantResult("quorum_floor", not low, smallest, floor, detail, measure, "", ">=")
