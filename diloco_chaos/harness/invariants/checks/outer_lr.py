"""Invariant `outer_lr`: The outer step's effective learning rate is diloco.outer_lr, and each step starts from the
momentum its fragment's previous step left (across a syncer restore too).

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _diloco, _listing, _no_merges
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.syncer import Merge, SyncerRestore, shard_of
from diloco_chaos.trainers.config import DilocoConfig


@register(order=120, requires="fragmented", bounds=(
    Bound("rel_tol", "relative deviation of the effective outer lr (and of a step's starting momentum) allowed",
          1e-2, low=0.0),
    Bound("show", "problems listed in the detail", 3, low=0)))
def outer_lr(run: Run, *, rel_tol: float = 1e-2, show: int = 3) -> InvariantResult:
    """Per merge, the outer step's effective learning rate it logged (`outer_lr`: the applied change's norm over
    the Nesterov direction's, diloco_chaos.trainers.merge.outer_optimizer) equals diloco.outer_lr within `rel_tol`
    (relative); and the norm of its fragment's momentum before the step (`momentum_in`, in the merge's `norms`)
    equals the norm the fragment's previous merge left (`momentum_out`; 0 before its first), within `rel_tol`. A
    restored syncer (`syncer_restore`, of the fragment's shard) between the two must have loaded the momentum:
    the pair is compared when it restored the version the previous merge made, and skipped (counted) when it
    restored another (a merge checkpointed but never logged). Merges that logged no momentum (an older run) are
    not compared.
    Figure: the largest relative deviation of either. A step whose direction was 0 logs nan and is skipped
    (counted)."""
    r = _run(run)
    measure = "largest relative deviation of the effective outer lr or of a step's starting momentum"
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
    m_worst, m_bad, compared, skipped = _momentum(r.all_records, rel_tol)
    worst = max(worst, m_worst)
    bad += m_bad
    detail = _listing(bad, show) if bad else f"diloco.outer_lr {lr}: {len(merges) - zero} outer steps checked"
    detail += f"; {zero} with a zero direction skipped" if zero else ""
    detail += f"; momentum carried over in {compared} steps" if compared and not m_bad else ""
    detail += f" ({skipped} after a restore of another version, not compared)" if skipped else ""
    return InvariantResult("outer_lr", not bad, round(worst, 6), rel_tol, detail, measure)


def _momentum(records: list, rel_tol: float) -> tuple[float, list[str], int, int]:
    """Each merge's starting momentum against what its fragment's previous merge left (see `outer_lr`).
    Returns (the largest relative deviation, one line per deviation beyond `rel_tol`, pairs compared, pairs
    skipped after a restore of another version)."""
    last: dict[int, Merge] = {}  # fragment -> its previous merge
    restored: dict[int, int] = {}  # fragment -> the version a restore since its previous merge loaded
    worst, bad, compared, skipped = 0.0, [], 0, 0
    for e in records:
        if isinstance(e, SyncerRestore):
            for p, v in enumerate(e.versions):
                prev = last.get(p)
                if prev is None or shard_of(prev.proc) == shard_of(e.proc):
                    restored[p] = int(v)
            continue
        if not isinstance(e, Merge) or e.fragment is None:
            continue
        p = e.fragment
        prev = last.get(p)
        last[p] = e
        back = restored.pop(p, None)
        got, want = _norm(e, "momentum_in"), _norm(prev, "momentum_out") if prev is not None else 0.0
        if got is None or want is None:
            continue
        if back is not None and back != (prev.version if prev is not None else 0):
            skipped += 1
            continue
        dev = abs(got - want) / max(abs(want), 1e-12) if got != want else 0.0
        compared += 1
        if dev > rel_tol:
            after = " after a syncer restore" if back is not None else ""
            bad.append(f"fragment {p} v{e.version}: its step started from momentum norm {got:.6g}{after}, the "
                       f"previous step of the fragment left {want:.6g}")
        worst = max(worst, dev)
    return worst, bad, compared, skipped


def _norm(e: Merge, key: str) -> float | None:
    """A momentum norm a merge logged in its `norms` (None: an older run, which logged none)."""
    value = (e.norms or {}).get(key)
    return None if value is None else float(value)
