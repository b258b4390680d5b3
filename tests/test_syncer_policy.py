"""Tests for trainers.syncer_policy: every branch of decide() with plain float clocks."""

from __future__ import annotations

import pytest

from trainers.syncer_policy import (
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
) -> RoundState:
    return RoundState(
        started_at=started_at,
        quorum_at=quorum_at,
        reported=frozenset(reported),
        alive=frozenset(alive),
        step_time_s=step_time_s,
        sync_time_s=sync_time_s,
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
    assert d == Decision(Action.WAIT, "quorum 1/2: waiting for 1 more", 0.0, None)
    d = decide(50.0, state(set(), {0, 1}, quorum_at=None), QuorumConfig(min_quorum=1))
    assert d.action is Action.WAIT and d.wake_at is None and "0/1" in d.reason


def test_all_alive_reported_merges_immediately() -> None:
    d = decide(10.021, state({0, 1, 2}, {0, 1, 2}), CFG)
    assert d.action is Action.MERGE
    assert d.reason == "all 3 alive learners reported"
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
    assert decide(0.1, s2, cfg).reason == "all 3 alive learners reported"


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


def test_declines_count_toward_the_quorum_but_a_merge_needs_a_push() -> None:
    """K = M: a learner with nothing new (it declined) must not hold the round until the fragment is due again."""
    cfg = QuorumConfig(min_quorum=3, overlap=2, grace_gamma=0.5, grace_cap_s=0.5, grace_enabled=False)
    base = dict(started_at=0.0, step_time_s=0.1, sync_time_s=0.0)
    waiting = decide(1.0, RoundState(quorum_at=None, reported=frozenset({0}), alive=frozenset({1}),
                                     declined=frozenset({2}), **base), cfg)
    assert waiting.action is Action.WAIT and "quorum 2/3" in waiting.reason
    merged = decide(1.0, RoundState(quorum_at=0.5, reported=frozenset({0, 1}), alive=frozenset({0, 1}),
                                    declined=frozenset({2}), **base), cfg)
    assert merged.action is Action.MERGE
    only_declines = decide(1.0, RoundState(quorum_at=0.5, reported=frozenset(), alive=frozenset({0}),
                                           declined=frozenset({1, 2, 3}), **base), cfg)
    assert only_declines.action is Action.WAIT and "no push yet" in only_declines.reason
