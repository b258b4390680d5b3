"""Records of the events the syncer writes: its service loop and transport (diloco_chaos/harness/syncer/service.py,
diloco_chaos/harness/syncer/transport.py), the decoupled merge protocol (diloco_chaos/harness/syncer/decoupled.py), the
synchronous barrier algorithms (diloco_chaos/harness/syncer/barrier.py) and evaluation
(diloco_chaos/harness/syncer/evaluator.py; the supervisor's
final eval, diloco_chaos/harness/report/run_report.py, shares the `eval` kind)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from diloco_chaos.harness.record.base import Event, event
from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome, SupersededCause

_SHARD_PROC = re.compile(r"syncer\.s(\d+)$")


def shard_of(proc: str) -> int:
    """The synchronizer shard whose process wrote an event, from its `proc` (`syncer.s<k>`: shard k of a
    sharded synchronizer; 0 for the unsharded `syncer`, and for every other writer)."""
    m = _SHARD_PROC.match(proc)
    return int(m.group(1)) if m else 0


SERVICE = "syncer (diloco_chaos/harness/syncer/service.py)"
TRANSPORT = "syncer (diloco_chaos/harness/syncer/transport.py)"
DECOUPLED = "syncer (diloco_chaos/harness/syncer/decoupled.py)"
BARRIER = "syncer (diloco_chaos/harness/syncer/barrier.py)"


@event("syncer_start", SERVICE)
@dataclass(frozen=True, kw_only=True)
class SyncerStart(Event):
    """The syncer is serving."""

    port: int
    """Its TCP port."""
    algorithm: str
    """The run's algorithm."""
    fragments: int | None
    """decoupled: fragments of the model (None for the barrier algorithms)."""
    shard: int | None = None
    """syncer.shards > 1: which shard of the synchronizer this is (absent: one syncer)."""
    owned: list[int] | None = None
    """syncer.shards > 1: the fragments this shard owns (diloco_chaos/trainers/syncers/shards.py)."""


@event("learner_join", SERVICE)
@dataclass(frozen=True, kw_only=True)
class LearnerJoin(Event):
    """A learner connected and authenticated."""

    learner: int
    """The learner."""
    peer: str
    """Its address, "host:port"."""
    alive: list[int] | None = None
    """Learners connected now (None: absent in run directories written before this field existed; every current
    emitter writes it)."""
    versions: list[int] | None = None
    """decoupled: the version of each fragment it is sent."""


@event("learner_leave", SERVICE)
@dataclass(frozen=True, kw_only=True)
class LearnerLeave(Event):
    """A learner's connection closed."""

    learner: int
    """The learner."""
    alive: list[int] | None = None
    """Learners still connected (None: absent in run directories written before this field existed; every current
    emitter writes it)."""


@event("learner_bye", SERVICE)
@dataclass(frozen=True, kw_only=True)
class LearnerBye(Event):
    """A learner said it finished training."""

    learner: int
    """The learner."""


@event("unexpected_message", SERVICE)
@dataclass(frozen=True, kw_only=True)
class UnexpectedMessage(Event):
    """A message type the algorithm does not handle (ignored)."""

    learner: int
    """The sender."""
    type: str
    """Its MsgType name."""


@event("syncer_done", SERVICE)
@dataclass(frozen=True, kw_only=True)
class SyncerDone(Event):
    """The syncer finished: every learner said BYE (or it was told to stop), the last merges were made."""

    merges: int
    """Merges in all."""
    tokens_merged: float
    """Tokens merged into the global model."""
    frames_rejected: int
    """Frames the syncer rejected."""
    cpu_s: float
    """Process CPU seconds."""
    checkpoints: int
    """Checkpoints written."""
    checkpoint_s: float
    """Seconds spent writing them."""


@event("syncer_error", SERVICE)
@dataclass(frozen=True, kw_only=True)
class SyncerError(Event):
    """The syncer failed with an exception (it exits non-zero)."""

    error: str
    """"ExceptionType: message"."""


@event("auth_failed", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class AuthFailed(Event):
    """A connection failed the handshake and was closed."""

    peer: str
    """Its address."""
    error: str
    """"ExceptionType: message"."""
    kind: str | None = None
    """The FrameError kind, when a frame was rejected."""


@event("link_stats", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class LinkStats(Event):
    """Once per closed connection: what crossed it."""

    learner: int
    """The learner."""
    peer: str
    """Its address."""
    seconds: float
    """How long the connection was open."""
    bytes_in: int
    """Bytes received."""
    bytes_out: int
    """Bytes sent."""
    data_frames: int
    """Data (tensor-carrying) frames received."""
    data_bytes: int
    """Their bytes."""
    data_late_bytes: int
    """Bytes of data frames that took longer than expected to arrive."""
    data_rx_s: float
    """Seconds spent receiving data frames."""


@event("conn_closed", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class ConnClosed(Event):
    """The syncer closed a learner's connection."""

    learner: int | None
    """The learner (None: before its handshake)."""
    peer: str
    """Its address."""
    reason: str
    """Why."""


@event("reader_error", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class ReaderError(Event):
    """A connection's reader thread failed on an error nothing foresaw (a defect): its connection is closed
    (conn_closed follows) and the error raised on in that thread only."""

    learner: int | None
    """The learner (None: before its handshake)."""
    peer: str
    """Its address."""
    error: str
    """The error's type and message."""


@event("send_coalesced", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class SendCoalesced(Event):
    """A queued fragment broadcast was replaced by a newer version before it was sent."""

    learner: int
    """The receiving learner."""
    fragment: int
    """The fragment."""


@event("send_dropped", TRANSPORT)
@dataclass(frozen=True, kw_only=True)
class SendDropped(Event):
    """A message to a learner was dropped."""

    learner: int
    """The receiving learner."""
    reason: str
    """Why (e.g. the outbound queue is full)."""


@event("elastic_reconfigure", BARRIER)
@dataclass(frozen=True, kw_only=True)
class ElasticReconfigure(Event):
    """elastic_ddp: the global group changed (diloco_chaos/trainers/syncers/elastic_ddp.py Reconfiguration)."""

    kind: Literal["shrink", "grow"]
    """A learner left (shrink) or was admitted (grow)."""
    learner: int
    """The learner."""
    members_before: list[int]
    """Members before."""
    members_after: list[int]
    """Members after."""
    step: int
    """The first step the new membership holds for."""
    started_at: float
    """Shrink: when the survivors began waiting on the lost learner alone; grow: when it was admitted
    (the syncer's monotonic clock)."""
    ended_at: float
    """Shrink: when the group stopped waiting; grow: when the first step with it completed."""
    stall_s: float
    """Seconds the other members waited because of the change."""
    reason: str
    """Why."""


@dataclass(frozen=True, kw_only=True)
class _BarrierKeyed(Event):
    learner: int
    """The learner."""
    step: int | None = None
    """ddp, elastic_ddp: the step (the barrier's key)."""
    round: int | None = None
    """diloco: the round (the barrier's key)."""


@event("sync_rejected", BARRIER)
@dataclass(frozen=True, kw_only=True)
class SyncRejected(_BarrierKeyed):
    """A learner's gradient or outer delta was rejected."""

    reason: str
    """Why: "rejected_nonfinite" (a NaN or infinite value), "rejected_shape: ..." (not the model's tensors), or
    the core's reason for a contribution from outside the group or ahead of it (elastic_ddp). Runs written
    before the first two were told apart say "non-finite or malformed"."""


@event("sync_replayed", BARRIER)
@dataclass(frozen=True, kw_only=True)
class SyncReplayed(_BarrierKeyed):
    """A learner asked again for a step or round it missed: answered alone."""


@event("elastic_catch_up_sent", BARRIER)
@dataclass(frozen=True, kw_only=True)
class ElasticCatchUpSent(_BarrierKeyed):
    """elastic_ddp: a learner behind the group was sent the group's state."""

    state_step: int
    """The group's step whose state it was sent."""


@event("merge", DECOUPLED + ", " + BARRIER)
@dataclass(frozen=True, kw_only=True)
class Merge(Event):
    """The global model changed: decoupled, one fragment merged; ddp / diloco / elastic_ddp, a step or round
    reduced. The decoupled-only fields are absent for the barrier algorithms."""

    fragment: int | None
    """decoupled: the fragment (None: the whole model)."""
    version: int
    """The new version (decoupled: of the fragment; barrier algorithms: merges so far)."""
    merges: int
    """Merges so far."""
    participants: list[int]
    """Learners whose work is in it."""
    tokens: float
    """Tokens it merged."""
    c_tokens: list[float]
    """Tokens per participant, parallel to `participants`."""
    tokens_merged: float
    """Tokens merged so far."""
    round: int | None
    """The round (decoupled: of the fragment; diloco: the outer round; ddp: None)."""
    step: int | None = None
    """ddp, elastic_ddp, diloco: the learners' step."""
    carried: list[int] | None = None
    """decoupled: participants whose push was carried in from an earlier round."""
    weights: list[float] | None = None
    """decoupled: each participant's merge weight."""
    c_steps: list[int] | None = None
    """decoupled: inner steps per participant."""
    step_ranges: list[list[int]] | None = None
    """decoupled: [first_step, last_step] per participant."""
    base_versions: list[int] | None = None
    """decoupled: the version each participant's push was based on."""
    reason: str | None = None
    """decoupled: what closed the round (quorum, grace expiry, ...)."""
    grace_s: float | None = None
    """decoupled: the grace period the round allowed."""
    quorum_wait_s: float | None = None
    """decoupled: seconds from the round's start to its quorum."""
    wait_s: float | None = None
    """decoupled: seconds from the round's start to the merge."""
    broadcast_s: float | None = None
    """decoupled: seconds the broadcast took."""
    outer_grad_norm: float | None = None
    """decoupled: norm of the merged outer gradient."""
    digest: str | None = None
    """decoupled: hash of the merged fragment (diloco_chaos/harness/syncer/fragment_checkpoint.py fragment_digest)."""
    norms: dict[str, float] | None = None
    """decoupled: MergeNorms (diloco_chaos/trainers/merge/outer_gradient.py), momentum_in / momentum_out (outer_lr)."""
    outer_lr: float | None = None
    """decoupled: the outer learning rate used (NaN: not recorded)."""
    overwrites: list[int] | None = None
    """decoupled, broadcast = all: the alive learners not in the merge it was sent to (each overwrites its copy)."""


@event("checkpoint_slot_rejected", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class CheckpointSlotRejected(Event):
    """A restored syncer found a checkpoint slot torn or invalid (the other slot is used)."""

    detail: str
    """Why it was rejected."""


@event("syncer_restore", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class SyncerRestore(Event):
    """A restarted syncer restored the global fragments from its checkpoint."""

    fragments: list[int]
    """Fragments restored."""
    versions: list[int]
    """Version of each fragment."""
    merges: int
    """Merges so far."""
    clock: int
    """The syncer's round clock."""
    tokens_merged: float
    """Tokens merged so far."""
    digests: dict[str, str]
    """Fragment -> digest of its restored value."""
    merged_into: dict[str, dict[str, list[int]]]
    """Fragment -> learner -> versions its work was merged into, not yet applied by it."""


@event("push_superseded", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class PushSuperseded(Event):
    """A push will not be merged: replaced by a newer one, or stale."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment."""
    reason: str
    """Human-readable reason (readers match on `cause`)."""
    cause: SupersededCause | None = None
    """Why, as a closed set (diloco_chaos/trainers/syncers/decoupled.py SupersededCause). None: absent in run
    directories
    written before this field existed; every current emitter writes it (readers then fall back to `reason`)."""
    first_step: int
    """First learner step of its work."""
    last_step: int
    """Last learner step of its work."""
    base_version: int | None = None
    """The version it was based on."""
    round: int | None = None
    """newer: the round it was in."""


@event("push_rejected", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class PushRejected(Event):
    """A push was rejected (malformed, non-finite, wrong shape or fragment)."""

    learner: int
    """The learner."""
    reason: str
    """A PushOutcome value (rejected_nonfinite, rejected_shape, rejected_fragment) or "malformed: ..."."""
    fragment: int | None = None
    """The fragment (absent when the push could not be decoded)."""
    first_step: int | None = None
    """First learner step of its work."""
    last_step: int | None = None
    """Last learner step of its work."""


@event("push", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class Push(Event):
    """The syncer received a fragment push and decided its outcome."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment."""
    round: int | None
    """The round whose pull it answers (None: a final or unsolicited push)."""
    c_steps: int
    """Inner steps it carries."""
    c_tokens: int
    """Tokens it carries."""
    first_step: int
    """First learner step of its work."""
    last_step: int
    """Last learner step of its work."""
    base_version: int
    """The fragment version it was based on."""
    outcome: PushOutcome | Literal["late"]
    """What the syncer did with it (diloco_chaos/trainers/syncers/decoupled.py PushOutcome). "late": only in run
    directories written before answers that arrived after their round merged were carried (such an answer is now
    `carried`); no current emitter writes it."""
    final: bool
    """The learner's last push of the fragment."""
    joined: int | None
    """accepted, carried: the round it is in now (None: held for the fragment's next round)."""


@event("pull", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class Pull(Event):
    """The syncer opened a fragment's round: asked the learners for their pushes."""

    fragment: int
    """The fragment."""
    round: int
    """The round."""
    learners: list[int]
    """Learners asked."""
    clock: int
    """The syncer's round clock."""


@event("budget_reached", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class BudgetReached(Event):
    """train.budget = total: the learners' steps add up to the budget; every learner is told to stop."""

    total_steps: int
    """Learner-steps counted."""
    budget: int
    """The budget."""
    per_learner: dict[str, int]
    """Learner -> its highest reported step."""


@event("fragment_resent", DECOUPLED)
@dataclass(frozen=True, kw_only=True)
class FragmentResent(Event):
    """A learner was sent a fragment's current value (it pushed from an unusable base)."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment."""
    version: int
    """The version sent."""
    reason: str
    """The push outcome that caused it (unanchored, lagging, stale, before_rejoin)."""


@event("eval", "syncer (diloco_chaos/harness/syncer/evaluator.py); "
                "supervisor (diloco_chaos/harness/report/run_report.py) for the final one")
@dataclass(frozen=True, kw_only=True)
class Eval(Event):
    """Held-out loss of the global model."""

    kind: Literal["periodic", "final"]
    """periodic: during the run (syncer); final: of the saved global model after it (supervisor)."""
    version: int
    """Merges the evaluated model includes."""
    tokens_merged: float
    """Tokens merged into it."""
    loss: float
    """Mean held-out loss of the task (the byte LM's: nats per byte; docs/api.md)."""
    trigger: Literal["start", "progress", "time"] | None = None
    """periodic: why it was due: the run's start, a progress milestone (eval.points) or eval.every_s."""
    cpu_s: float | None = None
    """periodic: CPU seconds the evaluation took (eval.max_share bounds the progress-triggered ones)."""
    finite: bool | None = None
    """final: whether the global model is all finite."""
    metrics: dict[str, float] | None = None
    """final: the task's extra held-out figures beside the loss, e.g. accuracy (diloco_chaos/trainers/task.py
    `metrics`); absent for a task without any."""


