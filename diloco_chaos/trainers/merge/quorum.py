"""When the syncer merges a fragment round: minimum quorum of learners at the sync point, plus grace window.

Why: the syncer must never wait for a failed or straggling learner, yet a merge
that includes more learners is more sample-efficient. A learner *reports* for
fragment p when its own step count reaches one of p's sync points (every H of
its steps, staggered by fragment); its answer to the pull that report causes
is a *fresh* push. A round merges once K learners' fresh pushes are in, unless
there is slack in the overlap budget: a fragment pulled at step t must be back
within tau learner steps, so after the quorum is reached (ξ_quorum) and
allowing for the merge itself (ξ_sync), it may wait up to
ξ_grace = clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap) for more learners
to reach the point without delaying anyone's compute (paper Eq. 3). Learners
that have not reached the point are not waited for beyond that window.
Declines (an answer with nothing to merge) and pushes carried over from an
earlier round do not count toward K, so K is a floor on fresh updates merged.

`decide` is a pure function of (clock value, round state, config): it never
reads a clock, so every branch is testable with plain floats and a replayed
run makes the same decisions. The estimators below feed it measured ξ values.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields

from diloco_chaos.trainers.config import DilocoConfig

_DILOCO = DilocoConfig()
_DILOCO_RANGES: dict[str, tuple[float, float]] = {f.name: f.metadata["range"] for f in fields(DilocoConfig)
                                                  if "range" in f.metadata}


class Action(enum.Enum):
    """What the syncer should do with a fragment round now."""

    WAIT = "wait"
    MERGE = "merge"


@dataclass(frozen=True)
class QuorumConfig:
    """Quorum and grace-window settings: the part of `DilocoConfig` that `decide` reads. Defaults and ranges
    are DilocoConfig's own (declared once there); `from_diloco` builds it from a scenario's config."""

    min_quorum: int = _DILOCO.min_quorum
    """K: fresh pushes (learners at the sync point) needed before a round may merge (1 <= K <= M)."""
    overlap: int = _DILOCO.overlap
    """tau: learner steps a fragment's sync may overlap with compute."""
    grace_gamma: float = _DILOCO.grace_gamma
    """gamma: safety margin applied to the slack, in [0, 1]."""
    grace_cap_s: float = _DILOCO.grace_cap_s
    """Upper clamp of the grace window, seconds; also the window before any step-time estimate."""
    grace_enabled: bool = _DILOCO.grace_enabled
    """If False the grace window is always 0: merge as soon as the quorum is reached."""
    wait_for_all: bool = _DILOCO.deterministic
    """Deterministic mode (diloco.deterministic): a round with K fresh pushes still waits, without a
    deadline, until every alive learner is in (no grace window)."""

    @classmethod
    def from_diloco(cls, cfg: DilocoConfig) -> QuorumConfig:
        return cls(min_quorum=cfg.min_quorum, overlap=cfg.overlap, grace_gamma=cfg.grace_gamma,
                   grace_cap_s=cfg.grace_cap_s, grace_enabled=cfg.grace_enabled, wait_for_all=cfg.deterministic)

    def __post_init__(self) -> None:
        for name in ("min_quorum", "overlap", "grace_gamma", "grace_cap_s"):
            lo, hi = _DILOCO_RANGES[name]
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be in [{lo:g}, {hi:g}] (diloco.{name}), got {value}")


@dataclass(frozen=True)
class RoundState:
    """What the syncer knows about one fragment round at decision time."""

    started_at: float
    """Clock time the round opened: the first learner reached the fragment's sync point."""
    quorum_at: float | None
    """Clock time the K-th fresh push arrived (None if the quorum is not reached)."""
    reported: frozenset[int]
    """Learner ids whose fresh push (an answer to this round's pull at their sync point) is in."""
    alive: frozenset[int]
    """Learner ids currently connected: the learners the grace window may still hear from."""
    step_time_s: float | None
    """xi_step estimate, seconds per inner step (None before any estimate)."""
    sync_time_s: float
    """xi_sync estimate: seconds to merge and broadcast a fragment."""
    carried: frozenset[int] = frozenset()
    """Learner ids whose only push in is carried over from an earlier round (it arrived after that round
    merged). Merged with the round, but not counted toward K: they did not report for this round."""


@dataclass(frozen=True)
class Decision:
    """The outcome of `decide`."""

    action: Action
    """WAIT or MERGE."""
    reason: str
    """Human-readable explanation, for logs and the event trace."""
    grace_s: float
    """Grace window computed for this round (0 if not applicable)."""
    wake_at: float | None
    """When to re-evaluate if WAIT with a deadline, else None."""


def grace_window(
    cfg: QuorumConfig, step_time_s: float | None, quorum_wait_s: float, sync_time_s: float
) -> float:
    """Adaptive grace window, seconds: clamp(γ·(τ·ξ_step − ξ_quorum − ξ_sync), 0, cap).

    Before any step-time estimate (`step_time_s` is None) the window is the cap.
    It is 0 when the grace window is disabled.
    """
    if not cfg.grace_enabled:
        return 0.0
    if step_time_s is None:
        return float(cfg.grace_cap_s)
    slack = cfg.overlap * step_time_s - quorum_wait_s - sync_time_s
    return float(min(max(cfg.grace_gamma * slack, 0.0), cfg.grace_cap_s))


def decide(now: float, state: RoundState, cfg: QuorumConfig) -> Decision:
    """Decide whether a fragment round merges now or keeps waiting.

    Only fresh pushes (learners that reached the sync point and answered this round's pull) count toward
    K; declines never do, and carried pushes ride along. Branches, first match wins:
      1. fewer than K fresh pushes -> WAIT (no deadline: only a learner reaching the point can change this);
      2. every alive learner is in (fresh or carried) -> MERGE (nobody left to wait for);
      3. deterministic mode (wait_for_all) -> WAIT for the others, no deadline;
      4. grace window is 0 -> MERGE at quorum;
      5. now >= quorum_at + grace -> MERGE (grace expired; the learners not at the point are not in it);
      6. otherwise WAIT until quorum_at + grace.

    Raises:
        ValueError: if K fresh pushes are in but `state.quorum_at` is None.
    """
    k = cfg.min_quorum
    n = len(state.reported)
    if n < k:
        return Decision(Action.WAIT, f"quorum {n}/{k}: waiting for {k - n} more learner(s) at the sync point",
                        0.0, None)
    inside = state.reported | state.carried
    extra = f" (+{len(state.carried - state.reported)} carried)" if state.carried - state.reported else ""
    if state.alive <= inside:
        return Decision(Action.MERGE, f"all {len(state.alive)} alive learners in: {n} at the sync point{extra}",
                        0.0, None)
    missing = len(state.alive - inside)
    if cfg.wait_for_all:
        return Decision(Action.WAIT, f"deterministic: waiting for {missing} more alive learner(s)", 0.0, None)
    if state.quorum_at is None:
        raise ValueError(f"{n} fresh pushes in (K={k}) but quorum_at is None")
    quorum_wait = state.quorum_at - state.started_at
    grace = grace_window(cfg, state.step_time_s, quorum_wait, state.sync_time_s)
    if grace <= 0.0:
        why = "grace disabled" if not cfg.grace_enabled else "no slack"
        return Decision(Action.MERGE, f"{why}: grace window 0, merging {n} at the sync point{extra}, "
                        f"{missing} alive not in", 0.0, None)
    deadline = state.quorum_at + grace
    if now >= deadline:
        return Decision(
            Action.MERGE,
            f"grace expired after {grace:.3f}s: {n} at the sync point{extra}, {missing} alive learner(s) not in",
            grace,
            None,
        )
    return Decision(
        Action.WAIT, f"grace {grace:.3f}s: waiting for {missing} more alive learner(s)", grace, deadline
    )


class EwmaEstimator:
    """Exponentially weighted moving average of a measured quantity (e.g. xi_sync).

    The first sample sets the value; each later one moves it by `alpha` of the gap.
    """

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self._value: float | None = None

    def update(self, x: float) -> float:
        """Fold in sample `x` and return the new estimate."""
        if not math.isfinite(x):
            raise ValueError(f"sample must be finite, got {x}")
        if self._value is None:
            self._value = float(x)
        else:
            self._value += self.alpha * (float(x) - self._value)
        return self._value

    @property
    def value(self) -> float | None:
        """Current estimate, or None before the first sample."""
        return self._value


class StepTimeTracker:
    """Latest reported inner-step time per learner; xi_step is their mean over a given set."""

    def __init__(self) -> None:
        self._latest: dict[int, float] = {}

    def update(self, learner: int, step_time_s: float) -> None:
        """Record `learner`'s latest step time, replacing any earlier one."""
        if not math.isfinite(step_time_s) or step_time_s < 0:
            raise ValueError(f"step time must be finite and >= 0, got {step_time_s}")
        self._latest[learner] = float(step_time_s)

    def forget(self, learner: int) -> None:
        """Drop `learner`'s step time (e.g. when it is excluded); no error if unknown."""
        self._latest.pop(learner, None)

    def estimate(self, learners: Iterable[int]) -> float | None:
        """Mean latest step time over those of `learners` that have one; None if none do."""
        vals = [self._latest[m] for m in learners if m in self._latest]
        return sum(vals) / len(vals) if vals else None
