"""Fault schedules: parsing with key-naming errors, and the pure start/stop decision over its triggers."""

from __future__ import annotations

import pytest

from diloco_chaos.chaos.schedule import FaultSchedule, FaultSpec, ScheduleError, Trigger, parse_fault, reached


def spec(**kw: object) -> FaultSpec:
    return parse_fault({"action": "partition", "learner": 1, **kw}, "faults[0]", learners=4)


def steps(sched: FaultSchedule, **per: int) -> None:
    sched.progress.observe([{"ev": "step", "learner": int(k[1:]), "step": v} for k, v in per.items()])


def test_defaults_start_at_run_start_and_last_to_the_end() -> None:
    f = spec()
    assert f.at == Trigger(time_s=0.0) and f.until is None
    s = FaultSchedule([f])
    assert [(t.index, t.start) for t in s.decide(0.0)] == [(0, True)]
    assert s.decide(1e6) == []
    assert s.active() == [0]
    ended = s.end_all()
    assert [(t.index, t.start, t.reason) for t in ended] == [(0, False, "end of run")]
    assert (s.fired, s.cleared) == ([1], [1])


def test_step_trigger_of_one_learner_ignores_the_others() -> None:
    s = FaultSchedule([spec(at={"step": 10, "learner": 2}, until={"step": 20, "learner": 2})])
    steps(s, l0=50, l1=50)
    assert s.decide(1.0) == []
    steps(s, l2=10)
    (t,) = s.decide(2.0)
    assert t.start and t.reason == "learner 2 reached step 10"
    steps(s, l2=19)
    assert s.decide(3.0) == []
    steps(s, l2=20)
    (t,) = s.decide(4.0)
    assert not t.start and s.fired == [1] and s.cleared == [1]


def test_step_trigger_without_learner_uses_the_most_advanced() -> None:
    s = FaultSchedule([spec(at={"step": 10})])
    steps(s, l0=3, l3=10)
    assert [t.reason for t in s.decide(0.0)] == ["the most advanced learner reached step 10"]


def test_merges_and_after_s_triggers() -> None:
    s = FaultSchedule([spec(at={"merges": 5}, until={"after_s": 2.0})])
    s.progress.observe([{"ev": "merge", "merges": 4}])
    assert s.decide(10.0) == []
    s.progress.observe([{"ev": "merge", "merges": 5}])
    assert [t.start for t in s.decide(10.0)] == [True]
    assert s.decide(11.9) == []
    assert [t.start for t in s.decide(12.0)] == [False]
    assert s.decide(100.0) == [], "a fault fires once"
    assert not s.pending()


def test_start_and_stop_in_the_same_decision_when_both_are_reached() -> None:
    s = FaultSchedule([spec(at={"step": 5}, until={"step": 6})])
    steps(s, l0=100)
    assert [t.start for t in s.decide(0.0)] == [True, False]


def test_reached_is_pure_over_its_branches() -> None:
    from diloco_chaos.chaos.schedule import Progress

    p = Progress(steps={0: 7}, merges=3)
    assert reached(Trigger(step=7), p, 0.0, None)
    assert not reached(Trigger(step=8), p, 0.0, None)
    assert not reached(Trigger(step=1, learner=1), p, 0.0, None)
    assert reached(Trigger(merges=3), p, 0.0, None)
    assert reached(Trigger(time_s=2.5), p, 2.5, None) and not reached(Trigger(time_s=2.5), p, 2.4, None)
    assert not reached(Trigger(after_s=1.0), p, 5.0, None), "after_s needs a start time"
    assert reached(Trigger(after_s=1.0), p, 5.0, 4.0)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"action": "explode", "learner": 0}, "faults[0].action = 'explode': must be one of degrade"),
        ({"action": "partition", "learner": 4}, "faults[0].learner = 4: must be in [0, 3]"),
        ({"action": "partition"}, "faults[0].learner = None"),
        ({"action": "partition", "learner": 0, "colour": 1}, "unknown key faults[0].colour"),
        ({"action": "partition", "learner": 0, "latency_ms": 5}, "faults[0].latency_ms: not a parameter of partition"),
        ({"action": "partition", "learner": 0, "mode": "melt"}, "faults[0].mode = 'melt': must be one of"),
        ({"action": "degrade", "learner": 0}, "degrade needs profile"),
        ({"action": "degrade", "learner": 0, "bandwidth_kbps": -1}, "faults[0].bandwidth_kbps = -1: must be in"),
        ({"action": "degrade", "learner": 0, "profile": "moon"}, "faults[0].profile = 'moon': must be one of"),
        ({"action": "flap", "learner": 0, "period_s": 1.0}, "flap needs period_s and duty"),
        ({"action": "flap", "learner": 0, "period_s": 1.0, "duty": 1.5}, "faults[0].duty = 1.5: must be in"),
        ({"action": "limit_data", "learner": 0}, "limit_data needs bytes"),
        ({"action": "limit_data", "learner": 0, "bytes": 1.5}, "faults[0].bytes = 1.5: must be an integer"),
        ({"action": "partition", "learner": 0, "at": {"step": 1, "merges": 1}}, "faults[0].at: set exactly one"),
        ({"action": "partition", "learner": 0, "at": {"after_s": 1}},
         "faults[0].at: set exactly one of step, merges, time_s, after (after_s"),
        ({"action": "partition", "learner": 0, "at": {"merges": 1, "learner": 0}},
         "faults[0].at.learner: only valid together with faults[0].at.step"),
        ({"action": "partition", "learner": 0, "at": {"step": -1}}, "faults[0].at.step = -1: must be an integer"),
        ({"action": "partition", "learner": 0, "until": 5}, "faults[0].until = 5: must be a table"),
        ({"action": "kill_learner", "learner": 0, "chip": 1}, "faults[0].chip: not a parameter of kill_learner"),
        ({"action": "freeze", "learner": 0}, "freeze needs until"),
        ({"action": "kill_chip", "learner": 0, "chip": -1}, "faults[0].chip = -1: must be in [0, 1023]"),
    ],
)
def test_bad_entries_name_the_key(raw: dict, needle: str) -> None:
    with pytest.raises(ScheduleError) as e:
        parse_fault(raw, "faults[0]", learners=4)
    assert needle in str(e.value)


def test_round_trip_through_its_table_and_options_is_no_document_key() -> None:
    f = parse_fault({"action": "degrade", "learner": 2, "latency_ms": 40, "bandwidth_kbps": 800,
                     "at": {"merges": 3}, "until": {"after_s": 1.5}}, "faults[0]", 4)
    assert parse_fault(f.to_table(), "faults[0]", 4) == f == parse_fault(f, "faults[0]", 4)
    with pytest.raises(ScheduleError, match="unknown key faults.0..options"):
        parse_fault({"action": "degrade", "learner": 2, "options": {"latency_ms": 40}}, "faults[0]", 4)
    assert f.params() == {"latency_ms": 40.0, "bandwidth_kbps": 800.0}
    assert f.describe() == "degrade(learner 2, latency_ms=40.0, bandwidth_kbps=800.0)"
