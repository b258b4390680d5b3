"""`crash_host`: SIGKILL a learner's host (chip 0, the only process that talks to the syncer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, RepairParams, register, remember_repair

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@register
class CrashHost(FaultKind):
    name = "crash_host"
    target = "process"
    params = RepairParams
    colour = "#2ca02c"
    summary = "SIGKILL a learner's host chip (one shot; restarted after repair_s)"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        remember_repair(ctx, spec)
        return ctx.process().crash_host(spec.target_learner)
