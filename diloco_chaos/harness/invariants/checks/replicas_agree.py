"""Invariant `replicas_agree`: Every replica group that committed a torchft step holds the same global weights
after it.

For each manager step s, the `torchft_sync` records with committed = true (one per rank of each replica group;
diloco_chaos/harness/record/torchft.py) carry a digest of the global weights after s: torchft_ddp the model's
parameters, torchft_diloco every fragment's last synced weights. All of them must be equal, rank by rank across
groups (each rank holds its own shard-free copy, so every rank of every group is compared). A step with two
digests is a fork of the history: replicas that both committed s but disagree on what s produced, e.g. a stale
group that formed a quorum alone and retrained steps the others had already committed. Figure: the steps with
more than one digest; bound 0. A run in which no step was committed by two groups has nothing to compare, which
is a violation (no evidence). Each digest is listed with who reported it: `group/rank` (rank numbers only where
a group has several), so a group whose own ranks disagree (each rank healed from a different peer: docs/targets/
torchft.md "Findings") reads apart from two groups that disagree.
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftSync


@register(order=170, systems=("torchft",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def replicas_agree(run: Run, *, show: int = 5) -> InvariantResult:
    """Every replica group that committed step s reports the same global-weights digest for s (see the module
    docstring)."""
    r = _run(run)
    by_step: dict[int, dict[str, set[tuple[int, int]]]] = {}  # step -> digest -> the (group, rank)s that reported it
    ranks: dict[int, set[int]] = {}
    for e in r.records(TorchftSync):
        if e.committed:
            by_step.setdefault(e.step, {}).setdefault(e.digest, set()).add((e.learner, e.rank))
            ranks.setdefault(e.learner, set()).add(e.rank)
    compared = [s for s, ds in by_step.items() if len({g for gs in ds.values() for g, _ in gs}) > 1]
    forks = sorted(s for s, ds in by_step.items() if len(ds) > 1)
    measure = "steps whose committing replicas disagree"
    if not compared and not forks:
        return InvariantResult("replicas_agree", False, None, 0, "no step was committed by two replica groups: "
                               "nothing to compare", measure)
    def who(gs: set[tuple[int, int]]) -> str:
        return " ".join(f"{g}/{k}" if len(ranks[g]) > 1 else str(g) for g, k in sorted(gs))

    problems = [f"step {s}: " + ", ".join(f"{d} by groups [{who(gs)}]" for d, gs in sorted(by_step[s].items()))
                for s in forks]
    detail = _listing(problems, show) if problems else f"{len(compared)} steps compared across groups, all equal"
    return InvariantResult("replicas_agree", not forks, len(forks), 0, detail, measure)
