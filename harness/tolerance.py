"""How far a run's final eval loss may sit above a reference before a suite calls it a regression.

What: one rule for every convergence bound in the suites and in `compare`'s verdict: K standard deviations of
the difference of two independent runs (sqrt(2) x the run-to-run standard deviation of the reference
scenario, measured by bench/tolerances.py), plus the cost a test's fault is allowed (measured, and named
where it is used). Why: a hand-picked bound is either loose enough to let a real regression through or tight
enough to flake; one derived from the measured spread says which regressions a suite can catch (docs/metrics.md,
"Loss tolerances", has the measurements and every bound derived from them).
"""

from __future__ import annotations

import math

K_SIGMA = 3.0
"""Standard deviations of the two-run difference a run may be off by: a false alarm about once in 700
comparisons of the same scenario, if the spread is normal."""


def loss_tolerance(sd: float, cost: float = 0.0, k: float = K_SIGMA) -> float:
    """Nats per byte a run may end above its reference: `cost` (what the fault is allowed to cost) plus `k` x
    sqrt(2) x `sd` (the run-to-run standard deviation of the final eval loss, measured on the reference
    scenario). Raises ValueError on a negative input."""
    if sd < 0 or cost < 0 or k < 0:
        raise ValueError(f"loss_tolerance needs sd, cost and k >= 0, got {sd}, {cost}, {k}")
    return cost + k * math.sqrt(2.0) * sd
