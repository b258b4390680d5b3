"""Triggers on a reaction of the run: `at = { after = "rejoin", learner = 2, after_s = 0.5 }` and
`at = { after = "syncer_restored" }` (diloco_chaos/chaos/schedule.py).

The decision is pure (the clock is passed in, no sleeps): events in, `decide(elapsed_s)` out. The validation
says which `after` names exist and refuses a reaction nothing in the schedule can cause. Two real runs show a
fault firing after the reaction it waits for, by the run's own event log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_table

from diloco_chaos.chaos.schedule import (
    FaultSchedule,
    FaultSpec,
    ScheduleError,
    Trigger,
    missing_reaction,
    parse_fault,
    reached,
)
from diloco_chaos.harness.config.check import incident_problems
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.replay import load_incident
from diloco_chaos.harness.run.supervisor import run_scenario


def spec(at: dict[str, Any], until: dict[str, Any] | None = None, **kw: Any) -> FaultSpec:
    table = {"action": "partition", "learner": 1, "at": at, **kw}
    if until is not None:
        table["until"] = until
    return parse_fault(table, "faults[0]", learners=3)


def test_rejoin_fires_after_s_past_the_learners_first_step_after_its_restart() -> None:
    s = FaultSchedule([spec({"after": "rejoin", "learner": 2, "after_s": 0.5})])
    s.progress.observe([{"ev": "step", "learner": 2, "step": 10}], 1.0)
    s.progress.observe([{"ev": "learner_down", "learner": 2}, {"ev": "learner_restart", "learner": 2},
                        {"ev": "learner_restart", "learner": 0}], 2.0)
    assert s.decide(2.0) == [], "restarted is not rejoined: it has not stepped yet"
    s.progress.observe([{"ev": "step", "learner": 0, "step": 11}], 3.0)
    assert s.decide(9.0) == [], "another learner's rejoin does not count"
    s.progress.observe([{"ev": "step", "learner": 2, "step": 11}], 10.0)
    assert s.decide(10.4) == []
    (t,) = s.decide(10.5)
    assert t.start and t.reason == "0.5 s after learner 2 rejoined"
    assert s.progress.rejoins == {0: [(3.0, 11)], 2: [(10.0, 11)]}


def test_a_repaired_chip_joining_is_a_rejoin_and_after_steps_counts_the_learners_steps_from_it() -> None:
    s = FaultSchedule([spec({"after": "rejoin", "learner": 1, "after_steps": 5})])
    s.progress.observe([{"ev": "step", "learner": 1, "step": 30}, {"ev": "chip_joined", "learner": 1, "chip": 1,
                                                                    "step": 31}], 4.0)
    assert s.decide(5.0) == []
    s.progress.observe([{"ev": "step", "learner": 1, "step": 35}], 6.0)
    assert s.decide(6.0) == []
    s.progress.observe([{"ev": "step", "learner": 1, "step": 36}], 7.0)
    assert [t.reason for t in s.decide(7.0)] == ["5 steps after learner 1 rejoined"]


def test_syncer_restored_at_once_and_as_an_until_counting_only_restores_after_the_start() -> None:
    s = FaultSchedule([spec({"after": "syncer_restored"}),
                       spec({"step": 20}, {"after": "syncer_restored", "after_s": 1.0})])
    s.progress.observe([{"ev": "syncer_restore", "merges": 3}, {"ev": "step", "learner": 0, "step": 1}], 5.0)
    assert [(t.index, t.start, t.reason) for t in s.decide(5.0)] == [(0, True, "the syncer restored")]
    s.progress.observe([{"ev": "step", "learner": 0, "step": 20}], 6.0)
    assert [(t.index, t.start) for t in s.decide(6.0)] == [(1, True)]
    assert s.decide(20.0) == [], "the restore at 5.0 came before fault 1 started: its until waits for the next"
    s.progress.observe([{"ev": "syncer_restore", "merges": 9}], 21.0)
    assert s.decide(21.9) == []
    assert [(t.index, t.start, t.reason) for t in s.decide(22.0)] == [(1, False, "1 s after the syncer restored")]


def test_reached_is_pure_in_progress_and_the_clock() -> None:
    trig = Trigger(after="rejoin", learner=0, after_s=2.0)
    s = FaultSchedule([])
    s.progress.observe([{"ev": "learner_restart", "learner": 0}, {"ev": "step", "learner": 0, "step": 4}], 1.0)
    p = s.progress
    assert [reached(trig, p, t, None) for t in (1.0, 2.9, 3.0)] == [False, False, True]
    assert reached(trig, p, 3.0, None), "asking again changes nothing"
    assert not reached(trig, p, 100.0, 1.5), "in an until, only a rejoin after the fault started counts"


@pytest.mark.parametrize(("at", "error"), [
    ({"after": "rejoined", "learner": 1}, r"faults\[0\]\.at\.after = 'rejoined' \(did you mean rejoin\?\): must be "
                                          r"one of rejoin, syncer_restored"),
    ({"after": 3}, r"at\.after = 3: must be one of rejoin, syncer_restored"),
    ({"after": "rejoin"}, r"at\.learner: needed with faults\[0\]\.at\.after = 'rejoin'"),
    ({"after": "rejoin", "learner": 3}, r"at\.learner = 3: must be in \[0, 2\]"),
    ({"after": "syncer_restored", "learner": 1}, r"at\.learner: not with faults\[0\]\.at\.after = 'syncer_restored'"),
    ({"after": "syncer_restored", "after_steps": 3}, r"at\.after_steps: not with"),
    ({"after": "rejoin", "learner": 1, "after_s": 1, "after_steps": 2}, r"at most one of after_s, after_steps"),
    ({"after": "rejoin", "learner": 1, "step": 2}, r"at\.step: not with faults\[0\]\.at\.after"),
    ({"after": "rejoin", "learner": 1, "after_s": -1}, r"at\.after_s = -1: must be a number >= 0"),
    ({"after_s": 1}, r"at: set exactly one of step, merges, time_s, after \(after_s and after_steps count"),
    ({"step": 3, "after_steps": 1}, r"at: set exactly one of"),
])
def test_a_bad_reaction_trigger_is_refused_naming_its_key(at: dict[str, Any], error: str) -> None:
    with pytest.raises(ScheduleError, match=error):
        spec(at)


def test_a_reaction_nothing_can_cause_never_fires_and_is_refused_before_the_run() -> None:
    rejoin = {"action": "degrade", "learner": 1, "latency_ms": 5, "at": {"after": "rejoin", "learner": 1}}
    kill_0 = {"action": "kill_learner", "learner": 0, "at": {"step": 10}}
    kill_1 = {**kill_0, "learner": 1}
    specs = [parse_fault(f, "f", 2) for f in (rejoin, kill_0)]
    assert "no other fault hits learner 1" in (missing_reaction(0, specs) or "")
    assert missing_reaction(0, [*specs, parse_fault(kill_1, "f", 2)]) is None
    table = tiny_table(learners=2, chips=1, recovery={"policy": "restart"})
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.at\.after = 'rejoin': no other fault hits learner 1"):
        from_dict({**table, "faults": [rejoin, kill_0]})
    assert from_dict({**table, "faults": [rejoin, kill_1]}).faults[0].at == Trigger(after="rejoin", learner=1)
    with pytest.raises(ScenarioError, match=r"faults\[0\]: after = 'rejoin' needs a recovery.policy"):
        from_dict({**tiny_table(learners=2, chips=1), "faults": [rejoin, {**kill_1, "action": "freeze"}]})
    restored = {"action": "degrade", "learner": 1, "latency_ms": 5, "at": {"after": "syncer_restored"}}
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.at\.after = 'syncer_restored': no fault kills the "
                                            r"syncer"):
        from_dict({**table, "faults": [restored, kill_1]})
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.at\.after_steps = 60: never reached, train\.steps = 60"):
        from_dict({**table, "faults": [{**rejoin, "at": {"after": "rejoin", "learner": 1, "after_steps": 60}},
                                       kill_1]})


def test_an_incident_may_wait_on_a_reaction_to_the_scenarios_own_fault(tmp_path: Path) -> None:
    """`validate --incident` and `run --incident` agree: the incident's fault waits for a rejoin the scenario's
    kill causes; without that kill both refuse it."""
    table = tiny_table(learners=2, chips=1, recovery={"policy": "restart"})
    sc = from_dict({**table, "faults": [{"action": "kill_learner", "learner": 1, "at": {"step": 10}}]})
    incident = tmp_path / "incident.toml"
    incident.write_text('[[faults]]\naction = "degrade"\nlearner = 1\nlatency_ms = 5\n'
                        'at = { after = "rejoin", learner = 1, after_s = 0.5 }\n')
    assert incident_problems(incident, sc) == []
    assert load_incident(incident, sc).faults[1].at == Trigger(after="rejoin", learner=1, after_s=0.5)
    bare = from_dict(table)
    (err,) = incident_problems(incident, bare)
    assert "faults[0].at.after = 'rejoin': no other fault hits learner 1" in str(err)
    with pytest.raises(ScenarioError, match="no other fault hits learner 1"):
        load_incident(incident, bare)


def test_a_reaction_trigger_round_trips_through_config_json() -> None:
    f = spec({"after": "rejoin", "learner": 2, "after_s": 0.5}, {"after": "syncer_restored"})
    assert f.to_table()["at"] == {"after": "rejoin", "learner": 2, "after_s": 0.5}
    assert parse_fault(f.to_table(), "faults[0]", 3) == f


def _first(events: list[dict[str, Any]], ev: str, **match: Any) -> dict[str, Any]:
    hit = next((e for e in events if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())), None)
    assert hit is not None, f"no {ev} {match} in the run's events"
    return hit


def test_a_fault_after_the_syncer_restored_fires_after_its_restore(tmp_path: Path) -> None:
    """decoupled 2x1: kill_syncer at step 15; a degrade waits for the restore, then 0.3 s. 200 steps: the learners
    train on while the syncer is down, and with 60 a CI run had them finish before the restore + 0.3 s."""
    table = tiny_table("decoupled", learners=2, chips=1, steps=200,
                       recovery={"syncer_policy": "restart", "syncer_repair_s": 0.3})
    table["faults"] = [{"action": "kill_syncer", "at": {"step": 15}},
                       {"action": "degrade", "learner": 1, "latency_ms": 20,
                        "at": {"after": "syncer_restored", "after_s": 0.3}, "until": {"after_s": 0.5}}]
    res = run_scenario(from_dict(table), tmp_path / "runs", None)
    events = read_events(Path(res.run_dir) / EVENTS_FILE)
    restore = _first(events, "syncer_restore")
    start = _first(events, "fault_start", index=1)
    assert start["reason"] == "0.3 s after the syncer restored"
    assert start["t"] >= restore["t"] + 0.3, (restore["t"], start["t"])
    assert _first(events, "fault_start", index=0)["t"] < restore["t"]


def test_a_fault_after_a_learner_rejoined_fires_after_its_first_step_back(tmp_path: Path) -> None:
    """decoupled 2x1: kill_learner 1 at its step 15, restarted after 0.5 s; a degrade of learner 1 waits for
    it to step again, then 5 more of its steps."""
    table = tiny_table("decoupled", learners=2, chips=1, steps=60, recovery={"policy": "restart", "repair_s": 0.5})
    table["faults"] = [{"action": "kill_learner", "learner": 1, "at": {"step": 15, "learner": 1}},
                       {"action": "degrade", "learner": 1, "latency_ms": 20,
                        "at": {"after": "rejoin", "learner": 1, "after_steps": 5}, "until": {"after_s": 0.5}}]
    res = run_scenario(from_dict(table), tmp_path / "runs", None)
    events = read_events(Path(res.run_dir) / EVENTS_FILE)
    restart = _first(events, "learner_restart", learner=1)
    back = next(e for e in events if e["ev"] == "step" and e["learner"] == 1 and e["t"] > restart["t"])
    start = _first(events, "fault_start", index=1)
    assert start["reason"] == "5 steps after learner 1 rejoined"
    assert start["t"] > back["t"] and start["progress"]["steps"]["1"] >= back["step"] + 5, (back, start)
