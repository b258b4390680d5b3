"""`flap`: partition and heal one learner's link periodically."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import KERNEL, LINK_BACKENDS, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class FlapParams:
    """The flapping cycle (both required)."""

    period_s: float | None = bounded(None, 0.05, 3600.0)
    """Seconds of one down+up cycle."""
    duty: float | None = bounded(None, 0.01, 0.99)
    """Fraction of each period the link is down."""


@register
class Flap(FaultKind):
    name = "flap"
    target = "link"
    params = FlapParams
    backends = LINK_BACKENDS | KERNEL
    colour = "#e377c2"
    summary = "one learner's link down for duty x period_s of every period_s"
    required = ("period_s", "duty")

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.link().flap(spec.target_learner, spec.options.period_s, spec.options.duty)
