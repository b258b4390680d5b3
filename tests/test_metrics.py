"""Goodput and downtime over hand-built event logs: each figure checked against a hand computation."""

from __future__ import annotations

import pytest

from harness.metrics import (
    STALL_FACTOR,
    achieved_speeds,
    downtime,
    fault_response,
    goodput,
    learner_availability,
    merge_stats,
)


def steps(m: int, n: int, t0: float = 0.0, chips: int = 1) -> list[dict]:
    return [{"ev": "chip_start", "learner": m, "rank": 0, "t": t0}] + [
        {"ev": "step", "learner": m, "step": s, "t": t0 + s, "chips": chips} for s in range(1, n + 1)]


def test_decoupled_goodput_counts_steps_some_merge_took_in_and_keeps_the_per_fragment_figure() -> None:
    evs = steps(0, 4) + steps(1, 4) + [
        {"ev": "merge", "t": 4.5, "participants": [0, 1], "step_ranges": [[1, 4], [1, 2]]},  # fragment 0
        {"ev": "merge", "t": 4.6, "participants": [0], "step_ranges": [[1, 4]]},  # fragment 1
    ]
    g = goodput(evs, "decoupled", learners=2, chips=1, fragments=2, sync_every=4)
    # learner 0: 4 steps x 1 s merged; learner 1: steps 1-2 merged (in one fragment), steps 3-4 never
    assert g["good_chip_s"] == pytest.approx(6.0) and g["allocated_chip_s"] == pytest.approx(8.0)
    assert g["goodput"] == pytest.approx(0.75)
    assert g["per_learner"]["1"] == {"good_chip_s": 2.0, "step_chip_s": 4.0}
    # per fragment: learner 0 fully (4), learner 1's steps 1-2 in one of two fragments (1): 5 of 8
    assert g["merged_fraction"] == pytest.approx(0.625)


def test_time_in_the_link_and_stalls_are_not_good() -> None:
    evs = steps(0, 8) + [{"ev": "merge", "t": 8.5, "participants": [0], "step": s} for s in range(1, 9)]
    evs[2]["sync_s"] = 0.5  # step 2 waited half its second at the barrier
    for e in evs[4:]:  # step 4 ends 20 s late (a frozen process): steps 4..8 shift
        e["t"] += 20.0 if e["ev"] == "step" else 0.0
    g = goodput(evs, "ddp", learners=1, chips=1, fragments=1, sync_every=1)
    # 8 steps of 1 s, step 2 counts 0.5, step 4 (21 s) counts STALL_FACTOR x the median (1 s); span 28 s
    assert g["good_chip_s"] == pytest.approx(6.5 + STALL_FACTOR)
    assert g["goodput"] == pytest.approx((6.5 + STALL_FACTOR) / 28.0, abs=1e-4)


def test_logs_without_sync_s_fall_back_to_compute_s() -> None:
    evs = steps(0, 2) + [{"ev": "merge", "t": 2.5, "participants": [0], "step": s} for s in (1, 2)]
    for e in evs[1:3]:
        e["compute_s"] = 0.25
    assert goodput(evs, "ddp", learners=1, chips=1, fragments=1, sync_every=1)["goodput"] == pytest.approx(0.25)


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


def test_merge_stats_quorum_waits_staleness_and_tokens_per_learner() -> None:
    evs = [{"ev": "merge", "t": 1.0, "version": 3, "participants": [0, 1], "base_versions": [2, 0],
            "c_tokens": [40, 80], "quorum_wait_s": 0.1, "wait_s": 0.3},
           {"ev": "merge", "t": 2.0, "version": 4, "participants": [0], "base_versions": [3],
            "c_tokens": [20], "quorum_wait_s": 0.2, "wait_s": 0.2}]
    st = merge_stats(evs, fragments=2)
    assert st["quorum_size"] == {"n": 2, "mean": 1.5, "p50": 2.0, "max": 2.0}
    assert st["grace_wait_s"]["max"] == pytest.approx(0.2) and st["quorum_wait_s"]["mean"] == pytest.approx(0.15)
    assert st["staleness_versions"]["max"] == 2.0, "learner 1 pushed against version 0 into version 3"
    assert st["tokens_merged_per_learner"] == {"0": 30.0, "1": 40.0}


def test_learner_availability_from_joins_leaves_and_syncer_outages() -> None:
    evs = [{"ev": "learner_join", "learner": 0, "t": 0.0}, {"ev": "learner_join", "learner": 1, "t": 0.0},
           {"ev": "learner_leave", "learner": 1, "t": 4.0}, {"ev": "learner_join", "learner": 1, "t": 6.0},
           {"ev": "syncer_down", "t": 8.0}, {"ev": "learner_join", "learner": 0, "t": 9.0}]
    assert learner_availability(evs, 2, 0.0, 10.0) == {"0": 0.9, "1": 0.6}


def test_fault_response_detect_and_rejoin_times() -> None:
    evs = [{"ev": "fault_start", "index": 0, "action": "kill_chip", "learner": 1, "t": 10.0},
           {"ev": "learner_down", "learner": 1, "t": 10.2},
           {"ev": "learner_restart", "learner": 1, "t": 12.2},
           {"ev": "step", "learner": 1, "step": 31, "t": 13.0},
           {"ev": "fault_start", "index": 1, "action": "kill_syncer", "learner": None, "t": 20.0},
           {"ev": "syncer_down", "t": 20.1}, {"ev": "syncer_restore", "t": 21.6}]
    rows = fault_response(evs)
    assert rows[0]["detect_s"] == pytest.approx(0.2) and rows[0]["rejoin_s"] == pytest.approx(2.8)
    assert rows[1]["reaction"] == "syncer_down" and rows[1]["rejoin_s"] == pytest.approx(1.5)


def test_achieved_speed_is_relative_to_the_unslowed_learners_in_the_common_window() -> None:
    evs = [{"ev": "process_fault", "kind": "slow", "learner": 1, "speed": 0.5, "t": 0.0}]
    evs += [{"ev": "step", "learner": 0, "step": s, "t": s * 0.1} for s in range(1, 101)]
    evs += [{"ev": "step", "learner": 1, "step": s, "t": s * 0.2} for s in range(1, 101)]
    evs += [{"ev": "learner_done", "learner": 0, "t": 10.0}]
    (p,) = achieved_speeds(evs, 2)
    assert p["achieved"] == pytest.approx(0.5, abs=0.02) and p["window_s"] == pytest.approx(10.0)
