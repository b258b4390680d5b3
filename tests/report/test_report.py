"""Tests for diloco_chaos.harness.report.run_report (longest_gap, build_report) and diloco_chaos.harness.record.events
(EventLog, read_events, EventTail)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import as_records, complete

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record import parse
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog, EventTail, read_events
from diloco_chaos.harness.record.learner import LinkUp, Resume, Step
from diloco_chaos.harness.record.syncer import Merge
from diloco_chaos.harness.report.run_report import build_report, longest_gap
from diloco_chaos.harness.run.rundir import CONFIG_FILE, write_json

# -- longest_gap --------------------------------------------------------------------------------


def test_longest_gap_between_merges() -> None:
    assert longest_gap([2.0, 3.0, 7.0], 0.0, 8.0) == pytest.approx(4.0)


def test_longest_gap_at_the_start_and_end_edges() -> None:
    assert longest_gap([6.0, 7.0], 0.0, 8.0) == pytest.approx(6.0)  # nothing merged until 6
    assert longest_gap([1.0, 2.0], 0.0, 10.0) == pytest.approx(8.0)  # nothing merged after 2


def test_longest_gap_unsorted_and_outside_window() -> None:
    assert longest_gap([5.0, 1.0, -3.0, 50.0], 0.0, 6.0) == pytest.approx(4.0)


def test_longest_gap_without_merges_is_the_whole_window() -> None:
    assert longest_gap([], 2.0, 9.5) == pytest.approx(7.5)
    assert longest_gap([], 3.0, 3.0) == 0.0


# -- build_report on a hand-written run directory ------------------------------------------------


def ev(t: float, name: str, /, proc: str = "syncer", pid: int = 100, **fields: Any) -> dict[str, Any]:
    """An event as written, its record's required fields the test leaves out filled (conftest.complete)."""
    return complete([{"t": t, "wall": 1_700_000_000.0 + t, "pid": pid, "proc": proc, "ev": name, **fields}])[0]


def write_run(run_dir: Path, events: list[dict[str, Any]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / CONFIG_FILE, Scenario().to_dict())
    with open(run_dir / EVENTS_FILE, "w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")


def sample_events() -> list[dict[str, Any]]:
    evs = [
        ev(100.0, "run_start", proc="supervisor", pid=1),
        ev(100.5, "chip_start", proc="learner0.chip0", pid=201),
        ev(100.6, "chip_start", proc="learner1.chip0", pid=202),
        ev(100.7, "gloo_group", proc="learner0.chip0", pid=201, group="learner0"),
        ev(100.8, "gloo_group", proc="learner1.chip0", pid=202, group="learner1"),
        ev(100.9, "eval", kind="periodic", version=0, tokens_merged=0.0, loss=5.5451234),
    ]
    # learner 0: steps 1..5 at t = 101..105; learner 1: steps 1..3 at t = 101.5, 103.5, 105.5
    for s in range(1, 6):
        evs.append(ev(100.0 + s, "step", proc="learner0.chip0", pid=201, learner=0, step=s, loss=5.0, tokens=32))
    for i, s in enumerate(range(1, 4)):
        evs.append(ev(101.5 + 2 * i, "step", proc="learner1.chip0", pid=202, learner=1, step=s, loss=5.0,
                      tokens=48))
    evs += [
        ev(102.0, "merge", fragment=1, version=1, tokens_merged=12.0),
        ev(102.5, "merge", fragment=2, version=1, tokens_merged=20.0),
        ev(104.0, "eval", kind="periodic", version=2, tokens_merged=20.0, loss=4.1234567),
        ev(105.2, "merge", fragment=3, version=1, tokens_merged=31.25),
        ev(105.3, "push", learner=0, fragment=3),
        ev(105.4, "push_rejected", learner=1, fragment=3),
        ev(106.0, "eval", kind="final", version=3, tokens_merged=31.25, loss=3.9876543, finite=True),
        ev(107.0, "run_end", proc="supervisor", pid=1),
    ]
    return sorted(evs, key=lambda e: e["t"])


def test_build_report_on_handmade_run(tmp_path: Path) -> None:
    write_run(tmp_path / "run", sample_events())
    r = build_report(tmp_path / "run")
    sc = Scenario()
    assert (r["name"], r["algorithm"], r["seed"]) == (sc.name, sc.algorithm, sc.seed)
    assert r["learners"] == sc.topology.learners and r["chips_per_learner"] == sc.topology.chips_per_learner
    assert r["wall_s"] == pytest.approx(7.0)
    assert r["train_s"] == pytest.approx(105.5 - 101.0)
    assert r["chip_pids"] == [201, 202]
    assert r["gloo_groups"] == ["learner0", "learner1"]
    assert r["per_learner"] == {
        "0": {"steps": 5, "tokens": 160, "steps_per_s": 1.0, "link": {}},
        "1": {"steps": 3, "tokens": 144, "steps_per_s": 0.5, "link": {}},
    }
    assert r["tokens_trained"] == 304
    assert r["merge_count"] == 3
    assert r["tokens_merged"] == pytest.approx(31.2, abs=0.051)
    assert r["pushes"] == 1 and r["pushes_rejected"] == 1
    # merges at 102, 102.5, 105.2 within [101, 105.5]: gaps 1.0, 0.5, 2.7, 0.3
    assert r["longest_gap_s"] == pytest.approx(2.7)
    assert r["initial_eval_loss"] == pytest.approx(5.54512)
    assert r["final_eval_loss"] == pytest.approx(3.98765)
    assert r["global_model_finite"] is True
    assert r["eval_curve"] == [
        {"t": 0.9, "version": 0, "tokens_merged": 0.0, "loss": 5.54512},
        {"t": 4.0, "version": 2, "tokens_merged": 20.0, "loss": 4.12346},
    ]
    assert r["errors"] == []


def test_build_report_without_merges_or_evals(tmp_path: Path) -> None:
    evs = [ev(10.0, "run_start")]
    evs += [ev(10.0 + s, "step", proc="learner0.chip0", learner=0, step=s, tokens=8) for s in (1, 2, 3)]
    evs += [ev(14.0, "chip_error", proc="learner0.chip0", learner=0, rank=0, error="boom"), ev(15.0, "run_end")]
    write_run(tmp_path / "run", evs)
    r = build_report(tmp_path / "run")
    assert r["merge_count"] == 0 and r["tokens_merged"] == 0
    assert r["longest_gap_s"] == pytest.approx(2.0)  # first step 11 to last step 13, nothing merged
    assert r["initial_eval_loss"] is None and r["final_eval_loss"] is None and r["global_model_finite"] is None
    assert r["per_learner"] == {"0": {"steps": 3, "tokens": 24, "steps_per_s": 1.0, "link": {}}}
    assert r["errors"] == [{"proc": "learner0.chip0", "ev": "chip_error", "error": "boom", "t_s": 4.0,
                            "expected": False, "cause": None}]
    assert r["unexpected_errors"] == 1  # no fault was injected: nothing explains it


# -- the event log ------------------------------------------------------------------------------


def test_two_event_logs_on_one_file_all_parse(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    a, b = EventLog(path, "learner0.chip0"), EventLog(path, "syncer")
    try:
        for i in range(50):
            a.write(Step(learner=0, step=i, loss=1.0, tokens=8, chips=1, compute_s=0.1, sync_s=0.0))
            b.write(_merge(i))
    finally:
        a.close()
        b.close()
    evs = read_events(path)
    assert len(evs) == 100
    assert len(path.read_bytes().splitlines()) == 100
    assert [e["step"] for e in evs if e["proc"] == "learner0.chip0"] == list(range(50))
    assert [e["tokens_merged"] for e in evs if e["proc"] == "syncer"] == [float(i) for i in range(50)]
    # a tuple as a list; an optional field left unset is left out, and reads back as its default
    assert evs[1]["step_ranges"] == [[1, 2]] and "digest" not in evs[1]
    assert parse(evs[1]).digest is None
    assert all({"t", "wall", "pid", "proc", "ev"} <= set(e) for e in evs)
    a.write(Resume(learner=0, step=1))  # a closed log writes nothing
    assert len(read_events(path)) == 100


def _merge(i: int) -> Merge:
    ranges: list[Any] = [(1, 2)]  # the writer's JSON turns a tuple into a list
    return Merge(fragment=i % 4, version=i, merges=i, participants=[0], tokens=8.0, c_tokens=[8.0],
                 tokens_merged=float(i), round=i, step_ranges=ranges)


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    log = EventLog(path, "p")
    log.write(Resume(learner=0, step=1))
    log.write(LinkUp(learner=0, connects=1))
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"t": 3.0, "ev": "thr')
    assert [e["ev"] for e in read_events(path)] == ["resume", "link_up"]


def test_garbled_complete_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    path.write_bytes(b'{"ev": "a"}\nnot json\n{"ev": "b"}\n')
    assert [e["ev"] for e in read_events(path)] == ["a", "b"]


def test_event_tail_returns_only_new_lines(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    tail = EventTail(path)
    assert tail.poll() == []  # no file yet
    log = EventLog(path, "p")
    log.write(Resume(learner=0, step=1))
    log.write(Resume(learner=0, step=2))
    assert [e["step"] for e in tail.poll()] == [1, 2]
    assert tail.poll() == []
    log.write(LinkUp(learner=0, connects=1))
    assert [e["ev"] for e in tail.poll()] == ["link_up"]
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"ev": "d", "x"')
    assert tail.poll() == []  # a partial line waits for its newline
    with open(path, "ab") as f:
        f.write(b': 1}\n{"ev": "e"}\n')
    assert [(e["ev"], e.get("x")) for e in tail.poll()] == [("d", 1), ("e", None)]
    assert tail.poll() == []


def test_link_figures_measure_late_bytes_and_round_trips() -> None:
    from diloco_chaos.harness.report.run_report import fault_rows, link_figures

    evs = [
        {"ev": "link_up", "learner": 1, "t": 0.0}, {"ev": "link_down", "learner": 1, "t": 1.0},
        {"ev": "link_up", "learner": 1, "t": 2.0},
        # two connections of learner 1: 300 KB arrived after their headers, over 1.5 s in all
        {"ev": "link_stats", "learner": 1, "t": 1.0, "data_bytes": 120_000, "data_late_bytes": 100_000,
         "data_rx_s": 0.5, "data_frames": 2},
        {"ev": "link_stats", "learner": 1, "t": 3.0, "data_bytes": 250_000, "data_late_bytes": 200_000,
         "data_rx_s": 1.0, "data_frames": 3},
        # learner 0: frames arrived whole, nothing to time
        {"ev": "link_stats", "learner": 0, "t": 3.0, "data_bytes": 9_000, "data_late_bytes": 0,
         "data_rx_s": 0.0, "data_frames": 3},
        *({"ev": "rtt", "learner": 0, "ms": ms} for ms in (3.0, 1.0, 9.0)),
        {"ev": "fault_start", "index": 0, "t": 11.0, "describe": "partition(learner 1)", "reason": "r1",
         "progress": {"merges": 3}},
        {"ev": "fault_end", "index": 0, "t": 12.5, "describe": "partition(learner 1)", "reason": "r2",
         "progress": {"merges": 9}},
    ]
    recs = as_records(evs)
    figs = link_figures(recs)
    assert figs[1]["push_KBps"] == 200.0 and figs[1]["push_bytes"] == 370_000 and figs[1]["push_frames"] == 5
    assert figs[1]["reconnects"] == 1 and figs[1]["link_downs"] == 1
    assert figs[0]["push_KBps"] is None and figs[0]["push_bytes"] == 9_000
    assert (figs[0]["rtt_ms_median"], figs[0]["rtt_ms_min"], figs[0]["rtt_samples"]) == (3.0, 1.0, 3)
    (f,) = fault_rows(recs, start=10.0)
    assert (f["start_s"], f["end_s"], f["start_reason"], f["end_reason"]) == (1.0, 2.5, "r1", "r2")
