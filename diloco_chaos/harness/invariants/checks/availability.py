"""Invariant `availability`: Uptime over the training span (diloco_chaos/harness/report/metrics.py's definition) is at
least a bound.

The global model advances at a merge of the built-in syncer or a committed torchft step
(diloco_chaos/harness/report/progress.py).

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.registry import REQUIRED, Bound, register
from diloco_chaos.harness.report.metrics import DOWNTIME_WINDOW_S, downtime
from diloco_chaos.harness.report.progress import advance_times


@register(order=30, mode="when_bound", bounds=(
    Bound("min_uptime", "smallest uptime allowed (fraction of the training span)", REQUIRED, low=0.0, high=1.0,
          triggers=True),
    Bound("window_s", "merge gap allowed before it counts as downtime (s)", DOWNTIME_WINDOW_S, low=0.0)))
def availability(run: Run, *, min_uptime: float, window_s: float = DOWNTIME_WINDOW_S) -> InvariantResult:
    """Uptime, diloco_chaos/harness/report/metrics.py's `downtime` over the training span (report.json's
    availability.uptime): 1 - (time in merge gaps longer than window_s, beyond their first window_s) / span, is >=
    `min_uptime`."""
    r = _run(run)
    span = r.train_span()
    d = downtime(advance_times(r.all_records, r.algorithm), *span, window_s=window_s) if span else None
    up = d["uptime"] if d else None
    if up is None or d is None or span is None:
        return InvariantResult("availability", False, None, min_uptime, "no training span (fewer than two "
                               "step times) to measure uptime over", "uptime", "", ">=")
    worst = sorted(d["intervals"], key=lambda iv: iv[0] - iv[1])[:3]
    detail = (f"downtime {d['downtime_s']} s of a {span[1] - span[0]:.3f} s training span, window {window_s} s"
              + (f"; longest downtime intervals (s since first step): {worst}" if worst else ""))
    return InvariantResult("availability", up >= min_uptime, up, min_uptime, detail, "uptime", "", ">=")
