"""`slow`: hold a learner to a fraction of the others' speed with SIGSTOP/SIGCONT (a straggler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded, choice

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
    relative_to: str | None = choice(None, ("others", "own"))
    """"others" (default): the learner's steps are held to `speed` x the unslowed learners' progress, so it
    falls behind them whatever they do (and stops when they stop). "own": a fixed duty cycle, running the first
    `speed` of each period: an older chip that is slower by itself, which keeps its pace while fast learners
    wait (what a bounded wait for a straggler's merge needs: with "others" the straggler waits for the
    waiting learners, and every wait runs to its bound)."""


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
        return ctx.process().slow(spec.target_learner, p.speed, p.period_s or 0.2, p.jitter or 0.0,
                                  own=p.relative_to == "own")
