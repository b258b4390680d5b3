"""Goodput and downtime over hand-built event logs: each figure checked against a hand computation."""

from __future__ import annotations

import pytest

from harness.metrics import downtime, goodput


def steps(m: int, n: int, t0: float = 0.0, chips: int = 1) -> list[dict]:
    return [{"ev": "chip_start", "learner": m, "rank": 0, "t": t0}] + [
        {"ev": "step", "learner": m, "step": s, "t": t0 + s, "chips": chips} for s in range(1, n + 1)]


def test_decoupled_goodput_counts_the_merged_fraction_of_each_step() -> None:
    evs = steps(0, 4) + steps(1, 4) + [
        {"ev": "merge", "t": 4.5, "participants": [0, 1], "step_ranges": [[1, 4], [1, 2]]},  # fragment 0
        {"ev": "merge", "t": 4.6, "participants": [0], "step_ranges": [[1, 4]]},  # fragment 1
    ]
    g = goodput(evs, "decoupled", learners=2, chips=1, fragments=2, sync_every=4)
    # learner 0: 4 steps x 1 s fully merged; learner 1: steps 1-2 in one of two fragments -> 1 chip-s
    assert g["good_chip_s"] == pytest.approx(5.0) and g["allocated_chip_s"] == pytest.approx(8.0)
    assert g["goodput"] == pytest.approx(0.625)
    assert g["per_learner"]["1"] == {"good_chip_s": 1.0, "step_chip_s": 4.0}


def test_ddp_and_diloco_goodput() -> None:
    evs = steps(0, 4, chips=2) + [{"ev": "merge", "t": s + 0.1, "participants": [0], "step": s} for s in (1, 2)]
    g = goodput(evs, "ddp", learners=1, chips=2, fragments=1, sync_every=1)
    assert g["goodput"] == pytest.approx(0.5), "steps 3 and 4 never merged"
    evs = steps(0, 4) + [{"ev": "merge", "t": 2.1, "participants": [0], "round": 1, "step": 2}]
    g = goodput(evs, "diloco", learners=1, chips=1, fragments=1, sync_every=2)
    assert g["goodput"] == pytest.approx(0.5), "round 2 (steps 3-4) was lost"


def test_a_down_learner_is_allocated_but_not_good() -> None:
    evs = steps(0, 4) + [{"ev": "merge", "t": 4.5, "participants": [0], "step_ranges": [[1, 4]]}]
    g = goodput(evs, "decoupled", learners=2, chips=1, fragments=1, sync_every=4)
    assert g["goodput"] == pytest.approx(0.5)


def test_downtime_counts_gaps_beyond_the_window() -> None:
    d = downtime([0.5, 1.0, 4.0], start=0.0, end=5.0, window_s=1.0)
    assert d["intervals"] == [[2.0, 4.0]] and d["downtime_s"] == pytest.approx(2.0)
    assert d["uptime"] == pytest.approx(0.6)
    assert downtime([], 0.0, 0.5)["uptime"] == 1.0
    assert downtime([], 0.0, 3.0)["downtime_s"] == pytest.approx(2.0)
