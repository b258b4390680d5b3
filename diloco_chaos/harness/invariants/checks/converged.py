"""Invariant `converged`: The final eval loss against a baseline run's (plus a tolerance) and/or an absolute bound.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _fmt, _run
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.syncer import Eval


def final_loss(run: Run) -> float | None:
    """Eval loss of the final global checkpoint: the `eval` event of kind final, else report.json's."""
    r = _run(run)
    final = [e for e in r.records(Eval) if e.kind == "final"]
    if final:
        return float(final[-1].loss)
    v = r.report.get("final_eval_loss")
    return None if v is None else float(v)


@register(order=10, mode="when_bound", bounds=(
    Bound("baseline_loss", "a baseline final eval loss, or a baseline run whose final eval loss is taken",
          triggers=True),
    Bound("tolerance", "nats the final loss may exceed baseline_loss by", low=0.0),
    Bound("max_loss", "absolute bound on the final eval loss (nats)", triggers=True)))
def converged(run: Run, *, baseline_loss: float | Run | None = None, tolerance: float | None = None,
              max_loss: float | None = None) -> InvariantResult:
    """The final eval loss is at most `baseline_loss + tolerance` (baseline_loss: a number, or a baseline run
    whose final eval loss is taken, e.g. the fault-free run of the same seed) and/or at most `max_loss`.
    With both, both must hold (the bound shown is the tighter). Doing better than the baseline is fine."""
    if baseline_loss is None and max_loss is None:
        raise ValueError("converged needs baseline_loss (with tolerance) or max_loss")
    if baseline_loss is not None and tolerance is None:
        raise ValueError("converged: baseline_loss needs a tolerance")
    loss = final_loss(run)
    bounds: list[tuple[float, str]] = []
    if baseline_loss is not None:
        assert tolerance is not None
        base = baseline_loss if isinstance(baseline_loss, (int, float)) else final_loss(baseline_loss)
        if base is None:
            raise ValueError("converged: the baseline run has no final eval loss")
        bounds.append((float(base) + tolerance, f"baseline {_fmt(float(base))} + tolerance {_fmt(tolerance)}"))
    if max_loss is not None:
        bounds.append((float(max_loss), f"absolute bound {_fmt(float(max_loss))}"))
    bound, why = min(bounds)
    ok = loss is not None and math.isfinite(loss) and all(loss <= b for b, _ in bounds)
    detail = why if loss is not None else "no final eval loss in the run (no eval event of kind final, no report)"
    return InvariantResult("converged", ok, loss, bound, detail, "final eval loss", "nats", "<=")
