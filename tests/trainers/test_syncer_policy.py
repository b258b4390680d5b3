"""Tests for diloco_chaos.trainers.merge.quorum: every branch of decide() with plain float clocks."""

from __future__ import annotations

import pytest

from diloco_chaos.trainers.merge.quorum import (
    Action,
    Decision,
    EwmaEstimator,
    QuorumConfig,
    RoundState,
    StepTimeTracker,
    decide,
    grace_window,
)


def state(
    reported: set[int],
    alive: set[int],
    *,
    started_at: float = 10.0,
    quorum_at: float | None = 10.02,
    step_time_s: float | None = 0.1,
    sync_time_s: float = 0.03,
    carried: frozenset[int] | set[int] = frozenset(),
) -> RoundState:
    return RoundState(
        started_at=started_at,
        quorum_at=quorum_at,
        reported=frozenset(reported),
        alive=frozenset(alive),
        step_time_s=step_time_s,
        sync_time_s=sync_time_s,
        carried=frozenset(carried),
    )


CFG = QuorumConfig(min_quorum=1, overlap=2, grace_gamma=0.5, grace_cap_s=1.0)


def test_grace_window_formula_and_clamps() -> None:
    # 0.5 * (2 * 0.1 - 0.02 - 0.03) = 0.075
    assert grace_window(CFG, 0.1, 0.02, 0.03) == pytest.approx(0.075)
    # no slack -> 0, never negative
    assert grace_window(CFG, 0.1, 0.15, 0.1) == 0.0
    # capped
    assert grace_window(CFG, 10.0, 0.0, 0.0) == 1.0
    # before any step-time estimate: the cap
    assert grace_window(CFG, None, 0.5, 0.5) == 1.0
    # disabled: always 0
    off = QuorumConfig(grace_enabled=False)
    assert grace_window(off, 0.1, 0.0, 0.0) == 0.0
    assert grace_window(off, None, 0.0, 0.0) == 0.0
    # gamma 0 -> 0
    assert grace_window(QuorumConfig(grace_gamma=0.0), 0.1, 0.0, 0.0) == 0.0


def test_below_quorum_waits_without_deadline() -> None:
    cfg = QuorumConfig(min_quorum=2)
    d = decide(50.0, state({0}, {0, 1, 2}, quorum_at=None), cfg)
    assert d == Decision(Action.WAIT, "quorum 1/2: waiting for 1 more learner(s) at the sync point", 0.0, None)
    d = decide(50.0, state(set(), {0, 1}, quorum_at=None), QuorumConfig(min_quorum=1))
    assert d.action is Action.WAIT and d.wake_at is None and "0/1" in d.reason


def test_all_alive_reported_merges_immediately() -> None:
    d = decide(10.021, state({0, 1, 2}, {0, 1, 2}), CFG)
    assert d.action is Action.MERGE
    assert d.reason == "all 3 alive learners in: 3 at the sync point"
    # a learner that pushed and then disconnected still counts; superset is fine
    d = decide(10.021, state({0, 1, 2}, {0, 2}), CFG)
    assert d.action is Action.MERGE and "all 2 alive" in d.reason


def test_all_alive_but_below_quorum_still_waits() -> None:
    cfg = QuorumConfig(min_quorum=3)
    d = decide(10.5, state({0, 1}, {0, 1}, quorum_at=None), cfg)
    assert d.action is Action.WAIT and d.reason.startswith("quorum 2/3")


def test_no_slack_merges_at_quorum() -> None:
    # slack = 2 * 0.1 - 0.15 - 0.08 < 0
    d = decide(10.15, state({0}, {0, 1}, quorum_at=10.15, sync_time_s=0.08), CFG)
    assert d.action is Action.MERGE
    assert d.reason.startswith("no slack: grace window 0")
    assert d.grace_s == 0.0 and d.wake_at is None


def test_grace_disabled_merges_at_quorum() -> None:
    cfg = QuorumConfig(grace_enabled=False)
    d = decide(10.02, state({0}, {0, 1}), cfg)
    assert d.action is Action.MERGE and d.grace_s == 0.0
    assert "grace window 0" in d.reason


def test_within_grace_waits_until_deadline() -> None:
    # grace = 0.5 * (0.2 - 0.02 - 0.03) = 0.075; deadline = 10.02 + 0.075
    d = decide(10.05, state({0}, {0, 1, 2}), CFG)
    assert d.action is Action.WAIT
    assert d.grace_s == pytest.approx(0.075)
    assert d.wake_at == pytest.approx(10.095)
    assert "2 more" in d.reason


def test_grace_expired_merges() -> None:
    s = state({0, 1}, {0, 1, 2})
    deadline = decide(10.05, s, CFG).wake_at
    d = decide(deadline, s, CFG)  # exactly at the deadline counts as expired
    assert d.action is Action.MERGE
    assert d.reason.startswith("grace expired after 0.075s")
    assert d.grace_s == pytest.approx(0.075) and d.wake_at is None
    assert decide(11.0, s, CFG).action is Action.MERGE
    assert decide(10.09, s, CFG).action is Action.WAIT


def test_no_step_estimate_uses_cap() -> None:
    cfg = QuorumConfig(grace_cap_s=0.25)
    s = state({0}, {0, 1}, step_time_s=None)
    d = decide(10.1, s, cfg)
    assert d.action is Action.WAIT and d.wake_at == pytest.approx(10.27)
    assert d.grace_s == 0.25
    assert decide(d.wake_at, s, cfg).action is Action.MERGE


def test_simulated_round_with_float_clock() -> None:
    # learner 0 pushes at t=0, learner 1 at t=0.04, learner 2 never (straggler)
    alive = {0, 1, 2}
    cfg = QuorumConfig(min_quorum=2, overlap=2, grace_gamma=0.5, grace_cap_s=1.0)
    s0 = state({0}, alive, started_at=0.0, quorum_at=None, step_time_s=0.2, sync_time_s=0.06)
    assert decide(0.0, s0, cfg).action is Action.WAIT
    s1 = state({0, 1}, alive, started_at=0.0, quorum_at=0.04, step_time_s=0.2, sync_time_s=0.06)
    d = decide(0.04, s1, cfg)  # grace = 0.5 * (0.4 - 0.04 - 0.06) = 0.15
    assert d.action is Action.WAIT and d.wake_at == pytest.approx(0.19)
    assert decide(d.wake_at, s1, cfg).action is Action.MERGE
    # if the straggler shows up inside the window, merge right away
    s2 = state({0, 1, 2}, alive, started_at=0.0, quorum_at=0.04, step_time_s=0.2, sync_time_s=0.06)
    assert decide(0.1, s2, cfg).reason == "all 3 alive learners in: 3 at the sync point"


def test_inconsistent_state_and_config_errors() -> None:
    with pytest.raises(ValueError, match="quorum_at"):
        decide(1.0, state({0}, {0, 1}, quorum_at=None), CFG)
    with pytest.raises(ValueError):
        QuorumConfig(min_quorum=0)
    with pytest.raises(ValueError):
        QuorumConfig(grace_gamma=1.5)
    with pytest.raises(ValueError):
        QuorumConfig(grace_cap_s=-1.0)
    with pytest.raises(ValueError):
        QuorumConfig(overlap=-1)


def test_ewma_estimator() -> None:
    e = EwmaEstimator(alpha=0.25)
    assert e.value is None
    assert e.update(4.0) == 4.0
    assert e.update(8.0) == pytest.approx(5.0)  # 4 + 0.25 * (8 - 4)
    assert e.update(1.0) == pytest.approx(4.0)  # 5 + 0.25 * (1 - 5)
    assert e.value == pytest.approx(4.0)
    one = EwmaEstimator(alpha=1.0)
    one.update(3.0)
    assert one.update(7.0) == 7.0
    with pytest.raises(ValueError):
        EwmaEstimator(alpha=0.0)
    with pytest.raises(ValueError):
        e.update(float("nan"))


def test_step_time_tracker() -> None:
    t = StepTimeTracker()
    assert t.estimate([0, 1]) is None
    t.update(0, 0.1)
    t.update(1, 0.3)
    t.update(1, 0.5)  # latest replaces
    t.update(2, 9.0)
    assert t.estimate([0, 1]) == pytest.approx(0.3)
    assert t.estimate([0, 1, 7]) == pytest.approx(0.3)  # learners without a value are skipped
    assert t.estimate([2]) == 9.0
    assert t.estimate([]) is None
    t.forget(2)
    assert t.estimate([2]) is None
    with pytest.raises(ValueError):
        t.update(0, -1.0)


# -- the quorum of learners at the sync point (issue 14): K reached, grace running, late, gone -------------


def test_k_reached_starts_the_grace_window_at_the_kth_fresh_push() -> None:
    """K = 2 of 4: the grace window runs from the K-th fresh push, not from the round's start."""
    cfg = QuorumConfig(min_quorum=2, overlap=2, grace_gamma=0.5, grace_cap_s=1.0)
    below = decide(0.03, state({0}, {0, 1, 2, 3}, started_at=0.0, quorum_at=None, step_time_s=0.2,
                                sync_time_s=0.0), cfg)
    assert below.action is Action.WAIT and below.wake_at is None
    at_k = state({0, 1}, {0, 1, 2, 3}, started_at=0.0, quorum_at=0.1, step_time_s=0.2, sync_time_s=0.0)
    d = decide(0.1, at_k, cfg)  # grace = 0.5 * (2 * 0.2 - 0.1 - 0) = 0.15, from quorum_at 0.1
    assert d.action is Action.WAIT and d.grace_s == pytest.approx(0.15) and d.wake_at == pytest.approx(0.25)
    assert "waiting for 2 more" in d.reason


def test_grace_running_merges_at_its_end_without_the_learners_not_at_the_point() -> None:
    s = state({0}, {0, 1, 2, 3}, started_at=0.0, quorum_at=0.02, step_time_s=0.2, sync_time_s=0.02)
    running = decide(0.1, s, CFG)  # grace = 0.5 * (0.4 - 0.02 - 0.02) = 0.18
    assert running.action is Action.WAIT and running.wake_at == pytest.approx(0.2)
    assert running.grace_s == pytest.approx(0.18)
    done = decide(0.2, s, CFG)
    assert done.action is Action.MERGE and done.reason == (
        "grace expired after 0.180s: 1 at the sync point, 3 alive learner(s) not in")


def test_a_learner_reporting_late_inside_the_grace_window_merges_at_once() -> None:
    """Learner 1 reaches the sync point while the window runs: with everyone alive in, no reason to wait on."""
    alive = {0, 1}
    s = state({0}, alive, started_at=0.0, quorum_at=0.02, step_time_s=0.2, sync_time_s=0.02)
    assert decide(0.05, s, CFG).action is Action.WAIT
    s = state({0, 1}, alive, started_at=0.0, quorum_at=0.02, step_time_s=0.2, sync_time_s=0.02)
    d = decide(0.06, s, CFG)
    assert d.action is Action.MERGE and d.wake_at is None and d.grace_s == 0.0


def test_a_carried_push_rides_along_but_does_not_count_toward_k() -> None:
    """A push carried from an earlier round (its answer arrived after that round merged) is no report for this
    round: K = 1 is not reached by it, but once a learner at the sync point is in, it is waited for no more."""
    only_carried = decide(1.0, state(set(), {0, 1}, quorum_at=None, carried={1}), CFG)
    assert only_carried.action is Action.WAIT and only_carried.reason.startswith("quorum 0/1")
    d = decide(10.03, state({0}, {0, 1}, carried={1}), CFG)
    assert d.action is Action.MERGE and d.reason == "all 2 alive learners in: 1 at the sync point (+1 carried)"


def test_a_learner_gone_is_not_waited_for_but_k_stays_a_floor() -> None:
    """Learner 2 left during the window: the remaining alive learners are all in, merge now. With K = 3 and
    only two learners left, the round waits (no deadline): K is a floor on fresh updates merged."""
    s = state({0, 1}, {0, 1, 2}, started_at=0.0, quorum_at=0.02, step_time_s=0.2, sync_time_s=0.02)
    assert decide(0.05, s, CFG).action is Action.WAIT
    gone = state({0, 1}, {0, 1}, started_at=0.0, quorum_at=0.02, step_time_s=0.2, sync_time_s=0.02)
    assert decide(0.05, gone, CFG).action is Action.MERGE
    k3 = QuorumConfig(min_quorum=3, overlap=2, grace_gamma=0.5, grace_cap_s=1.0)
    d = decide(100.0, state({0, 1}, {0, 1}, quorum_at=None), k3)
    assert d.action is Action.WAIT and d.wake_at is None and d.reason.startswith("quorum 2/3")


def test_deterministic_mode_waits_without_deadline_for_every_alive_learner() -> None:
    """wait_for_all: past quorum and past any grace window the round still waits, until all alive are in."""
    cfg = QuorumConfig(min_quorum=1, wait_for_all=True, grace_enabled=False)
    d = decide(1e6, state({0}, {0, 1, 2}), cfg)
    assert d.action is Action.WAIT and d.wake_at is None and "2 more" in d.reason
    assert decide(10.03, state({0, 1}, {0, 1, 2}, carried={2}), cfg).action is Action.MERGE
    assert decide(10.03, state({0, 1}, {0, 1}), cfg).action is Action.MERGE, "a lost learner is not waited for"
    assert decide(1e6, state({0}, {0, 1, 2}), QuorumConfig(min_quorum=1, grace_enabled=False)).action \
        is Action.MERGE, "without it the same round merges at quorum"


def test_the_quorum_config_takes_defaults_and_ranges_from_diloco_config() -> None:
    from diloco_chaos.trainers.config import DilocoConfig

    d = DilocoConfig()
    assert QuorumConfig() == QuorumConfig.from_diloco(d)
    assert QuorumConfig.from_diloco(DilocoConfig(min_quorum=3, deterministic=True)).min_quorum == 3
    assert QuorumConfig.from_diloco(DilocoConfig(deterministic=True)).wait_for_all
    with pytest.raises(ValueError, match=r"grace_gamma must be in \[0, 1\] \(diloco.grace_gamma\)"):
        QuorumConfig(grace_gamma=1.5)
