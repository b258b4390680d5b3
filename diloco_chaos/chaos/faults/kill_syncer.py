"""`kill_syncer`: SIGKILL the synchronizer (one shard, or all); the supervisor restores each killed shard from its
checkpoint after repair_s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, RepairParams, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class KillSyncerParams(RepairParams):
    """Parameters of `kill_syncer`: the repair delay (unset: recovery.syncer_repair_s) and the shard."""

    shard: int | None = bounded(None, 0, 63)
    """The synchronizer shard to kill, in [0, syncer.shards - 1] (unset: every shard)."""


@register
class KillSyncer(FaultKind):
    name = "kill_syncer"
    target = "syncer"
    params = KillSyncerParams
    colour = "#000000"
    summary = "SIGKILL the syncer, or one shard of it (one shot; restored from its checkpoint after repair_s)"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.process().kill_syncer(spec.options.repair_s, spec.options.shard)

    def label(self, spec: FaultSpec) -> str:
        ps = ", ".join(f"{k}={v}" for k, v in spec.params().items() if k != "shard")
        who = "syncer" if spec.options is None or spec.options.shard is None else f"syncer shard {spec.options.shard}"
        return f"{spec.action}({who}{', ' + ps if ps else ''})"
