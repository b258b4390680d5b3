"""`loss`: a `percent` share of one learner's packets to and from the syncer dropped at random, both ways.

Packet loss happens below TCP, so no Toxiproxy server can make it (a proxy sees a byte stream): only the kernel
link backend carries it, as an nftables `numgen random` drop rule on the learner host's veth
(diloco_chaos/chaos/kernel_links.py). TCP retransmits what is lost, so the link is slower and burstier, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import KERNEL, FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class LossParams:
    """How much is lost (required)."""

    percent: float | None = bounded(None, 0.01, 100.0)
    """Share of packets dropped, each direction, in percent (to 0.01 %)."""


@register
class Loss(FaultKind):
    name = "loss"
    target = "link"
    params = LossParams
    backends = KERNEL
    colour = "#8c564b"
    summary = "a `percent` share of one learner's packets dropped at random (kernel backend only)"
    required = ("percent",)

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        p = spec.options.percent
        toxics = [("loss", stream, {"percent": p}) for stream in ("upstream", "downstream")]
        return ctx.link().add_toxics(spec.target_learner, "loss", toxics, percent=p)
