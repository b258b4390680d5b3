"""`reset_peer`: every connection of one learner's link is reset (RST) after data arrives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import LINK_BACKENDS, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class ResetPeerParams:
    """When connections are reset."""

    timeout_ms: int | None = bounded(None, 0, 3_600_000)
    """Connections are reset this many ms after data arrives (unset or 0: at once)."""


@register
class ResetPeer(FaultKind):
    name = "reset_peer"
    target = "link"
    params = ResetPeerParams
    backends = LINK_BACKENDS
    colour = "#8c564b"
    summary = "one learner's connections reset (RST) after data arrives"

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        return ctx.link().reset_peer(spec.target_learner, spec.options.timeout_ms or 0)
