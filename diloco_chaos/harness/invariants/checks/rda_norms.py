"""Invariant `rda_norms`: merge_rule rda keeps each merged outer-gradient norm equal to the weighted mean of the
participants'.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _diloco, _listing, _no_merges
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.syncer import Merge
from diloco_chaos.trainers.config import DilocoConfig


@register(order=110, requires="fragmented", bounds=(
    Bound("rel_tol", "relative deviation of a merged norm from the radial norm allowed", 1e-3, low=0.0),
    Bound("show", "problems listed in the detail", 3, low=0)))
def rda_norms(run: Run, *, rel_tol: float = 1e-3, show: int = 3) -> InvariantResult:
    """Per merge, from the `norms` it logged (measured in diloco_chaos.trainers.merge.outer_gradient.outer_gradient on
    the outer
    gradients it used): with diloco.merge_rule rda, the non-embedding tensors' merged norm equals the weighted mean of
    the participants' norms within `rel_tol`; with any rule, no merged norm (embeddings included) exceeds it.
    Figure: the largest relative deviation. A merge of one participant satisfies both trivially; merges of two or
    more are the ones that can tell RDA from a mean (counted in the detail)."""
    r = _run(run)
    measure = "largest relative deviation of merged norm from radial norm"
    merges = r.records(Merge)
    if not merges:
        return _no_merges("rda_norms", rel_tol, measure)
    rule = str(_diloco(r, "merge_rule", DilocoConfig().merge_rule))
    worst, bad, unlogged, multi = 0.0, [], 0, 0
    for e in merges:
        n = e.norms
        if n is None:
            unlogged += 1
            continue
        multi += len(e.participants) > 1
        devs = []
        for radial, merged, exact in ((n["radial"], n["merged"], rule == "rda"),
                                      (n["embedding_radial"], n["embedding_merged"], False)):
            if radial <= 0:
                continue
            rel = float(merged) / float(radial) - 1.0
            devs.append(abs(rel) if exact else max(rel, 0.0))
        dev = max(devs, default=0.0)
        if dev > rel_tol:
            bad.append(f"fragment {e.fragment} v{e.version} ({len(e.participants)} "
                       f"participants): merged {n['merged']:.6g} vs radial {n['radial']:.6g}")
        worst = max(worst, dev)
    if unlogged:
        return InvariantResult("rda_norms", False, None, rel_tol, f"{unlogged} of {len(merges)} merges logged no "
                               "norms (a syncer older than the norms field): unverifiable", measure)
    detail = (_listing(bad, show) if bad else
              f"rule {rule}: {len(merges)} merges, {multi} with two or more participants")
    return InvariantResult("rda_norms", not bad, round(worst, 6), rel_tol, detail, measure)
