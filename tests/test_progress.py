"""Live progress writes a line for each fault as it fires and ends, at once, beside the status lines."""

from __future__ import annotations

import io

from conftest import as_records, complete

from harness.progress import Progress, fault_line


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
    from harness.progress import faults_table, verdict_lines
    from harness.results import InvariantFigure

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


def test_a_kill_ends_on_screen_when_its_learner_steps_again_after_the_restart() -> None:
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=3600.0)
    start = {"ev": "fault_start", "index": 1, "action": "kill_learner", "learner": 1, "describe": "kill_learner(1)",
             "reason": "learner 0 reached step 5"}
    p(complete([start, {"ev": "step", "learner": 1, "step": 5}, {"ev": "learner_down", "learner": 1},
       {"ev": "learner_restart", "learner": 1}]))
    assert "ended" not in out.getvalue()  # restarted, but not training yet
    p(complete([{"ev": "step", "learner": 0, "step": 9}]))
    assert "ended" not in out.getvalue()  # another learner's step says nothing about learner 1
    p(complete([{"ev": "step", "learner": 1, "step": 6}]))
    assert out.getvalue().rstrip().endswith(
        "fault F1 ended: kill_learner(1); until the restarted learner stepped again")


def test_a_chip_kill_ends_on_screen_when_the_repaired_chip_rejoins() -> None:
    out = io.StringIO()
    p = Progress(2, stream=out, every_s=3600.0)
    p(complete([{"ev": "fault_start", "index": 0, "action": "kill_chip", "learner": 0, "describe": "kill_chip(0)"},
       {"ev": "learner_shrink", "learner": 0, "lost": [1]}, {"ev": "chip_joined", "learner": 1, "chip": 1}]))
    assert "ended" not in out.getvalue()  # learner 1's chip, not learner 0's
    p(complete([{"ev": "chip_joined", "learner": 0, "chip": 1}]))
    assert out.getvalue().count("fault F0 ended: kill_chip(0); until the repaired chip rejoined") == 1
