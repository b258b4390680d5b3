"""`corrupt`: one random bit flipped in a `probability` fraction of the bytes of one learner's link, both ways.

Carried out by the embedded server's `corrupt` toxic (diloco_chaos/chaos/toxiproxy_server/toxics/corrupt.py), an
extension that upstream Toxiproxy does not have: validation refuses this kind, before any process starts, when the run
would use a real Toxiproxy server. Damaged frames must fail the wire's CRC (or MAC) and be rejected, so nothing
corrupt is ever merged; the learner reconnects and training goes on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from diloco_chaos.chaos.faults.base import FaultContext, FaultHandle, FaultKind, register
from diloco_chaos.trainers.config import bounded

if TYPE_CHECKING:
    from diloco_chaos.chaos.schedule import FaultSpec


@dataclass(frozen=True)
class CorruptParams:
    """How much is damaged (required)."""

    probability: float | None = bounded(None, 1e-9, 0.1)
    """Fraction of bytes, each direction, in which one bit is flipped (seeded by the server)."""


@register
class Corrupt(FaultKind):
    name = "corrupt"
    target = "link"
    params = CorruptParams
    backends = frozenset({"embedded"})
    colour = "#7f7f7f"
    summary = "one bit flipped in a `probability` fraction of one learner's bytes (embedded server only)"
    required = ("probability",)

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        p = spec.options.probability
        toxics = [("corrupt", stream, {"probability": p}) for stream in ("upstream", "downstream")]
        return ctx.link().add_toxics(spec.target_learner, "corrupt", toxics, probability=p)
