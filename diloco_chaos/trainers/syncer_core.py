"""The protocol every algorithm's syncer core implements for the syncer service
(diloco_chaos/harness/syncer/service.py).

`SyncerCore` is what the service needs of any core: the global model (for eval and the final checkpoint),
the merge count, and the algorithm's own extra checkpoint fields. `BarrierCore` is the shared surface of the
three synchronous cores (`DdpSyncer`, `DilocoSyncer`, `ElasticDdpSyncer`): a learner joins (and is sent the
state it resumes from), leaves, says BYE, or contributes (gradients or parameters) to the open round. With
one interface the service's dispatch has no per-algorithm branch; the cores keep their decisions pure
(`diloco_chaos.trainers.syncer_policy.decide`, `diloco_chaos.trainers.elastic_ddp.decide`). `DecoupledSyncer` implements
`SyncerCore`; its pushes, pulls and merges are driven by diloco_chaos/harness/syncer/decoupled.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from torch import Tensor

if TYPE_CHECKING:
    from diloco_chaos.trainers.baselines import SyncResult
    from diloco_chaos.trainers.elastic_ddp import Reconfiguration

Contribution = Literal["grads", "params"]
"""What a synchronous core's learners send each round: gradients every step (ddp, elastic_ddp) or full
parameters every H steps (diloco)."""


class SyncerCore(Protocol):
    """What the syncer service needs of every algorithm's core."""

    @property
    def params(self) -> Mapping[str, Tensor]:
        """The global model (the replica, for the synchronous cores)."""

    @property
    def merges(self) -> int:
        """Merges (completed rounds) so far: the version eval events carry."""

    def checkpoint_state(self) -> dict[str, object]:
        """Extra fields of the final `global.pt` beyond the parameters and merge count (none: empty)."""


class BarrierCore(SyncerCore, Protocol):
    """A synchronous core: one barrier round after another, every member's contribution awaited."""

    @property
    def contribution(self) -> Contribution: ...

    def on_join(self, learner: int, now: float, why: str) -> tuple[int, dict[str, Tensor]]:
        """A learner connected: the (step, tensors) it resumes from (a fresh learner ignores it)."""

    def on_leave(self, learner: int, now: float, why: str) -> SyncResult:
        """Its link closed and no newer connection replaced it: the open round if that completes it."""

    def on_finished(self, learner: int) -> None:
        """It said BYE."""

    def on_contribution(self, learner: int, key: int, step: int, tokens: int, tensors: dict[str, Tensor],
                        now: float) -> SyncResult:
        """Its contribution to round `key` (the step for gradients, the round for parameters)."""

    def take_reconfigurations(self) -> Sequence[Reconfiguration]:
        """Changes of the global group since the last call (elastic_ddp; the others have none)."""
