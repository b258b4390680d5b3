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
from dataclasses import dataclass

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


SEED_SD = 0.019
"""Seed-to-seed standard deviation of fault-free ddp's final eval on the fault-free scenario (seeds 0-9,
bench/spread.py): the spread used for a reference that repeats exactly on one machine (ddp, diloco), since
another CPU's kernels round differently and so move a run about as far as another seed does."""


@dataclass(frozen=True)
class Reference:
    """A suite's measured reference run: where its final eval lands, how much it varies, and what the test's
    fault is allowed to cost on top (docs/metrics.md, "Loss tolerances", has each one's measurement)."""

    row: str
    """The bench/tolerances.py row it was measured by."""
    mean: float
    """Mean final eval loss (nats per byte) of the reference scenario, repeated with its own seed."""
    sd: float
    """Run-to-run standard deviation of that final eval (SEED_SD for a reference that repeats exactly)."""
    cost: float = 0.0
    """What the test's fault may cost on top: the largest cost measured in one run of it (its final eval minus
    its reference's), rounded up to a multiple of 0.05; 0 where none was positive."""

    def tolerance(self) -> float:
        """How far above a fault-free twin run (or `mean`) the test's run may end."""
        return loss_tolerance(self.sd, self.cost)

    def bound(self) -> float:
        """The final eval loss the test's run must not exceed when it has no twin run: mean + tolerance()."""
        return self.mean + self.tolerance()
