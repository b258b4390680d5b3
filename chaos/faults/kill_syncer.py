"""`kill_syncer`: SIGKILL the synchronizer; the supervisor restores it from its checkpoint after repair_s."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chaos.faults.base import FaultContext, FaultHandle, FaultKind, RepairParams, register, remember_repair

if TYPE_CHECKING:
    from chaos.schedule import FaultSpec


@register
class KillSyncer(FaultKind):
    name = "kill_syncer"
    target = "syncer"
    params = RepairParams
    colour = "#000000"
    summary = "SIGKILL the syncer (one shot; restored from its checkpoint after repair_s)"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        remember_repair(ctx, spec)
        return ctx.process().kill_syncer(spec.options.repair_s)
