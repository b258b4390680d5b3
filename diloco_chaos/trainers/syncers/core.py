"""The protocol every algorithm's syncer core implements for the syncer service
(diloco_chaos/harness/syncer/service.py).

`SyncerCore` is what the service needs of any core: the global model (for eval and the final checkpoint),
the merge count, and the algorithm's own extra checkpoint fields. `BarrierCore` is the shared surface of the
three synchronous cores (`DdpSyncer`, `DilocoSyncer`, `ElasticDdpSyncer`): a learner joins (and is sent the
state it resumes from), leaves, says BYE, or contributes (gradients or parameters) to the open round. With
one interface the service's dispatch has no per-algorithm branch; the cores keep their decisions pure
(`diloco_chaos.trainers.merge.quorum.decide`, `diloco_chaos.trainers.syncers.elastic_ddp.decide`). `DecoupledSyncer`
implements
`SyncerCore`; its pushes, pulls and merges are driven by diloco_chaos/harness/syncer/decoupled.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from torch import Tensor


@dataclass
class SyncRound:
    """Result of a completed synchronous round."""

    key: int
    participants: list[int]
    tokens: list[int]
    step: int
    tensors: dict[str, Tensor]
    replay_to: int | None = None
    """Set when this is an already-sent result asked for again by one learner (its reply was lost)."""


@dataclass(frozen=True)
class SyncRejected:
    """A contribution refused for a reason other than its content (which `False` stands for: non-finite or
    malformed); `reason` goes into the `sync_rejected` event."""

    reason: str


SyncResult = SyncRound | None | bool | SyncRejected
"""What a synchronous core answers a contribution with: the completed round (or a replay to one learner),
None while waiting, True when there is nothing to send, False when non-finite or malformed, `SyncRejected`
otherwise."""


@dataclass(frozen=True)
class Reconfiguration:
    """One change of the global group, logged as an `elastic_reconfigure` event."""

    kind: Literal["shrink", "grow"]
    learner: int
    members_before: list[int]
    members_after: list[int]
    step: int
    """The first step the new membership holds for."""
    started_at: float
    """Shrink: when the survivors began waiting on the lost learner alone. Grow: when it was admitted."""
    ended_at: float
    """Shrink: when the group stopped waiting for it. Grow: when the first step with it completed."""
    stall_s: float
    """Time the other members waited at the barrier because of the change (shrink: on the lost learner until its
    loss was known; grow: on the newcomer's first gradient after the others' were in)."""
    reason: str


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

    def take_rollbacks(self) -> Sequence[tuple[int, int, int]]:
        """elastic_ddp restarted whole (engine torchrun): (from step, to step, learner) of each rollback to the
        checkpoint since the last call; [] for the others."""
