"""Invariant `outer_lr`: The outer step's effective learning rate is diloco.outer_lr.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _diloco, _listing, _no_merges
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.syncer import Merge
from diloco_chaos.trainers.config import DilocoConfig


@register(order=120, requires="fragmented", bounds=(
    Bound("rel_tol", "relative deviation of the effective outer lr allowed", 1e-2, low=0.0),
    Bound("show", "problems listed in the detail", 3, low=0)))
def outer_lr(run: Run, *, rel_tol: float = 1e-2, show: int = 3) -> InvariantResult:
    """Per merge, the outer step's effective learning rate it logged (`outer_lr`: the applied change's norm over
    the Nesterov direction's, diloco_chaos.trainers.merge.outer_optimizer) equals diloco.outer_lr within `rel_tol`
    (relative).
    Figure: the largest relative deviation. A step whose direction was 0 logs nan and is skipped (counted)."""
    r = _run(run)
    measure = "largest relative deviation of the effective outer lr"
    merges = r.records(Merge)
    if not merges:
        return _no_merges("outer_lr", rel_tol, measure)
    lr = float(_diloco(r, "outer_lr", DilocoConfig().outer_lr))
    worst, bad, unlogged, zero = 0.0, [], 0, 0
    for e in merges:
        if e.outer_lr is None:
            unlogged += 1
            continue
        eff = float(e.outer_lr)
        if math.isnan(eff):
            zero += 1
            continue
        dev = abs(eff - lr) / max(lr, 1e-12)
        if dev > rel_tol:
            bad.append(f"fragment {e.fragment} v{e.version}: effective lr {eff:.6g}")
        worst = max(worst, dev)
    if unlogged:
        return InvariantResult("outer_lr", False, None, rel_tol, f"{unlogged} of {len(merges)} merges logged no "
                               "outer_lr: unverifiable", measure)
    detail = _listing(bad, show) if bad else f"diloco.outer_lr {lr}: {len(merges) - zero} outer steps checked"
    detail += f"; {zero} with a zero direction skipped" if zero else ""
    return InvariantResult("outer_lr", not bad, round(worst, 6), rel_tol, detail, measure)
