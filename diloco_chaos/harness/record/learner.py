"""Records of the events a learner writes: its chip processes (diloco_chaos/harness/learner/chip.py, and
diloco_chaos/trainers/ through the callbacks chip.py passes in) and its link process
(diloco_chaos/harness/learner/link_process.py, diloco_chaos/harness/learner/syncer_link.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from diloco_chaos.harness.record.base import Event, event

CHIP = "`learner<m>.chip<r>` (diloco_chaos/harness/learner/chip.py)"
LINK = "`learner<m>.link` (diloco_chaos/harness/learner/syncer_link.py)"
LINK_PROCESS = "`learner<m>.link` (diloco_chaos/harness/learner/link_process.py)"


@event("chip_start", CHIP)
@dataclass(frozen=True, kw_only=True)
class ChipStart(Event):
    """A chip process started."""

    learner: int
    """Its learner."""
    rank: int
    """Its chip rank."""
    size: int
    """Chips per learner."""
    generation: int
    """The learner group's generation it starts in."""


@event("gloo_group", CHIP)
@dataclass(frozen=True, kw_only=True)
class GlooGroup(Event):
    """The chip joined a Gloo process group of its learner."""

    learner: int
    """Its learner."""
    group: str
    """The group's name, `learner<m>/gen<g>`."""
    rank: int
    """Its rank in the group."""
    size: int
    """The group's size."""
    chip: int
    """Its chip id."""
    members: list[int]
    """Chip ids of the group, in rank order."""


@event("step", CHIP)
@dataclass(frozen=True, kw_only=True)
class Step(Event):
    """The learner finished one inner training step."""

    learner: int
    """The learner."""
    step: int
    """Its step number (from 1)."""
    loss: float
    """Training loss of the step's batch."""
    tokens: int
    """Tokens the step trained on (all chips)."""
    chips: int
    """Chips in the learner's group at this step."""
    compute_s: float
    """Seconds of forward/backward/optimizer."""
    sync_s: float
    """Seconds in the intra-learner all-reduce."""
    cpu_s: float | None = None
    """Process CPU seconds so far (every CPU_MARK_EVERY steps only)."""


@event("apply", CHIP)
@dataclass(frozen=True, kw_only=True)
class Apply(Event):
    """Merged global state was applied to the learner's replica. decoupled: fragments with their versions;
    diloco: the round."""

    learner: int
    """The learner."""
    step: int
    """The learner's step when applied."""
    fragments: list[int] | None = None
    """decoupled: fragments applied."""
    versions: list[int] | None = None
    """decoupled: their global versions, parallel to `fragments`."""
    pulled: list[int | None] | None = None
    """decoupled: the learner step its push for each was pulled at (None: not from a pull of its own)."""
    arrived: list[int | None] | None = None
    """decoupled: the learner step each merged fragment arrived at."""
    broadcast: list[bool] | None = None
    """decoupled: whether each was the broadcast of a merge the learner was not in (diloco.broadcast = all), as
    opposed to the answer to its own pull or the current value it took on (re)joining; None in older logs."""
    round: int | None = None
    """diloco: the outer round applied."""

    def was_broadcast(self, i: int) -> bool:
        """Whether the i-th fragment applied was a broadcast (False in older logs, which do not say)."""
        return self.broadcast is not None and i < len(self.broadcast) and bool(self.broadcast[i])


@event("fragment_overwritten", CHIP)
@dataclass(frozen=True, kw_only=True)
class FragmentOverwritten(Event):
    """decoupled, diloco.broadcast = all: the learner applied a merged fragment it was not in, which overwrote its
    copy and reset that fragment's counters: its unmerged work on the fragment is discarded."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment overwritten."""
    step: int
    """The learner's step when applied (the discarded steps end here)."""
    tokens: float
    """The discarded work's tokens on this fragment: 1/P of the tokens of the steps thrown away."""
    reason: str
    """Why (the merge it was not in)."""


@event("apply_wait", CHIP)
@dataclass(frozen=True, kw_only=True)
class ApplyWait(Event):
    """decoupled, diloco.apply_wait = block: the learner's host waited at step pulled + tau for the merge of a
    fragment it was pulled for (bounded by timeouts.liveness_s); goodput counts the wait as lost."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment waited for."""
    step: int
    """The learner's step at which it waited (pulled step + tau)."""
    waited_s: float
    """Seconds waited."""
    outcome: Literal["applied", "overwritten", "timed_out"]
    """applied: its merge arrived; overwritten: a merge it was not in arrived; timed_out: none within the bound."""
    pulled: int
    """The step its copy was pulled at."""


@event("chip_joined", CHIP)
@dataclass(frozen=True, kw_only=True)
class ChipJoined(Event):
    """A repaired chip joined its running learner and received its state."""

    learner: int
    """The learner."""
    chip: int
    """The chip id."""
    step: int
    """The learner's step it joined at."""
    rank: int
    """Its rank in the new group."""
    size: int
    """The new group's size."""
    generation: int
    """The new group's generation."""


@event("regroup", CHIP)
@dataclass(frozen=True, kw_only=True)
class Regroup(Event):
    """The chip re-formed its learner's group (a chip lost or joined)."""

    learner: int
    """The learner."""
    chip: int
    """The chip id."""
    step: int
    """The learner's step."""
    rank: int
    """Its rank in the new group."""
    size: int
    """The new group's size."""
    generation: int
    """The new group's generation."""
    members: list[int]
    """Chip ids of the new group."""
    why: str
    """What made it re-form."""


@event("initial_pull", CHIP)
@dataclass(frozen=True, kw_only=True)
class InitialPull(Event):
    """decoupled: a restarted learner pulled the global fragments before resuming."""

    learner: int
    """The learner."""
    step: int
    """The step it resumes from."""
    fragments: int
    """Fragments received."""
    of: int
    """Fragments in the model."""
    applied: list[list[int]]
    """[fragment, version] of each applied."""


@event("resume", CHIP)
@dataclass(frozen=True, kw_only=True)
class Resume(Event):
    """ddp, diloco, elastic_ddp: a restarted learner got the syncer's state and resumes."""

    learner: int
    """The learner."""
    step: int
    """The step it resumes from."""


@event("elastic_catch_up", CHIP)
@dataclass(frozen=True, kw_only=True)
class ElasticCatchUp(Event):
    """elastic_ddp: the learner was behind the global group and jumped to its step."""

    learner: int
    """The learner."""
    from_step: int
    """Its step before."""
    to_step: int
    """The group's step it took."""


@event("learner_done", CHIP)
@dataclass(frozen=True, kw_only=True)
class LearnerDone(Event):
    """The learner finished training (written by its host chip)."""

    learner: int
    """The learner."""
    steps: int
    """Its last step."""
    finite: bool
    """Whether its parameters are all finite."""
    timing: dict[str, float]
    """Seconds spent per phase (diloco_chaos/trainers/learner/core.py LearnerCore.timing)."""
    cpu_s: float
    """Process CPU seconds."""


@event("chip_error", CHIP)
@dataclass(frozen=True, kw_only=True)
class ChipError(Event):
    """A chip process failed with an exception (it exits non-zero)."""

    learner: int
    """The learner."""
    rank: int
    """The chip's rank."""
    error: str
    """"ExceptionType: message"."""


@event("learner_nonfinite", CHIP)
@dataclass(frozen=True, kw_only=True)
class LearnerNonfinite(Event):
    """The learner's training went non-finite: the first inner step whose loss is NaN or infinite (written once
    per host chip process, every algorithm). Its work from then on is non-finite too (its pushes are
    rejected_nonfinite); the invariant `learners_finite` and the run's errors (never expected) report it."""

    learner: int
    """The learner."""
    step: int
    """The first step whose training loss was not finite."""
    loss: float
    """That loss (nan or inf)."""
    error: str
    """One line for the run's error list: what turned non-finite, where."""


@event("lockstep_wait_expired", CHIP)
@dataclass(frozen=True, kw_only=True)
class LockstepWaitExpired(Event):
    """diloco.deterministic: the learner waited `bound_s` for a round's merge and went on without it."""

    learner: int
    """The learner."""
    step: int
    """Its step."""
    bound_s: float
    """How long it waited."""


@event("link_process_start", LINK_PROCESS)
@dataclass(frozen=True, kw_only=True)
class LinkProcessStart(Event):
    """A learner's link process started."""

    learner: int
    """The learner."""


@event("fragment_refused", LINK_PROCESS)
@dataclass(frozen=True, kw_only=True)
class FragmentRefused(Event):
    """A merged fragment from the syncer did not fit this model: never applied."""

    learner: int
    """The learner."""
    fragment: Any
    """The frame's `fragment` field as received (malformed: any JSON value)."""
    error: str
    """Why it was refused."""


@event("link_cpu", LINK_PROCESS)
@dataclass(frozen=True, kw_only=True)
class LinkCpu(Event):
    """The link process's CPU use at its end."""

    learner: int
    """The learner."""
    threads: dict[str, float]
    """CPU seconds by thread name."""
    cpu_s: float
    """Process CPU seconds."""
    wire_bytes_up: int = 0
    """Frame bytes the link sent to the syncer, over all its connections (diloco_chaos/harness/wire/precision.py)."""
    wire_bytes_down: int = 0
    """Frame bytes the link received from the syncer, over all its connections."""


@event("push_superseded_locally", LINK)
@dataclass(frozen=True, kw_only=True)
class PushSupersededLocally(Event):
    """A queued, unsent push was replaced by a newer push of the same fragment."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment."""


@event("link_flush_timeout", LINK)
@dataclass(frozen=True, kw_only=True)
class LinkFlushTimeout(Event):
    """Closing, the link could not send everything queued in time."""

    learner: int
    """The learner."""
    unsent: int
    """Messages left unsent."""


@event("final_pushes_given_up", LINK)
@dataclass(frozen=True, kw_only=True)
class FinalPushesGivenUp(Event):
    """decoupled: a finished learner closed its link with pushes the syncer never took in (it, or the learner's
    shard of it, stayed unreachable past `timeouts.final_flush_s`): the work of these step ranges is given up.
    Written with `link_flush_timeout`; the `work_kept` invariant counts it as a cause of discarded work."""

    learner: int
    """The learner."""
    fragments: list[int]
    """The fragment of each push given up."""
    step_ranges: list[list[int]]
    """Each push's [first_step, last_step]."""
    c_steps: list[int]
    """Each push's inner steps."""
    final: list[bool]
    """Whether each was a final push (the others: an answer to a pull still queued)."""
    waited_s: float
    """Seconds the link waited for the syncer before giving up (its flush bound)."""


@event("link_down", LINK)
@dataclass(frozen=True, kw_only=True)
class LinkDown(Event):
    """The link's connection to the syncer closed."""

    learner: int
    """The learner."""
    reason: str
    """Why."""


@event("link_fatal", LINK)
@dataclass(frozen=True, kw_only=True)
class LinkFatal(Event):
    """The syncer rejected the learner: the link gives up."""

    learner: int
    """The learner."""
    error: str
    """The rejection."""


@event("link_connect_failed", LINK)
@dataclass(frozen=True, kw_only=True)
class LinkConnectFailed(Event):
    """A connection attempt failed; the link retries after `backoff_s`."""

    learner: int
    """The learner."""
    error: str
    """"ExceptionType: message"."""
    backoff_s: float
    """Seconds until the next attempt."""


@event("link_up", LINK)
@dataclass(frozen=True, kw_only=True)
class LinkUp(Event):
    """The link connected and authenticated."""

    learner: int
    """The learner."""
    connects: int
    """Connections made so far (1: the first)."""


@event("frame_rejected", LINK + ", syncer (diloco_chaos/harness/syncer/transport.py)")
@dataclass(frozen=True, kw_only=True)
class FrameRejected(Event):
    """A received frame failed its checks (authentication, size, format); the connection is dropped."""

    learner: int | None
    """The learner of the connection (None: not known yet)."""
    side: Literal["learner", "syncer"]
    """Which end rejected it."""
    kind: str
    """The FrameError kind (diloco_chaos/harness/wire/framing.py)."""
    error: str
    """The error."""
    peer: str | None = None
    """syncer side: the connection's address (a hostile peer may claim any learner)."""


@event("rtt", LINK)
@dataclass(frozen=True, kw_only=True)
class Rtt(Event):
    """A ping's round trip to the syncer."""

    learner: int
    """The learner."""
    seq: int
    """The ping's sequence number."""
    ms: float
    """Round-trip time in milliseconds."""


@event("stop_received", LINK)
@dataclass(frozen=True, kw_only=True)
class StopReceived(Event):
    """The syncer told the learner to stop (train.budget = total reached)."""

    learner: int
    """The learner."""
    total: int | None
    """Learner-steps counted when the budget was reached."""


@event("push_sent", LINK)
@dataclass(frozen=True, kw_only=True)
class PushSent(Event):
    """decoupled: a fragment push was written to the syncer's socket."""

    learner: int
    """The learner."""
    fragment: int
    """The fragment."""
    bytes: int
    """Frame bytes sent."""
    seconds: float
    """Seconds the send took."""
    first_step: int
    """First learner step whose work the push carries."""
    last_step: int
    """Last learner step whose work it carries."""
    c_steps: int
    """Inner steps it carries."""
    round: int | None
    """The round whose pull it answers (None: a final or unsolicited push)."""
