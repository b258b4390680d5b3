"""Invariant `replicas_agree`: At every group rank, every replica group that committed a torchft step holds the
same global weights after it (torchft's guarantee, as torchft states it).

Whose promise: torchft's. torchft averages across replica groups per group rank: rank r of every group joins one
cross-group process group, its DiLoCo allreduces each fragment's pseudo-gradient over it, and a healing group's
rank r loads the state of rank r of a live group (round robin over the up-to-date groups: the source differs
from rank to rank by design). So what torchft promises is: for each rank r, the groups that committed step s
agree at rank r. Nothing of torchft's promises that rank 0 and rank 1 of one group hold the same weights (with
torchtitan they hold different shards); where a trainer keeps a full copy at every rank, that agreement is the
trainer's own promise, checked by `ranks_agree`.

For each manager step s and group rank r, the `torchft_sync` records with committed = true
(diloco_chaos/harness/record/torchft.py) carry a digest of the global weights after s (torchft_ddp the model's
parameters, torchft_diloco every fragment's last synced weights). A (step, rank) with two digests is a fork of
the history: groups that both committed s but disagree at rank r on what s produced, e.g. a stale group that
formed a quorum alone and retrained steps the others had already committed. Figure: the steps with a fork at
some rank; bound 0. A run in which no (step, rank) was committed by two groups has nothing to compare, which is
a violation (no evidence). Each digest is listed with the groups that reported it, per rank (`r<k>:` where the
groups have several ranks).
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftSync


@register(order=170, systems=("torchft",), bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def replicas_agree(run: Run, *, show: int = 5) -> InvariantResult:
    """At each group rank, every replica group that committed step s reports the same global-weights digest for
    s (see the module docstring)."""
    r = _run(run)
    by_key: dict[tuple[int, int], dict[str, set[int]]] = {}  # (step, rank) -> digest -> the groups that reported it
    for e in r.records(TorchftSync):
        if e.committed:
            by_key.setdefault((e.step, e.rank), {}).setdefault(e.digest, set()).add(e.learner)
    several_ranks = len({rank for _, rank in by_key}) > 1
    compared = {s for (s, _), ds in by_key.items() if len(set().union(*ds.values())) > 1}
    forked = {key for key, ds in by_key.items() if len(ds) > 1}
    forks = sorted({s for s, _ in forked})
    measure = "steps whose committing replica groups disagree at a group rank"
    if not compared and not forks:
        return InvariantResult("replicas_agree", False, None, 0, "no step was committed at the same group rank by "
                               "two replica groups: nothing to compare", measure)

    def at(s: int, k: int) -> str:
        ds = by_key[(s, k)]
        return (f"r{k}: " if several_ranks else "") + ", ".join(
            f"{d} by groups [{' '.join(map(str, sorted(gs)))}]" for d, gs in sorted(ds.items()))

    problems = [f"step {s}: " + "; ".join(at(s, k) for k in sorted(k for t, k in forked if t == s)) for s in forks]
    per = " at every group rank" if several_ranks else ""
    detail = _listing(problems, show) if problems else f"{len(compared)} steps compared across groups{per}, all equal"
    return InvariantResult("replicas_agree", not forks, len(forks), 0, detail, measure)
