"""Invariant `ranks_agree`: Every rank of one replica group that committed a torchft step holds the same global
weights after it, where the trainer keeps a full copy of the model at every rank.

Whose promise: the harness's torchft trainer's (diloco_chaos/harness/targets/torchft/trainer.py), not
torchft's. torchft promises agreement across groups at each group rank (`replicas_agree`); a trainer that runs
data parallel inside a group (every rank a full copy, the gradients averaged over the group's own Gloo group
before torchft's cross-group allreduce) promises in addition that the ranks of one group agree. It applies to
the algorithms whose descriptor says so (trait `replicated_ranks`: torchft_ddp); torchft_diloco runs one rank
per replica group, the only layout of torchft's DiLoCo with full copies (docs/targets/torchft.md).

For each replica group and manager step s, the committed `torchft_sync` records of its ranks carry the digest
of the global weights after s; two digests are the trainer's ranks drifting apart (e.g. ranks of a healed group
that loaded different state and were not made consistent). Figure: the (group, step)s with more than one
digest; bound 0. A run whose groups all have one rank has no two ranks to compare: it holds, and says so.
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _listing
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.torchft import TorchftSync


@register(order=175, systems=("torchft",), requires="replicated_ranks",
          bounds=(Bound("show", "problems listed in the detail", 5, low=0),))
def ranks_agree(run: Run, *, show: int = 5) -> InvariantResult:
    """The ranks of each replica group report one global-weights digest per committed step (see the module
    docstring)."""
    r = _run(run)
    by_key: dict[tuple[int, int], dict[str, set[int]]] = {}  # (group, step) -> digest -> the ranks that reported it
    for e in r.records(TorchftSync):
        if e.committed:
            by_key.setdefault((e.learner, e.step), {}).setdefault(e.digest, set()).add(e.rank)
    measure = "group steps whose ranks disagree"
    compared = [key for key, ds in by_key.items() if len(set().union(*ds.values())) > 1]
    if not compared:
        return InvariantResult("ranks_agree", True, 0, 0, "no replica group committed a step at two ranks: every "
                               "group has one rank, nothing to compare", measure)
    forks = sorted(key for key, ds in by_key.items() if len(ds) > 1)
    problems = [f"group {m} step {s}: " + ", ".join(f"{d} by ranks [{' '.join(map(str, sorted(ks)))}]"
                                                    for d, ks in sorted(by_key[(m, s)].items())) for m, s in forks]
    if problems:
        detail = ("the harness's torchft trainer keeps a full copy at every rank of a group, and these ranks "
                  "disagree: " + _listing(problems, show))
    else:
        detail = f"{len(compared)} group steps compared across their ranks, all equal"
    return InvariantResult("ranks_agree", not forks, len(forks), 0, detail, measure)
