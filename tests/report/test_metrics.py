"""Goodput and downtime over hand-built event logs: each figure checked against a hand computation."""

from __future__ import annotations

import pytest
from conftest import as_records, complete

from diloco_chaos.harness.report.metrics import (
    STALL_TOLERANCE,
    StepCredit,
    achieved_speeds,
    credit_step,
    downtime,
    goodput,
    learner_availability,
    merge_stats,
    overwritten_in_overlap,
)
from diloco_chaos.harness.report.progress import progress
from diloco_chaos.harness.report.timeline import fault_response


def steps(m: int, n: int, t0: float = 0.0, chips: int = 1, first: int = 1) -> list[dict]:
    """Learner m ready at t0, then steps first..first+n-1 of 1 s each."""
    return [{"ev": "chip_start", "learner": m, "rank": 0, "t": t0}] + [
        {"ev": "step", "learner": m, "step": first + i, "t": t0 + i + 1, "chips": chips} for i in range(n)]


def ddp_merges(learners: list[int], n: int, algorithm_step_t: float = 0.5) -> list[dict]:
    return [{"ev": "merge", "t": s + algorithm_step_t, "participants": learners, "step": s} for s in range(1, n + 1)]


def test_credit_step_counts_jitter_in_full_and_a_stall_only_for_its_healthy_time() -> None:
    assert credit_step(2.9, 1.0, tolerance=3.0) == (2.9, StepCredit.FULL)
    assert credit_step(3.0, 1.0, tolerance=3.0) == (3.0, StepCredit.FULL)
    assert credit_step(7.5, 1.0, tolerance=3.0) == (1.0, StepCredit.STALLED)


def test_fault_free_data_parallel_is_one_whatever_its_exchange_costs() -> None:
    # 2 learners x 2 chips, 10 steps of 1 s each, every step's gradient merged; the step includes its exchange
    evs = steps(0, 10, chips=2) + steps(1, 10, chips=2) + ddp_merges([0, 1], 10)
    for e in evs:
        if e["ev"] == "step":
            e["sync_s"] = 0.4  # 40% of every step waiting on the exchange: routine, not lost
    g = goodput(as_records(evs), "ddp", learners=2, chips=2, fragments=1, sync_every=1)
    assert g.goodput == 1.0 and g.span_s == pytest.approx(10.0) and g.idle_chip_s == pytest.approx(0.0)
    assert g.compute_fraction == pytest.approx(0.6), "the old ratio: compute only, the exchange excluded"
    assert g.per_learner["0"].healthy_step_s == {"inner": 1.0}


def test_one_of_eight_chips_down_two_seconds_of_ten() -> None:
    # 4 learners x 2 chips, decoupled, all merged; learner 1 runs on one chip for steps 4-5 (shrunk, 2 s)
    evs: list[dict] = []
    for m in range(4):
        evs += steps(m, 10, chips=2)
        evs.append({"ev": "merge", "t": 10.5, "participants": [m], "step_ranges": [[1, 10]]})
    for e in evs:
        if e["ev"] == "step" and e["learner"] == 1 and e["step"] in (4, 5):
            e["chips"] = 1
    g = goodput(as_records(evs), "decoupled", learners=4, chips=2, fragments=1, sync_every=8)
    assert g.goodput == pytest.approx(1 - 2 / (8 * 10)) == pytest.approx(0.975)
    assert g.idle_chip_s == pytest.approx(2.0) and g.stalled_chip_s == 0.0 and g.discarded_chip_s == 0.0


def test_a_learner_blocked_on_the_barrier_beyond_its_healthy_step_time_is_stalled() -> None:
    # ddp, 2 learners: learner 1's step 5 takes 6 s (a freeze) and learner 0 waits at the barrier for it;
    # step 8 takes 2.5 s for both (jitter, within STALL_TOLERANCE x the healthy 1 s): counted in full
    evs = steps(0, 10) + steps(1, 10) + ddp_merges([0, 1], 10)
    for e in evs:
        if e["ev"] == "step":
            e["t"] += (5.0 if e["step"] >= 5 else 0.0) + (1.5 if e["step"] >= 8 else 0.0)
    g = goodput(as_records(evs), "ddp", learners=2, chips=1, fragments=1, sync_every=1)
    assert g.span_s == pytest.approx(16.5)
    assert g.good_chip_s == pytest.approx(2 * (8 * 1.0 + 1.0 + 2.5)), "step 5 counts 1 s of its 6, step 8 its 2.5 s"
    assert g.stalled_chip_s == pytest.approx(2 * 5.0)
    assert g.goodput == pytest.approx(23.0 / 33.0, abs=1e-4)
    assert credit_step(6.0, 1.0, STALL_TOLERANCE)[1] is StepCredit.STALLED


def test_discarded_steps_and_restart_time_are_lost() -> None:
    # decoupled, 2 learners. Learner 0: 12 steps, all merged. Learner 1: steps 1-6, of which a merge took in
    # 1-4; it crashes after step 6 (5-6 lost with it), is down until its restart at 8.5, ready (initial pull)
    # at 9.0, and steps 7-9 at 10, 11, 12, merged by the final drain.
    evs = steps(0, 12) + steps(1, 6) + [
        {"ev": "learner_down", "learner": 1, "t": 6.5},
        {"ev": "learner_restart", "learner": 1, "t": 8.5},
        {"ev": "chip_start", "learner": 1, "rank": 0, "t": 8.6},
        {"ev": "initial_pull", "learner": 1, "t": 9.0},
        *({"ev": "step", "learner": 1, "step": s, "t": t, "chips": 1} for s, t in ((7, 10.0), (8, 11.0), (9, 12.0))),
        {"ev": "merge", "t": 4.5, "participants": [0, 1], "step_ranges": [[1, 4], [1, 4]]},
        {"ev": "merge", "t": 12.5, "participants": [0, 1], "step_ranges": [[5, 12], [7, 9]]},
    ]
    g = goodput(as_records(evs), "decoupled", learners=2, chips=1, fragments=1, sync_every=8)
    assert g.per_learner["1"].good_chip_s == pytest.approx(7.0)
    assert g.per_learner["1"].discarded_chip_s == pytest.approx(2.0), "steps 5-6 never reached the model"
    assert g.idle_chip_s == pytest.approx(3.0), "down, repaired and restarting from 6 to 9"
    assert g.goodput == pytest.approx(19.0 / 24.0, abs=1e-4)


def test_a_machine_slowed_for_a_while_sets_the_pace_and_a_lone_spike_is_a_stall() -> None:
    # decoupled, 1 learner, 30 steps of 1 s; steps 10-15 take 4 s each (the machine was busy: its neighbours
    # are as slow, so they are its healthy pace); step 25 alone takes 6 s (blocked: a stall)
    dts = [4.0 if 10 <= s <= 15 else 6.0 if s == 25 else 1.0 for s in range(1, 31)]
    evs = [{"ev": "chip_start", "learner": 0, "rank": 0, "t": 0.0}]
    t = 0.0
    for s, dt in enumerate(dts, start=1):
        t += dt
        evs.append({"ev": "step", "learner": 0, "step": s, "t": t, "chips": 1})
    evs.append({"ev": "merge", "t": t + 0.1, "participants": [0], "step_ranges": [[1, 30]]})
    g = goodput(as_records(evs), "decoupled", learners=1, chips=1, fragments=1, sync_every=8)
    assert g.per_learner["0"].stalls == 1 and g.stalled_chip_s == pytest.approx(5.0)
    assert g.goodput == pytest.approx((t - 5.0) / t, abs=1e-4)


def test_start_up_before_a_learners_first_step_is_left_out() -> None:
    # learner 1 is ready 3 s after learner 0 (processes starting on a busy machine): not a fault, not counted
    evs = steps(0, 10) + steps(1, 7, t0=3.0) + [
        {"ev": "merge", "t": 10.5, "participants": [0, 1], "step_ranges": [[1, 10], [1, 7]]}]
    g = goodput(as_records(evs), "decoupled", learners=2, chips=1, fragments=1, sync_every=8)
    assert g.per_learner["1"].allocated_chip_s == pytest.approx(7.0) and g.goodput == 1.0


def test_a_restarted_learners_start_up_is_lost_and_not_a_stall() -> None:
    # ddp, 1 learner: steps 1-5, then down; its restarted process is ready at 9 and its first step ends at 15
    # (loading, the resume state): the first step counts its healthy time, the 5 s before are not stepping
    evs = steps(0, 5) + [{"ev": "learner_restart", "learner": 0, "t": 8.0},
                         {"ev": "resume", "learner": 0, "step": 5, "t": 9.0}]
    evs += [{"ev": "step", "learner": 0, "step": s, "t": 10.0 + s, "chips": 1} for s in range(5, 11)]
    evs = [e for e in evs if not (e["ev"] == "step" and e["t"] == 15.0 and e["step"] == 5)]
    evs += ddp_merges([0], 10)
    g = goodput(as_records(evs), "ddp", learners=1, chips=1, fragments=1, sync_every=1)
    assert g.span_s == pytest.approx(20.0) and g.stalled_chip_s == 0.0
    assert g.good_chip_s == pytest.approx(10.0) and g.idle_chip_s == pytest.approx(10.0)
    assert g.goodput == pytest.approx(0.5)


def test_diloco_round_exchange_is_routine_and_a_lost_round_is_discarded() -> None:
    # diloco, H = 4: each round's last step takes 4 s (the exchange of every parameter), inner steps 1 s
    evs = [{"ev": "chip_start", "learner": 0, "rank": 0, "t": 0.0}]
    t = 0.0
    for s in range(1, 13):
        t += 4.0 if s % 4 == 0 else 1.0
        evs.append({"ev": "step", "learner": 0, "step": s, "t": t, "chips": 1})
    evs += [{"ev": "merge", "t": 7.0, "participants": [0], "round": 1, "step": 4},
            {"ev": "merge", "t": 14.0, "participants": [0], "round": 2, "step": 8}]
    g = goodput(as_records(evs), "diloco", learners=1, chips=1, fragments=1, sync_every=4)
    assert g.per_learner["0"].healthy_step_s == {"inner": 1.0, "round_end": 4.0}
    assert g.stalled_chip_s == 0.0
    assert g.goodput == pytest.approx(14.0 / 21.0, abs=1e-4), "round 3 (7 s) was never merged"


def test_decoupled_goodput_counts_steps_some_merge_took_in_and_keeps_the_per_fragment_figure() -> None:
    evs = steps(0, 4) + steps(1, 4) + [
        {"ev": "merge", "t": 4.5, "participants": [0, 1], "step_ranges": [[1, 4], [1, 2]]},  # fragment 0
        {"ev": "merge", "t": 4.6, "participants": [0], "step_ranges": [[1, 4]]},  # fragment 1
    ]
    g = goodput(as_records(evs), "decoupled", learners=2, chips=1, fragments=2, sync_every=4)
    # learner 0: 4 steps x 1 s merged; learner 1: steps 1-2 merged (in one fragment), steps 3-4 never
    assert g.good_chip_s == pytest.approx(6.0) and g.allocated_chip_s == pytest.approx(8.0)
    assert g.goodput == pytest.approx(0.75)
    assert (g.per_learner["1"].good_chip_s, g.per_learner["1"].discarded_chip_s) == (2.0, 2.0)
    # per fragment: learner 0 fully (4), learner 1's steps 1-2 in one of two fragments (1): 5 of 8
    assert g.merged_fraction == pytest.approx(0.625)


def test_decoupled_overlap_steps_overwritten_by_the_merged_value_are_useful() -> None:
    # 1 learner, P = 2: fragment 0 merged its steps 1-4 (version 1) and was applied after step 6, so steps 5-6
    # computed while the exchange was in flight and were overwritten on apply: useful by design. Fragment 1
    # merged 1-4 too but its value was never applied, and step 7-8 were never merged: lost.
    evs = steps(0, 8) + [
        {"ev": "merge", "t": 4.5, "fragment": 0, "version": 1, "participants": [0], "step_ranges": [[1, 4]]},
        {"ev": "merge", "t": 4.6, "fragment": 1, "version": 1, "participants": [0], "step_ranges": [[1, 4]]},
        {"ev": "apply", "t": 6.0, "learner": 0, "step": 6, "fragments": [0], "versions": [1]},
    ]
    g = goodput(as_records(evs), "decoupled", learners=1, chips=1, fragments=2, sync_every=4)
    assert overwritten_in_overlap(as_records(evs)) == {0: {5, 6}}
    assert g.good_chip_s == pytest.approx(6.0) and g.discarded_chip_s == pytest.approx(2.0)
    assert g.merged_fraction == pytest.approx(4.0 / 8.0), "the per-fragment figure counts merged ranges only"


def test_a_learner_that_finished_early_idles_and_a_missing_one_is_all_idle() -> None:
    evs = steps(0, 4) + steps(1, 2) + [
        {"ev": "merge", "t": 4.5, "participants": [0, 1], "step_ranges": [[1, 4], [1, 2]]}]
    g = goodput(as_records(evs), "decoupled", learners=3, chips=1, fragments=1, sync_every=4)
    assert g.goodput == pytest.approx(6.0 / 12.0) and g.idle_chip_s == pytest.approx(2.0 + 4.0)


def test_elastic_ddp_is_scored_like_ddp() -> None:
    evs = steps(0, 4, chips=2) + steps(1, 4, chips=2)
    evs += [{"ev": "merge", "t": s + 0.5, "participants": [0, 1] if s < 3 else [0], "step": s} for s in range(1, 5)]
    a = goodput(as_records(evs), "ddp", learners=2, chips=2, fragments=1, sync_every=1)
    b = goodput(as_records(evs), "elastic_ddp", learners=2, chips=2, fragments=1, sync_every=1)
    assert a == b and b.goodput == pytest.approx(0.75), "learner 1's steps 3-4 were left out of their merges"


def test_healthy_step_time_falls_back_to_every_learners_steps_when_a_learner_has_few() -> None:
    evs = steps(0, 10) + steps(1, 3, t0=7.0)
    evs[-1]["t"] += 1.0  # learner 1: intervals 1, 2 after its first step: too few for its own median
    evs += [{"ev": "merge", "t": 11.5, "participants": [0, 1], "step_ranges": [[1, 10], [1, 3]]}]
    g = goodput(as_records(evs), "decoupled", learners=2, chips=1, fragments=1, sync_every=8)
    assert g.per_learner["0"].healthy_step_s == {"inner": 1.0}
    assert g.per_learner["1"].healthy_step_s == {"inner": 1.0}, "the pooled median of 9 x 1 s and 1 s, 2 s"
    assert g.to_dict()["per_learner"]["1"]["good_chip_s"] == pytest.approx(4.0)


def test_no_steps_no_goodput() -> None:
    g = goodput([], "decoupled", learners=2, chips=1, fragments=1, sync_every=8)
    assert g.goodput is None and g.allocated_chip_s == 0.0


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
    recs = as_records(evs)
    st = merge_stats(recs, progress(recs, "decoupled", fragments=2, sync_every=8).advances)
    assert st["quorum_size"] == {"n": 2, "mean": 1.5, "p50": 2.0, "max": 2.0}
    assert st["grace_wait_s"]["max"] == pytest.approx(0.2) and st["quorum_wait_s"]["mean"] == pytest.approx(0.15)
    assert st["staleness_versions"]["max"] == 2.0, "learner 1 pushed against version 0 into version 3"
    assert st["tokens_merged_per_learner"] == {"0": 30.0, "1": 40.0}


def test_learner_availability_from_joins_leaves_and_syncer_outages() -> None:
    evs = [{"ev": "learner_join", "learner": 0, "t": 0.0}, {"ev": "learner_join", "learner": 1, "t": 0.0},
           {"ev": "learner_leave", "learner": 1, "t": 4.0}, {"ev": "learner_join", "learner": 1, "t": 6.0},
           {"ev": "syncer_down", "t": 8.0}, {"ev": "learner_join", "learner": 0, "t": 9.0}]
    assert learner_availability(as_records(evs), 2, 0.0, 10.0) == {"0": 0.9, "1": 0.6}


def test_fault_response_detect_and_rejoin_times() -> None:
    evs = [{"ev": "fault_start", "index": 0, "action": "kill_chip", "learner": 1, "t": 10.0},
           {"ev": "learner_down", "learner": 1, "t": 10.2},
           {"ev": "learner_restart", "learner": 1, "t": 12.2},
           {"ev": "step", "learner": 1, "step": 31, "t": 13.0},
           {"ev": "fault_start", "index": 1, "action": "kill_syncer", "learner": None, "t": 20.0},
           {"ev": "syncer_down", "t": 20.1}, {"ev": "syncer_restore", "t": 21.6}]
    rows = fault_response(as_records(evs))
    assert rows[0]["detect_s"] == pytest.approx(0.2) and rows[0]["rejoin_s"] == pytest.approx(2.8)
    assert rows[1]["reaction"] == "syncer_down" and rows[1]["rejoin_s"] == pytest.approx(1.5)


def test_achieved_speed_is_relative_to_the_unslowed_learners_in_the_common_window() -> None:
    evs = [{"ev": "process_fault", "kind": "slow", "learner": 1, "speed": 0.5, "t": 0.0}]
    evs += [{"ev": "step", "learner": 0, "step": s, "t": s * 0.1} for s in range(1, 101)]
    evs += [{"ev": "step", "learner": 1, "step": s, "t": s * 0.2} for s in range(1, 101)]
    evs += [{"ev": "learner_done", "learner": 0, "t": 10.0}]
    (p,) = achieved_speeds(as_records(evs), 2)
    assert p["achieved"] == pytest.approx(0.5, abs=0.02) and p["window_s"] == pytest.approx(10.0)


def test_fault_response_counts_only_reactions_while_the_fault_is_on_and_the_html_agrees() -> None:
    """A latency fault that ended before its learner finished normally (BYE, then leave) drew no reaction; a
    partition during which the syncer dropped the learner did; a kill is on until its recovery. The HTML
    report's bands read the same figures as report.json's fault_response."""
    from diloco_chaos.harness.report.timeline import fault_bands

    evs = complete([
        {"ev": "run_start", "t": 0.0},
        {"ev": "fault_start", "t": 1.0, "index": 0, "action": "degrade", "learner": 0},
        {"ev": "fault_end", "t": 3.0, "index": 0, "action": "degrade", "learner": 0},
        {"ev": "fault_start", "t": 2.0, "index": 1, "action": "partition", "learner": 1},
        {"ev": "learner_leave", "t": 2.5, "learner": 1},
        {"ev": "learner_join", "t": 4.5, "learner": 1},
        {"ev": "fault_end", "t": 4.0, "index": 1, "action": "partition", "learner": 1},
        {"ev": "fault_start", "t": 5.0, "index": 2, "action": "kill_learner", "learner": 2},
        {"ev": "learner_down", "t": 5.2, "learner": 2},
        {"ev": "learner_restart", "t": 6.0, "learner": 2},
        {"ev": "step", "t": 6.5, "learner": 2, "step": 10},
        {"ev": "learner_bye", "t": 6.6, "learner": 0},
        {"ev": "learner_leave", "t": 6.66, "learner": 0},
        {"ev": "fault_end", "t": 9.0, "index": 2, "action": "kill_learner", "learner": 2},
        {"ev": "run_end", "t": 9.0},
    ])
    resp = {r["index"]: r for r in fault_response(as_records(evs))}
    assert resp[0]["detect_s"] is None and resp[0]["reaction"] is None  # the normal finish is not a reaction
    assert (resp[1]["reaction"], resp[1]["detect_s"], resp[1]["rejoin_s"]) == ("learner_leave", 0.5, 2.0)
    assert (resp[2]["reaction"], resp[2]["detect_s"], resp[2]["rejoin_s"]) == ("learner_down", 0.2, 1.3)
    for band in fault_bands(evs):
        r = resp[band["index"]]
        assert (band["detect_s"], band["rejoin_s"]) == (r["detect_s"], r["rejoin_s"])
