"""Errors labelled by the fault that explains them: target, time window, settle window, syncer crashes."""

from __future__ import annotations

from typing import Any

from harness.run_errors import classify_errors


def ev(t: float, kind: str, **kw: Any) -> dict[str, Any]:
    return {"t": t, "ev": kind, "proc": kw.pop("proc", "supervisor"), **kw}


def fault(t: float, index: int, action: str, learner: int | None, end: float | None = None) -> list[dict]:
    out = [ev(t, "fault_start", index=index, action=action, learner=learner, describe=f"{action} {learner}")]
    if end is not None:
        out.append(ev(end, "fault_end", index=index, action=action, learner=learner))
    return out


def chip_error(t: float, learner: int) -> dict[str, Any]:
    return ev(t, "chip_error", proc=f"learner{learner}.chip1", learner=learner, error="CollectiveFailed: reset")


def test_an_error_of_the_killed_learner_within_the_settle_window_is_expected() -> None:
    evs = fault(10.0, 0, "kill_chip", 1, end=12.0) + [chip_error(11.0, 1), chip_error(12.0 + 13.0, 1)]
    out = classify_errors(evs, start=0.0, settle_s=13.0)
    assert [(e.t_s, e.expected, e.cause) for e in out] == [(11.0, True, "fault 0: kill_chip 1"),
                                                         (25.0, True, "fault 0: kill_chip 1")]


def test_an_error_of_another_learner_or_after_the_settle_window_is_unexpected() -> None:
    evs = fault(10.0, 0, "kill_chip", 1, end=12.0) + [chip_error(11.0, 0), chip_error(25.1, 1), chip_error(9.9, 1)]
    out = classify_errors(evs, start=0.0, settle_s=13.0)
    assert [(e.t_s, e.expected) for e in out] == [(9.9, False), (11.0, False), (25.1, False)]
    assert all(e.cause is None for e in out)


def test_a_fault_on_every_learner_explains_any_learners_error_and_a_fault_that_missed_explains_none() -> None:
    evs = fault(10.0, 0, "partition", None) + [chip_error(50.0, 3)]
    assert classify_errors(evs, 0.0, 13.0)[0].expected  # never ended: in effect until the run's end
    missed = [dict(fault(10.0, 0, "kill_learner", 3)[0], missed="learner 3 is down")] + [chip_error(11.0, 3)]
    assert not classify_errors(missed, 0.0, 13.0)[0].expected


def test_a_syncer_error_is_expected_only_around_a_syncer_crash() -> None:
    err = ev(11.0, "syncer_error", proc="syncer", error="OSError")
    assert not classify_errors(fault(10.0, 0, "partition", None) + [err], 0.0, 5.0)[0].expected
    assert classify_errors(fault(10.0, 0, "kill_syncer", None) + [err], 0.0, 5.0)[0].expected
