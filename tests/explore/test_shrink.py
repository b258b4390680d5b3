"""Shrinking with fake predicates (no processes): it reaches a minimal schedule, keeps only what the failure
needs, counts r of n, stops at its run budget, and every candidate is smaller than what it came from."""

from __future__ import annotations

import itertools

import pytest

from diloco_chaos.chaos.schedule import parse_fault
from diloco_chaos.harness.explore.records import Trial
from diloco_chaos.harness.explore.shrink import (
    MIN_DURATION_S,
    TRIGGER_FLOOR,
    Judgement,
    RofN,
    Try,
    candidates,
    later,
    shrink,
    toward,
)

KILL = {"action": "kill_learner", "learner": 1, "repair_s": 2.4, "at": {"step": 90, "learner": 1}}
DEGRADE = {"action": "degrade", "learner": 0, "latency_ms": 300.0, "bandwidth_kbps": 2000.0,
           "at": {"step": 40, "learner": 0}, "until": {"after_s": 2.5}}
SLOW = {"action": "slow", "learner": 2, "speed": 0.3, "at": {"step": 60, "learner": 2}, "until": {"after_s": 1.0}}
AFTER = {"action": "partition", "learner": 0, "at": {"after": "rejoin", "learner": 1, "after_s": 0.8},
         "until": {"after_s": 1.6}}


def trial(*tables: dict, steps: int = 150, learners: int = 4) -> Trial:
    return Trial(tuple(parse_fault(t, f"faults[{i}]", learners) for i, t in enumerate(tables)), steps, learners)


def always(t: Trial) -> Judgement:
    return Judgement(True, 1, "dir")


def has_kill(t: Trial) -> Judgement:
    """A bug that needs learner 1 killed, whatever else happens."""
    return Judgement(any(f.action == "kill_learner" for f in t.faults), 1)


def test_toward_tries_the_limit_first_then_halfway_and_ends() -> None:
    assert toward(400.0, 10.0) == [10.0, 200.0]
    assert toward(10.0, 10.0) == []
    v, steps = 400.0, 0
    while toward(v, 10.0):
        v, steps = toward(v, 10.0)[-1], steps + 1
    assert v == 10.0 and steps < 15


def test_a_failure_that_needs_only_the_kill_shrinks_to_the_kill_alone_at_its_floors() -> None:
    res = shrink(trial(DEGRADE, KILL, SLOW), has_kill, lambda t: True, first=5, max_runs=1000)
    assert not res.exhausted
    (f,) = res.trial.faults
    assert f.action == "kill_learner" and f.learner == 1
    assert f.options.repair_s == MIN_DURATION_S and f.at.step == TRIGGER_FLOOR == 16  # no earlier: 20 steps
    assert res.trial.learners == 2 and res.trial.steps == 20  # fewest learners covering learner 1, fewest steps
    assert res.steps[0].startswith("drop faults[0] degrade")


def test_what_the_failure_depends_on_is_kept() -> None:
    """A bug that needs latency of at least 100 ms on a degrade lasting 2 s or more: shrinking keeps both."""
    def needs_latency(t: Trial) -> Judgement:
        return Judgement(any(f.action == "degrade" and (f.latency_ms or 0) >= 100 and f.until is not None
                             and (f.until.after_s or 0) >= 2.0 for f in t.faults), 1)

    res = shrink(trial(KILL, DEGRADE), needs_latency, lambda t: True, first=5, max_runs=1000)
    (f,) = res.trial.faults
    assert f.action == "degrade" and 100 <= f.latency_ms < 300 and 2.0 <= f.until.after_s <= 2.5
    assert f.bandwidth_kbps == 100_000.0  # milder: the bandwidth did not matter


def test_every_candidate_is_valid_for_the_fault_rules_and_differs() -> None:
    t = trial(KILL, AFTER, DEGRADE)
    seen = list(candidates(t, first=5))
    assert seen and all(c != t for _, c in seen)
    assert any(w.startswith("faults[1] partition 0.8 s after the reaction") for w, _ in seen)
    assert any(w.startswith("faults[2] degrade latency_ms 300 -> 10") for w, _ in seen)


def test_invalid_candidates_are_skipped_without_a_run() -> None:
    runs: list[Trial] = []

    def fails(t: Trial) -> Judgement:
        runs.append(t)
        return Judgement(True, 1)

    res = shrink(trial(KILL, AFTER), fails, lambda t: len(t.faults) == 2, first=5, max_runs=1000)
    assert len(res.trial.faults) == 2 and all(len(t.faults) == 2 for t in runs)


def test_the_run_budget_stops_shrinking() -> None:
    res = shrink(trial(DEGRADE, KILL, SLOW), always, lambda t: True, first=5, max_runs=3)
    assert res.exhausted and res.runs == 3 and len(res.steps) == 3 and res.run_dir == "dir"


def fake_attempt(outcomes: list[bool]) -> tuple[list[int], object]:
    it = iter(outcomes)
    batches: list[int] = []

    def attempt(t: Trial, k: int) -> list[Try]:
        batches.append(k)
        return [Try(next(it), f"run{n}") for n in range(k)]

    return batches, attempt


@pytest.mark.parametrize("outcomes, r, n, width, failed, runs", [
    ([True, True], 2, 3, 1, True, 2),  # stops once r failed
    ([False, False, True], 2, 3, 1, False, 2),  # stops once r cannot be reached
    ([False, True, True], 2, 3, 1, True, 3),
    ([True, False, False, True], 2, 4, 1, True, 4),
    ([True], 1, 5, 1, True, 1),
    ([False] * 5, 1, 5, 1, False, 5),
    ([False, True, True, True], 3, 4, 4, True, 4),  # in parallel: rounds of at most r - failed
])
def test_r_of_n_counts_and_stops_as_soon_as_the_answer_is_known(outcomes: list[bool], r: int, n: int, width: int,
                                                                failed: bool, runs: int) -> None:
    batches, attempt = fake_attempt(outcomes)
    j = RofN(attempt, r, n, width)(trial(KILL))  # type: ignore[arg-type]
    assert (j.failed, j.runs) == (failed, runs)
    assert sum(batches) == runs and all(b <= width for b in batches)


def test_r_of_n_with_a_flaky_failure_keeps_a_candidate_a_single_try_would_lose() -> None:
    """A failure that repeats every other run: 1 of 1 loses half the candidates, 1 of 2 keeps them all."""
    flaky = itertools.cycle([False, True])
    single = RofN(lambda t, k: [Try(next(flaky)) for _ in range(k)], 1, 1)
    assert [single(trial(KILL)).failed for _ in range(4)] == [False, True, False, True]
    pair = RofN(lambda t, k: [Try(next(flaky)) for _ in range(k)], 1, 2)
    assert all(pair(trial(KILL)).failed for _ in range(4))


def test_r_above_n_is_refused() -> None:
    with pytest.raises(ValueError, match="must_fail = 3"):
        RofN(lambda t, k: [], 3, 2)


def test_a_candidate_failing_another_invariant_is_not_taken() -> None:
    """The predicate explore builds counts a try as failing only when the invariant being shrunk failed: the kill
    alone fails initial_pull, the degrade alone fails work_kept; shrinking initial_pull keeps the kill."""
    def violated(t: Trial) -> set[str]:
        return {"initial_pull"} if any(f.action == "kill_learner" for f in t.faults) else {"work_kept"}

    tried: list[set[str]] = []

    def attempt(t: Trial, k: int) -> list[Try]:
        tried.append(violated(t))
        return [Try("initial_pull" in violated(t)) for _ in range(k)]

    res = shrink(trial(KILL, DEGRADE, steps=40), RofN(attempt, 1, 1), lambda t: True, first=5, max_runs=50)
    assert [f.action for f in res.trial.faults] == ["kill_learner"]
    assert {"work_kept"} in tried  # dropping the kill was tried, and refused


def kill_step(t: Trial) -> int:
    return next((f.at.step or 0) for f in t.faults if f.action == "kill_learner")


def flaky_below(step: int) -> tuple[list[int], object]:
    """A bug that needs the kill and repeats every run when the kill is at `step` or later, but only every other
    run when it is earlier (as a restored syncer with few merges behind it): r = 1 of n = 2 walks the kill down to
    the first step, a 4-of-5 confirmation must bring it back."""
    flips = itertools.cycle([True, False])
    seen: list[int] = []

    def attempt(t: Trial, k: int) -> list[Try]:
        out = []
        for _ in range(k):
            has = any(f.action == "kill_learner" for f in t.faults)
            seen.append(kill_step(t) if has else -1)
            out.append(Try(has and (kill_step(t) >= step or next(flips)), "run"))
        return out

    return seen, attempt


def test_a_schedule_that_does_not_repeat_at_the_rate_asked_is_backed_out_of() -> None:
    seen, attempt = flaky_below(40)
    loose = shrink(trial(KILL, DEGRADE), RofN(attempt, 1, 2), lambda t: True, first=5, max_runs=200)  # type: ignore[arg-type]
    assert kill_step(loose.trial) == TRIGGER_FLOOR and loose.repeat is None  # unconfirmed: the flaky one is kept

    seen, attempt = flaky_below(40)
    confirms: list[tuple[int, int]] = []
    res = shrink(trial(KILL, DEGRADE), RofN(attempt, 1, 2), lambda t: True, first=5, max_runs=200,  # type: ignore[arg-type]
                 confirm=RofN(attempt, 4, 5), on_confirm=lambda t, j: confirms.append((kill_step(t), j.fails)))  # type: ignore[arg-type]
    assert res.repeat is not None and res.repeat.confirmed and res.repeat.fails >= 4
    assert kill_step(res.trial) >= 40 and [f.action for f in res.trial.faults] == ["kill_learner"]
    assert res.rejected and any(s < 40 for s, _ in confirms)  # a flaky one was reached, confirmed, and refused
    assert res.trial.faults[0].options.repair_s == MIN_DURATION_S  # and shrinking went on past it
    assert res.runs == len(seen) and res.runs <= 200


def test_a_start_that_does_not_repeat_is_kept_with_its_measured_rate() -> None:
    flips = itertools.cycle([True, False, False])
    res = shrink(trial(KILL), always, lambda t: True, first=5, max_runs=0,
                 confirm=RofN(lambda t, k: [Try(next(flips)) for _ in range(k)], 4, 5))
    assert res.trial == trial(KILL) and res.repeat is not None
    assert not res.repeat.confirmed and res.repeat.fails < 4 and res.repeat.runs <= 5


def test_a_confirmed_schedule_is_not_confirmed_twice() -> None:
    seen, attempt = flaky_below(40)
    calls: list[str] = []
    shrink(trial(KILL, DEGRADE), RofN(attempt, 1, 2), lambda t: True, first=5, max_runs=200,  # type: ignore[arg-type]
           confirm=RofN(attempt, 4, 5), on_confirm=lambda t, j: calls.append(t.key()))  # type: ignore[arg-type]
    assert len(calls) == len(set(calls))


def test_a_trigger_is_not_moved_below_where_it_shortens_the_run() -> None:
    early = {**KILL, "at": {"step": 12, "learner": 1}}
    moved = [w for w, _ in candidates(trial(early, steps=20, learners=2), first=5) if "at step" in w]
    assert moved == []  # 12 < 16: an earlier kill would not make the 20-step run any shorter
    moved = [w for w, _ in candidates(trial(KILL, steps=120, learners=2), first=5) if "at step" in w]
    assert moved and moved[0].endswith("at step 90 -> 16")


def test_a_start_that_does_not_repeat_is_moved_later_until_one_does() -> None:
    """The failure repeats surely only with the kill at step 30 or later; explore found it at step 10 (it passed
    once of two there): the start is not confirmed, a later trigger is, and shrinking goes on from that one
    without moving the kill back below 30 for good."""
    seen, attempt = flaky_below(30)
    start = trial({**KILL, "at": {"step": 10, "learner": 1}}, DEGRADE, steps=60)
    assert [w for w, _ in later(start, 54)][:2] == ["faults[0] kill_learner at step 10 -> 32 (to repeat)",
                                                    "faults[0] kill_learner at step 10 -> 54 (to repeat)"]
    res = shrink(start, RofN(attempt, 1, 2), lambda t: True, first=5, max_runs=200,  # type: ignore[arg-type]
                 confirm=RofN(attempt, 5, 5), last=54)  # type: ignore[arg-type]
    assert res.repeat is not None and res.repeat.confirmed
    assert [f.action for f in res.trial.faults] == ["kill_learner"] and kill_step(res.trial) >= 30
    assert "faults[0] kill_learner at step 10 -> 32 (to repeat)" in res.steps
    assert start.describe() not in res.rejected  # the start is not rejected: it is where the steps begin


def test_when_nothing_repeats_the_start_is_kept_with_its_rate() -> None:
    flips = itertools.cycle([True, False])
    res = shrink(trial(KILL, steps=60), always, lambda t: True, first=5, max_runs=3,
                 confirm=RofN(lambda t, k: [Try(next(flips)) for _ in range(k)], 5, 5), last=54)
    assert res.repeat is not None and not res.repeat.confirmed and res.trial == trial(KILL, steps=60)
    assert len(res.rejected) >= 1 and res.runs <= 3 + 2 * (1 + 4)  # greedy, then at most 5 confirmations
