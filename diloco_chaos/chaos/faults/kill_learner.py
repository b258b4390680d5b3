"""`kill_learner`: SIGKILL every chip of a learner at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, RepairParams, register, remember_repair

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@register
class KillLearner(FaultKind):
    name = "kill_learner"
    target = "process"
    params = RepairParams
    colour = "#17becf"
    summary = "SIGKILL every chip of a learner (one shot; restarted after repair_s)"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        remember_repair(ctx, spec)
        return ctx.process().kill_learner(spec.target_learner)
