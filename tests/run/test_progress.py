"""Live progress writes a line for each fault as it fires and ends, at once, beside the status lines."""

from __future__ import annotations

import io

from conftest import as_records, complete

from diloco_chaos.harness.run.progress import Progress, fault_line


def test_a_fault_is_on_screen_when_it_fires_and_when_it_ends() -> None:
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=3600.0)
    p(complete([{"ev": "step", "learner": 0, "step": 5}]))  # the first status line
    p(complete([{"ev": "fault_start", "index": 1, "action": "kill_chip", "describe": "kill_chip learner 1 chip 0",
        "reason": "learner 1 reached step 40"}]))
    p(complete([{"ev": "fault_end", "index": 1, "action": "kill_chip", "describe": "kill_chip learner 1 chip 0",
        "reason": "run end"}]))
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # the status line is rate-limited, fault lines are not
    assert "fault F1 fired: kill_chip learner 1 chip 0; trigger: learner 1 reached step 40" in lines[1]
    assert "fault F1 ended: kill_chip learner 1 chip 0; run end" in lines[2]


def test_a_fault_that_hit_nothing_says_so() -> None:
    (rec,) = as_records([{"ev": "fault_start", "index": 0, "action": "freeze", "reason": "t >= 2 s",
                          "missed": "learner 0 is down", "learner": 0}])
    line = fault_line(rec)
    assert line == "fault F0 fired: freeze; trigger: t >= 2 s (hit nothing: learner 0 is down)"


def test_the_final_table_lists_each_fault_and_each_verdict() -> None:
    from diloco_chaos.harness.report.results import InvariantFigure
    from diloco_chaos.harness.run.progress import faults_table, verdict_lines

    bands = [{"index": 2, "describe": "freeze(learner 0)", "trigger": "step 10", "start_s": 1.0, "end_s": 2.5,
              "until": "after_s"}]
    assert faults_table(bands).splitlines() == [
        "faults fired: 1", "  F2 freeze(learner 0) | trigger: step 10 | 1.0-2.5 s (after_s)"]
    assert faults_table([]) == "faults: none fired"
    ok = InvariantFigure("model_finite", True, 3, 0, "==", "", "x", "3 observations, all finite")
    bad = InvariantFigure("faults_fired", False, 0, 1, ">=", "", "x", "0 of 1 fired")
    lines = verdict_lines([ok, bad]).splitlines()
    assert lines[0] == "invariants: 1 of 2 violated: faults_fired"
    assert lines[2] == "  FAIL faults_fired: 0 of 1 fired"
    assert verdict_lines([ok]).splitlines()[0] == "invariants: all 1 held"


def test_a_kill_recovers_when_its_learner_steps_again_after_the_restart() -> None:
    from diloco_chaos.harness.report.timeline import FaultReactions

    r = FaultReactions()
    start = {"ev": "fault_start", "index": 1, "action": "kill_learner", "learner": 1, "describe": "kill_learner(1)",
             "reason": "learner 0 reached step 5", "t": 1.0}
    recs = as_records([start, {"ev": "step", "learner": 1, "step": 5, "t": 1.1},
                       {"ev": "learner_down", "learner": 1, "t": 1.2},
                       {"ev": "learner_restart", "learner": 1, "t": 2.0},
                       {"ev": "step", "learner": 0, "step": 9, "t": 2.1},
                       {"ev": "step", "learner": 1, "step": 6, "t": 2.5}])
    got = [r.feed(e) for e in recs]
    assert got == [[], [], [], [], [], [1]]  # restarted is not back; another learner's step says nothing
    assert r.row(1) == {"index": 1, "action": "kill_learner", "learner": 1, "detect_s": 0.2, "reaction": "learner_down",
                        "rejoin_s": 1.3}


def test_a_chip_kill_recovers_when_the_repaired_chip_rejoins() -> None:
    from diloco_chaos.harness.report.timeline import FaultReactions

    r = FaultReactions()
    recs = as_records([{"ev": "fault_start", "index": 0, "action": "kill_chip", "learner": 0, "t": 1.0},
                       {"ev": "learner_shrink", "learner": 0, "lost": [1], "t": 1.1},
                       {"ev": "chip_joined", "learner": 1, "chip": 1, "t": 2.0},
                       {"ev": "chip_joined", "learner": 0, "chip": 1, "t": 3.0}])
    assert [r.feed(e) for e in recs] == [[], [], [], [0]]  # learner 1's chip, then learner 0's


def test_a_syncer_crash_is_the_kill_syncers_reaction_never_a_link_faults() -> None:
    """Issue 26: a degrade on learner 0 was given the syncer_down of a kill_syncer that fired while it was on."""
    from diloco_chaos.harness.report.timeline import fault_response

    recs = as_records([
        {"ev": "fault_start", "index": 1, "action": "degrade", "learner": 0, "t": 1.0},
        {"ev": "fault_start", "index": 2, "action": "kill_syncer", "learner": None, "t": 2.0},
        {"ev": "syncer_down", "t": 2.3}, {"ev": "learner_leave", "learner": 1, "t": 2.4},
        {"ev": "syncer_restore", "t": 3.5}, {"ev": "learner_leave", "learner": 0, "t": 3.6},
        {"ev": "fault_end", "index": 1, "action": "degrade", "learner": 0, "t": 9.0},
        {"ev": "learner_join", "learner": 0, "t": 9.5}])
    rows = {r["index"]: r for r in fault_response(recs)}
    assert rows[2] == {"index": 2, "action": "kill_syncer", "learner": None, "detect_s": 0.3,
                       "reaction": "syncer_down", "rejoin_s": 1.2}
    # the degrade's own learner was dropped while it was on: that, and only that, is its reaction
    assert rows[1] == {"index": 1, "action": "degrade", "learner": 0, "detect_s": 2.6,
                       "reaction": "learner_leave", "rejoin_s": 5.9}


def test_a_kills_end_on_screen_is_its_fault_end_at_its_recovery_time() -> None:
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=3600.0)
    p(complete([{"ev": "run_start", "t": 100.0},
                {"ev": "fault_start", "index": 0, "action": "kill_chip", "describe": "kill_chip(0)", "t": 104.25,
                 "reason": "learner 0 reached step 5"},
                {"ev": "fault_end", "index": 0, "action": "kill_chip", "describe": "kill_chip(0)", "t": 110.0,
                 "ended_t": 108.04, "reason": "until the repaired chip rejoined"}]))
    lines = out.getvalue().splitlines()
    assert lines[0] == "[   4.2s] fault F0 fired: kill_chip(0); trigger: learner 0 reached step 5", lines
    assert lines[1] == "[   8.0s] fault F0 ended: kill_chip(0); until the repaired chip rejoined", lines


def test_the_fault_runner_ends_a_kill_at_its_recovery_and_not_again_at_the_end_of_the_run(tmp_path) -> None:
    """The supervisor's side: fed the records it tails, the runner logs the kill's fault_end once its learner
    steps again after the restart (ended_t: that step's time), and the end of the run ends nothing more; a
    kill never recovered ends "not recovered by run end"."""
    from diloco_chaos.chaos.schedule import parse_fault
    from diloco_chaos.harness.record.events import EventLog, read_events
    from diloco_chaos.harness.run.fault_runner import FaultRunner

    kills = tuple(parse_fault({"action": "kill_learner", "learner": m, "at": {"step": 5, "learner": 0}},
                              f"faults[{m}]", learners=2) for m in range(2))
    path = tmp_path / "events.jsonl"
    runner = FaultRunner(kills, None, EventLog(path, "supervisor"))
    for i in range(2):  # as if both had fired (their processes are not real here)
        runner.schedule.started_at[i], runner.schedule.fired[i] = 1.0, 1
    runner.tick(complete([
        {"ev": "fault_start", "index": 0, "action": "kill_learner", "learner": 0, "t": 1.0},
        {"ev": "fault_start", "index": 1, "action": "kill_learner", "learner": 1, "t": 1.0},
        {"ev": "step", "learner": 0, "step": 6, "t": 2.5},  # file order is not time order: sorted first
        {"ev": "learner_down", "learner": 0, "t": 1.2}, {"ev": "learner_restart", "learner": 0, "t": 2.0},
        {"ev": "learner_down", "learner": 1, "t": 1.3}]), 3.0)
    runner.stop_all(9.0)
    ends = [e for e in read_events(path) if e["ev"] == "fault_end"]
    assert [(e["index"], e["reason"], e.get("ended_t"), e.get("reaction")) for e in ends] == [
        (0, "until the restarted learner stepped again", 2.5, "learner_down"),
        (1, "not recovered by run end", None, None)], ends


def test_a_fault_that_hit_nothing_has_no_reaction() -> None:
    from diloco_chaos.harness.report.timeline import fault_response

    recs = as_records([{"ev": "fault_start", "index": 0, "action": "kill_learner", "learner": 1, "t": 1.0,
                        "missed": "learner 1 is down"},
                       {"ev": "learner_leave", "learner": 1, "t": 1.5}, {"ev": "learner_join", "learner": 1, "t": 3.0}])
    assert fault_response(recs)[0]["reaction"] is None


def test_the_status_line_counts_torchft_committed_steps_as_the_global_models_progress() -> None:
    """A torchft run has no syncer merges: its status line shows the highest committed global step instead."""
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=0.0)
    p(complete([{"ev": "torchft_sync", "learner": 0, "step": 7, "committed": True},
                {"ev": "torchft_sync", "learner": 1, "step": 9, "committed": False}]))  # not committed: not counted
    assert "syncer merges     7" in out.getvalue().splitlines()[-1]
