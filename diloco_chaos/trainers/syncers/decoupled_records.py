"""The Decoupled DiLoCo syncer's records: push outcomes and their causes (enums that events carry), and the
round, merge and pull records `DecoupledSyncer` (diloco_chaos/trainers/syncers/decoupled.py) hands to the syncer
service.

Kept apart from the syncer's logic so that readers of the event log (invariants, the typed event records)
import the vocabulary without the merge machinery.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from torch import Tensor

from diloco_chaos.trainers.merge.outer_gradient import MergeNorms
from diloco_chaos.trainers.messages import FragmentPush


class SupersededCause(enum.Enum):
    """Why a push was not merged and will not be: the `cause` of a push_superseded event. Readers of the event
    log (the updates_accounted invariant) match on it, never on the event's human-readable reason."""

    NEWER = "newer"
    """A newer push of the same learner and fragment replaced it in the same round."""
    REJOIN_DROP = "rejoin_drop"
    """Carried from before its learner rejoined, which is sent the current value instead."""
    STALE = "stale"
    """Its work is already merged, or its base version is no longer held to anchor it (PushOutcome.STALE,
    UNANCHORED)."""
    BEFORE_REJOIN = "before_rejoin"
    """Based on a version older than the one its learner was sent when it rejoined."""
    LAGGING = "lagging"
    """Based on a version more than max_staleness versions behind the current one."""
    OVERWRITTEN = "overwritten"
    """Based on a version older than a merge its learner was not in and was sent (diloco.broadcast = all), which
    overwrites that work (PushOutcome.OVERWRITTEN)."""
    BROADCAST_DROP = "broadcast_drop"
    """Carried for the fragment's next round when its learner was sent a merge it was not in, which overwrites
    that work (diloco.broadcast = all)."""

    @classmethod
    def of(cls, outcome: PushOutcome) -> SupersededCause:
        """The cause a push's outcome gives it (only outcomes that supersede: STALE, UNANCHORED,
        BEFORE_REJOIN, LAGGING, OVERWRITTEN)."""
        return {PushOutcome.STALE: cls.STALE, PushOutcome.UNANCHORED: cls.STALE,
                PushOutcome.BEFORE_REJOIN: cls.BEFORE_REJOIN, PushOutcome.LAGGING: cls.LAGGING,
                PushOutcome.OVERWRITTEN: cls.OVERWRITTEN}[outcome]


class PushOutcome(enum.Enum):
    ACCEPTED = "accepted"
    """An answer to the open round's pull (a learner at the sync point): a fresh push, counted toward K."""
    CARRIED = "carried"
    """An answer that arrived after its round merged, or a final push with no round open: held for (or put in)
    the fragment's open or next round and merged there, not counted toward K."""
    DECLINED = "declined"
    REJECTED_NONFINITE = "rejected_nonfinite"
    REJECTED_SHAPE = "rejected_shape"
    """The push's tensors are not the fragment's: other names, another shape, or another dtype (a float16 or
    integer copy would be merged cast to float32, its values rounded or truncated)."""
    REJECTED_FRAGMENT = "rejected_fragment"
    STALE = "stale"
    """The learner's copy still carries work already merged: it has not applied the version that merge made
    (its host is stalled, or the broadcast was lost). Merging it again would count that work twice."""
    UNANCHORED = "unanchored"
    """outer_anchor = base, and the push's base version is older than the versions the syncer still holds."""
    LAGGING = "lagging"
    """Based on a version more than `max_staleness` versions behind the fragment's current one: its learner sat
    out that many merges without being declared dead (a freeze or stall shorter than the liveness timeout).
    Measured against the current value, its outer gradient would undo the other learners' progress since."""
    OVERWRITTEN = "overwritten"
    """Based on a version older than one the learner was sent as a merge it was not in (diloco.broadcast = all):
    that merge overwrites its copy and resets its counters, so this work is discarded, not merged later."""
    BEFORE_REJOIN = "before_rejoin"
    """Based on a version older than the one the learner was sent when it (re)joined: it trained on a copy the
    global model moved past while it was away (a freeze, a partition), and has not applied the current value
    yet. Measured against the current value, its outer gradient would undo that progress."""


@dataclass
class OpenRound:
    """One round of one fragment: who reached the sync point, whose pushes are in."""

    round_id: int
    started_at: float
    reporters: set[int] = field(default_factory=set)
    """Learners pulled for this round because they reached the sync point (or were late for the last one)."""
    quorum_at: float | None = None
    pushes: dict[int, FragmentPush] = field(default_factory=dict)
    """Per learner, the push merged if the round merges now (fresh or carried)."""
    fresh: set[int] = field(default_factory=set)
    """Learners whose push in `pushes` answers this round's pull: these count toward K."""
    repull: dict[int, int] = field(default_factory=dict)
    """Reporter -> its step when its answer was declined: pulled again once it reports a later step."""


@dataclass
class MergeRecord:
    """What one merge did; the service logs it and sends `tensors` to the participants."""

    fragment: int
    version: int
    round_id: int
    participants: list[int]
    pulled_steps: list[int]
    weights: list[float]
    c_steps: list[int]
    c_tokens: list[int]
    step_ranges: list[tuple[int, int]]
    base_versions: list[int]
    carried: list[int]
    """Participants whose push was carried over from an earlier round (not counted toward K)."""
    reason: str
    grace_s: float
    started_at: float
    quorum_at: float | None
    merged_at: float
    tensors: dict[str, Tensor]
    outer_grad_norm: float
    norms: MergeNorms = field(default_factory=MergeNorms)
    """Radial and merged norms of the outer gradient, measured in the merge (`rda_norms` invariant)."""
    outer_lr: float = float("nan")
    """The outer step's effective learning rate, measured on the tensors (`outer_lr` invariant)."""
    momentum_in: float = 0.0
    momentum_out: float = 0.0
    """The norm of the fragment's outer momentum before and after this merge's step (`outer_lr` invariant)."""


@dataclass
class Pull:
    """A request the service sends to every learner in `learners`."""

    fragment: int
    round_id: int
    learners: frozenset[int]
