"""Which algorithm handler the syncer service runs, and the protocol every handler implements.

The service (diloco_chaos/harness/syncer/service.py) owns the transport, the evaluator and the main loop; everything
that depends on the algorithm sits behind `AlgorithmHandler`, built once by the algorithm's descriptor
(`syncer_handler`, diloco_chaos/harness/algorithms/), so the service has no per-algorithm branch:
diloco_chaos/harness/syncer/decoupled.py for Decoupled DiLoCo, diloco_chaos/harness/syncer/barrier.py with the
matching `BarrierCore` (diloco_chaos/trainers/syncers/core.py) for ddp, diloco and elastic_ddp.
"""

from __future__ import annotations

from typing import Protocol

from diloco_chaos.harness.syncer.accounting import Accounting
from diloco_chaos.harness.syncer.transport import Conn
from diloco_chaos.harness.wire.framing import Message
from diloco_chaos.trainers.syncers.core import SyncerCore


class AlgorithmHandler(Protocol):
    """One algorithm's part of the syncer service, called from its main loop only."""

    @property
    def core(self) -> SyncerCore: ...

    @property
    def accounting(self) -> Accounting: ...

    @property
    def fragments(self) -> int | None:
        """Fragments of the model (the `syncer_start` event's field); None where the model is one piece."""

    def restore(self) -> None:
        """Load the state of a syncer that crashed (raises where the algorithm keeps none)."""

    def join_fields(self, learner: int) -> dict[str, object]:
        """A learner joined: the algorithm's fields of its `learner_join` event."""

    def welcome(self, conn: Conn, fields: dict[str, object]) -> None:
        """After its `learner_join` event: send the joined learner what it starts from."""

    def before_leave(self, learner: int) -> None:
        """Its connection closed, before the `learner_leave` event."""

    def after_leave(self, learner: int) -> None:
        """After the `learner_leave` event."""

    def on_bye(self, learner: int) -> None:
        """It said BYE."""

    def on_message(self, learner: int, msg: Message) -> bool:
        """A frame from it; False if this algorithm does not expect that frame type."""

    def progress(self) -> float:
        """The share of the run's planned training done so far, 0 to 1: what spreads `eval.points`."""

    def poll(self, now: float) -> float | None:
        """Time-driven work (merges); the clock time it wants to be called again by, or None."""

    def finish(self) -> None:
        """The run ends: drain what is still open."""
