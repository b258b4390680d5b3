"""Errors labelled by the fault that explains them: target, time window, settle window, syncer crashes."""

from __future__ import annotations

from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import ChipError
from diloco_chaos.harness.record.run import FaultEnd, FaultStart
from diloco_chaos.harness.record.syncer import SyncerError
from diloco_chaos.harness.report.errors import classify_errors


def base(t: float, kind: str, proc: str = "supervisor") -> dict:
    return {"t": t, "wall": 1e9 + t, "pid": 1, "proc": proc, "ev": kind}


def fault(t: float, index: int, action: str, learner: int | None, end: float | None = None,
          missed: str | None = None, applied_from_t: float | None = None) -> list[Event]:
    what = {"index": index, "action": action, "learner": learner, "describe": f"{action} {learner}",
            "reason": "test", "elapsed_s": t, "progress": {}}
    out: list[Event] = [FaultStart(**base(t, "fault_start"), **what, missed=missed, applied_from_t=applied_from_t)]
    if end is not None:
        out.append(FaultEnd(**base(end, "fault_end"), **what))
    return out


def chip_error(t: float, learner: int) -> ChipError:
    return ChipError(**base(t, "chip_error", f"learner{learner}.chip1"), learner=learner, rank=1,
                     error="CollectiveFailed: reset")


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
    missed = fault(10.0, 0, "kill_learner", 3, missed="learner 3 is down") + [chip_error(11.0, 3)]
    assert not classify_errors(missed, 0.0, 13.0)[0].expected


def test_a_syncer_error_is_expected_only_around_a_syncer_crash() -> None:
    err = SyncerError(**base(11.0, "syncer_error", "syncer"), error="OSError")
    assert not classify_errors(fault(10.0, 0, "partition", None) + [err], 0.0, 5.0)[0].expected
    assert classify_errors(fault(10.0, 0, "kill_syncer", None) + [err], 0.0, 5.0)[0].expected


def test_an_error_between_applying_a_fault_and_logging_it_is_the_faults() -> None:
    """A kill through a host agent: the peer's collective fails before the agent's reply lets the fault be logged."""
    evs = fault(10.0, 0, "kill_chip", 1, end=12.0, applied_from_t=9.98) + [chip_error(9.99, 1), chip_error(9.97, 1)]
    out = classify_errors(evs, start=0.0, settle_s=13.0)
    assert [(e.t_s, e.expected) for e in out] == [(9.97, False), (9.99, True)]
