"""`slow`: hold a learner to a fraction of the others' speed with SIGSTOP/SIGCONT (a straggler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class SlowParams:
    """The speed profile (speed required)."""

    speed: float | None = bounded(None, 0.05, 0.95)
    """Fraction of full speed the learner may run at (an older chip generation, or a straggler)."""
    period_s: float | None = bounded(None, 0.05, 3600.0)
    """Seconds of one run+stop cycle (default 0.2)."""
    jitter: float | None = bounded(None, 0.0, 0.9)
    """The target speed varies per period, uniformly in speed x (1 +- jitter), seeded (default 0)."""


@register
class Slow(FaultKind):
    name = "slow"
    target = "process"
    params = SlowParams
    colour = "#c49c94"
    summary = "a learner held to `speed` of the others' progress"
    required = ("speed",)

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        p = spec.options
        return ctx.process().slow(spec.target_learner, p.speed, p.period_s or 0.2, p.jitter or 0.0)
