"""Run invariants over hand-built run directories: for each invariant a log where it holds and one where it fails,
so none of them can pass vacuously; every failure message must name the invariant, the figure and the bound."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import complete

from diloco_chaos.harness.invariants import (
    InvariantResult,
    InvariantViolation,
    alive_intervals,
    availability,
    check_all,
    converged,
    faults_fired,
    load_run,
    model_finite,
    no_global_downtime,
    rejoined,
    token_accounting,
    updates_accounted,
)
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, CONFIG_FILE, REPORT_FILE

P = 2
"""Fragments in the hand-built decoupled runs."""
TOK = 100
"""Tokens per inner step."""


def ev(name: str, t: float, proc: str = "syncer", /, **fields: Any) -> dict[str, Any]:
    """One event as EventLog writes it (`kind` is a field of several events, so the event's own is positional)."""
    return {"t": t, "wall": 1.8e9 + t, "pid": 1, "proc": proc, "ev": name, **fields}


def config(algorithm: str = "decoupled", learners: int = 2, faults: list[dict[str, Any]] | None = None,
           min_quorum: int = 1) -> dict[str, Any]:
    return {"algorithm": algorithm, "topology": {"learners": learners, "chips_per_learner": 1},
            "diloco": {"fragments": P, "min_quorum": min_quorum, "sync_every": 4},
            "recovery": {"repair_s": 1.0}, "faults": faults or []}


def write_run(root: Path, events: list[dict[str, Any]], cfg: dict[str, Any] | None = None,
              report: dict[str, Any] | None = None, params: dict[str, torch.Tensor] | None = None,
              name: str = "run") -> Path:
    """A run directory as the supervisor leaves it: events.jsonl (in the given order), config.json, report.json
    and, with `params`, global.pt. Each event's required fields the test leaves out are filled with placeholders
    (conftest.complete), so that it parses into its record."""
    d = root / name
    d.mkdir()
    (d / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    (d / CONFIG_FILE).write_text(json.dumps(cfg if cfg is not None else config()))
    if report is not None:
        (d / REPORT_FILE).write_text(json.dumps(report))
    if params is not None:
        torch.save({"params": params, "merges": 0, "tokens_merged": 0.0}, d / CHECKPOINT_FILE)
    return d


def step_t(m: int, s: int, pause_after: int | None = None, pause_s: float = 0.0) -> float:
    return 1.0 + 0.25 * s + 0.01 * m + (pause_s if pause_after is not None and s > pause_after else 0.0)


def decoupled_log(learners: int = 2, steps: int = 8, pause_after: int | None = None, pause_s: float = 0.0,
                  final_loss: float = 2.5) -> list[dict[str, Any]]:
    """A healthy Decoupled DiLoCo run: every learner steps 1..8 (TOK tokens each); fragment 1 is pulled at steps
    2 and 6, fragment 0 at 4 and 8; every learner answers every pull and each round merges; fragment 1's steps
    7-8 arrive as a final unsolicited push (logged with round None) merged by the drain. With `pause_after`,
    steps after that one (and the merges they feed) come `pause_s` later."""
    def at(m: int, s: int) -> float:
        return step_t(m, s, pause_after, pause_s)

    evs = [ev("run_start", 0.0, "supervisor", algorithm="decoupled", learners=learners, chips_per_learner=1, seed=0),
           ev("syncer_start", 0.1, port=1, algorithm="decoupled", fragments=P),
           ev("eval", 0.2, kind="periodic", version=0, tokens_merged=0, loss=5.5)]
    for m in range(learners):
        evs.append(ev("learner_join", 0.5 + 0.1 * m, learner=m, peer="x", alive=list(range(m + 1))))
        evs += [ev("step", at(m, s), f"learner{m}.chip0", learner=m, step=s, loss=3.0, tokens=TOK, chips=1)
                for s in range(1, steps + 1)]
    last = {(m, p): 0 for m in range(learners) for p in range(P)}
    version, rnd, total = [0] * P, [0] * P, 0.0

    def merge(t: float, p: int, round_id: int, ranges: list[tuple[int, int]], base: int) -> None:
        nonlocal total
        c = [TOK * (b - a + 1) for a, b in ranges]
        total += sum(c) / P
        version[p] += 1
        evs.append(ev("merge", t, fragment=p, version=version[p], merges=sum(version), round=round_id,
                      participants=list(range(learners)), c_steps=[b - a + 1 for a, b in ranges], c_tokens=c,
                      step_ranges=[list(r) for r in ranges], base_versions=[base] * learners, reason="all reported",
                      tokens=sum(c) / P, tokens_merged=total))

    for s in (2, 4, 6, 8):
        p = (s // 2) % 2
        rnd[p] += 1
        t = at(learners - 1, s) + 0.02
        evs.append(ev("pull", t, fragment=p, round=rnd[p], learners=list(range(learners)), clock=s))
        ranges = []
        for m in range(learners):
            a = last[(m, p)] + 1
            ranges.append((a, s))
            evs.append(ev("push", t + 0.002 * (m + 1), learner=m, fragment=p, round=rnd[p], c_steps=s - a + 1,
                          c_tokens=TOK * (s - a + 1), first_step=a, last_step=s, base_version=version[p],
                          outcome="accepted", final=False))
            last[(m, p)] = s
        merge(t + 0.02, p, rnd[p], ranges, version[p])
    t_end = at(learners - 1, steps) + 0.1
    for m in range(learners):  # fragment 1's last two steps: the final push, merged by the drain
        evs.append(ev("push", t_end + 0.002 * m, learner=m, fragment=1, round=None, c_steps=2, c_tokens=2 * TOK,
                      first_step=7, last_step=8, base_version=version[1], outcome="accepted", final=True))
    for m in range(learners):
        evs.append(ev("learner_bye", t_end + 0.01 + 0.01 * m, learner=m))
        evs.append(ev("learner_leave", t_end + 0.015 + 0.01 * m, learner=m, alive=list(range(m + 1, learners))))
    rnd[1] += 1
    merge(t_end + 0.05, 1, rnd[1], [(7, 8)] * learners, version[1])
    evs += [ev("syncer_done", t_end + 0.1, merges=sum(version), tokens_merged=total, frames_rejected=0),
            ev("run_end", t_end + 0.2, "supervisor", wall_s=t_end + 0.2),
            ev("eval", t_end + 0.3, "supervisor", kind="final", loss=final_loss, version=sum(version),
               tokens_merged=total, finite=True)]
    return evs


def violated(res: InvariantResult, *parts: str) -> str:
    """The result failed, and check() raises an AssertionError naming the invariant and showing `parts`
    (the figure and the bound)."""
    assert not res.ok, res
    with pytest.raises(InvariantViolation) as err:
        res.check()
    assert isinstance(err.value, AssertionError) and err.value.result is res
    msg = str(err.value)
    assert msg.startswith(f"invariant {res.name} violated: "), msg
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"
    return msg


def holds(res: InvariantResult) -> InvariantResult:
    assert res.ok, res.message()
    assert res.check() is res
    return res


# -- the record ----------------------------------------------------------------------------------------------

def test_load_run_sorts_events_by_time_and_reads_config_and_report(tmp_path: Path) -> None:
    evs = decoupled_log()
    d = write_run(tmp_path, complete(list(reversed(evs))), report={"final_eval_loss": 2.5})
    r = load_run(d)
    assert [e.t for e in r.all_records] == sorted(e["t"] for e in evs)
    assert r.algorithm == "decoupled" and r.fragments == P and r.min_quorum == 1
    assert r.report == {"final_eval_loss": 2.5} and r.run_dir == d
    assert r.train_span() == (step_t(0, 1), step_t(1, 8))


def test_result_str_and_message(tmp_path: Path) -> None:
    res = InvariantResult("x", True, 0.5, 1.0, "why", "gap", "s")
    assert str(res) == "x: ok (gap 0.5 s, bound <= 1)"
    assert res.message() == "invariant x holds: gap 0.5 s <= bound 1 s (why)"
    bad = InvariantResult("x", False, 2.0, 1.0, "", "uptime", "", ">=")
    assert "VIOLATED" in str(bad)
    assert violated(bad) == "invariant x violated: uptime 2 < bound 1"
    again = pickle.loads(pickle.dumps(InvariantViolation(bad)))  # e.g. raised in a worker process
    assert again.result == bad and str(again) == bad.message()


# -- converged -----------------------------------------------------------------------------------------------

def test_converged_within_tolerance_of_a_baseline_run_or_below_a_bound(tmp_path: Path) -> None:
    run = write_run(tmp_path, decoupled_log(final_loss=2.5), name="run")
    base = write_run(tmp_path, decoupled_log(final_loss=2.3), name="base")
    holds(converged(run, baseline_loss=base, tolerance=0.3))
    holds(converged(run, baseline_loss=2.6, tolerance=0.0))  # better than the baseline is fine
    holds(converged(run, max_loss=3.0))
    violated(converged(run, baseline_loss=base, tolerance=0.1), "final eval loss 2.5 nats > bound 2.4 nats",
             "baseline 2.3 + tolerance 0.1")
    violated(converged(run, max_loss=2.0), "final eval loss 2.5 nats > bound 2 nats")
    violated(converged(run, baseline_loss=2.3, tolerance=0.5, max_loss=2.4), "2.5", "bound 2.4")


def test_converged_fails_without_a_final_eval_or_with_a_nan_loss(tmp_path: Path) -> None:
    evs = [e for e in decoupled_log() if e.get("kind") != "final"]
    violated(converged(write_run(tmp_path, evs, name="a"), max_loss=10.0), "n/a", "bound 10",
             "no final eval loss")
    violated(converged(write_run(tmp_path, decoupled_log(final_loss=math.nan), name="b"), max_loss=10.0),
             "nan nats > bound 10")
    with pytest.raises(ValueError):
        converged(write_run(tmp_path, evs, name="c"))


# -- no_global_downtime ---------------------------------------------------------------------------------------

def test_no_global_downtime_holds_when_merges_keep_coming(tmp_path: Path) -> None:
    res = holds(no_global_downtime(write_run(tmp_path, complete(decoupled_log())), bound_s=1.0))
    assert 0.4 < res.figure < 0.6, res


def test_no_global_downtime_fails_on_a_gap_while_learners_are_alive(tmp_path: Path) -> None:
    run = write_run(tmp_path, complete(decoupled_log(pause_after=4, pause_s=2.0)))
    res = no_global_downtime(run, bound_s=1.0)
    violated(res, "longest gap with >= 1 learners alive 2.5 s > bound 1 s", "interval 2.05")
    assert res.figure == pytest.approx(2.5, abs=0.01)


def test_no_global_downtime_reads_runs_written_before_alive(tmp_path: Path) -> None:
    """A run directory written before learner_join / learner_leave carried `alive` still loads (alive None) and
    gives the same intervals and verdict: the alive set then follows the joins and leaves themselves."""
    from diloco_chaos.harness.record.syncer import LearnerJoin, LearnerLeave
    evs = decoupled_log(pause_after=4, pause_s=2.0)
    old = [{k: v for k, v in e.items() if k != "alive" or e["ev"] not in ("learner_join", "learner_leave")}
           for e in evs]
    new_run, old_run = write_run(tmp_path, complete(evs), name="new"), write_run(tmp_path, complete(old), name="old")
    records = load_run(old_run).all_records
    assert [e.alive for e in records if isinstance(e, LearnerJoin | LearnerLeave)] == [None] * 4
    assert alive_intervals(load_run(old_run), 2) == alive_intervals(load_run(new_run), 2) != []
    assert no_global_downtime(old_run, bound_s=1.0) == no_global_downtime(new_run, bound_s=1.0)


def test_no_global_downtime_ignores_gaps_with_fewer_than_k_alive(tmp_path: Path) -> None:
    evs = decoupled_log(pause_after=4, pause_s=2.0)
    t4, t5 = step_t(1, 4) + 0.1, step_t(1, 5, 4, 2.0) - 0.1  # learner 1 is away for the pause
    evs += [ev("learner_leave", t4, learner=1, alive=[0]), ev("learner_join", t5, learner=1, alive=[0, 1])]
    run = write_run(tmp_path, complete(evs))
    bye = step_t(1, 8, 4, 2.0) + 0.11  # learner 0 said BYE: one left
    assert alive_intervals(load_run(run), 2) == [(0.6, t4), (t5, pytest.approx(bye))]
    holds(no_global_downtime(run, bound_s=1.0, min_alive=2))
    violated(no_global_downtime(run, bound_s=1.0), "with >= 1 learners alive 2.5 s > bound 1 s")


def test_no_global_downtime_does_not_count_a_syncer_outage(tmp_path: Path) -> None:
    evs = decoupled_log(pause_after=4, pause_s=2.0)
    t4, t5 = step_t(1, 4) + 0.1, step_t(1, 5, 4, 2.0) - 0.3
    evs += [ev("process_fault", t4, "supervisor", kind="kill_syncer", learner=None, pids=[2], signal="SIGKILL"),
            ev("syncer_down", t4 + 0.2, "supervisor", exitcode=-9, repair_s=1.0),
            ev("syncer_start", t5, port=1, algorithm="decoupled", fragments=P),
            ev("learner_join", t5 + 0.01, learner=0, alive=[0]), ev("learner_join", t5 + 0.02, learner=1, alive=[0, 1])]
    holds(no_global_downtime(write_run(tmp_path, complete(evs)), bound_s=1.0))


def test_no_global_downtime_is_not_vacuous(tmp_path: Path) -> None:
    no_steps = [e for e in decoupled_log() if e["ev"] != "step"]
    violated(no_global_downtime(write_run(tmp_path, complete(no_steps), name="a"), bound_s=1.0), "n/a s > bound 1 s",
             "no inner step")
    violated(no_global_downtime(write_run(tmp_path, complete(decoupled_log()), name="b"), bound_s=1.0, min_alive=3),
             "never >= 3 learners alive")


# -- availability ---------------------------------------------------------------------------------------------

def test_availability(tmp_path: Path) -> None:
    holds(availability(write_run(tmp_path, complete(decoupled_log()), name="a"), min_uptime=0.99))
    run = write_run(tmp_path, complete(decoupled_log(pause_after=4, pause_s=2.0)), name="b")
    res = availability(run, min_uptime=0.9)
    # one 2.5 s gap in a 3.76 s span, counted beyond its first 1 s: uptime 1 - 1.5 / 3.76
    assert res.figure == pytest.approx(1 - 1.5 / 3.76, abs=1e-3)
    violated(res, f"uptime {res.figure} < bound 0.9", "downtime 1.5 s")
    violated(availability(write_run(tmp_path, complete([e for e in decoupled_log() if e["ev"] != "step"]), name="c"),
                          min_uptime=0.5), "n/a < bound 0.5")


# -- faults_fired ---------------------------------------------------------------------------------------------

FAULTS = [{"action": "kill_learner", "learner": 1, "at": {"step": 3, "learner": 0}},
          {"action": "partition", "learner": 0, "at": {"time_s": 1.0}}]


def fault_start(i: int, t: float, **extra: Any) -> dict[str, Any]:
    return ev("fault_start", t, "supervisor", index=i, action=FAULTS[i]["action"], learner=FAULTS[i]["learner"],
              describe=f"{FAULTS[i]['action']}(learner {FAULTS[i]['learner']})", reason="trigger", elapsed_s=t,
              progress={}, **extra)


def test_faults_fired(tmp_path: Path) -> None:
    both = decoupled_log() + [fault_start(0, 1.8), fault_start(1, 1.9)]
    holds(faults_fired(write_run(tmp_path, both, config(faults=FAULTS), name="a")))
    one = decoupled_log() + [fault_start(0, 1.8)]
    violated(faults_fired(write_run(tmp_path, one, config(faults=FAULTS), name="b")),
             "faults fired 1 < bound 2", "never fired: faults[1] partition(learner 0)")
    missed = decoupled_log() + [fault_start(0, 1.8, missed="learner 1 has no live chip process"), fault_start(1, 1.9)]
    run = write_run(tmp_path, missed, config(faults=FAULTS), name="c")
    violated(faults_fired(run), "faults fired 1 < bound 2", "hit nothing: faults[0]")
    holds(faults_fired(run, allow_missed=True))


# -- rejoined -------------------------------------------------------------------------------------------------

def outage(back_step_t: float | None, join: bool = True) -> list[dict[str, Any]]:
    """Learner 1 fails at 2.0 s (repair 1 s), is restarted at 3.0 s, and (with `back_step_t`) steps again then."""
    evs = [ev("run_start", 0.0, "supervisor"), ev("learner_join", 0.5, learner=1, alive=[0, 1]),
           ev("step", 1.0, "learner1.chip0", learner=1, step=1, tokens=TOK),
           ev("learner_down", 2.0, "supervisor", learner=1, exitcodes={"learner1.chip0": -9}, step=1, repair_s=1.0),
           ev("learner_restart", 3.0, "supervisor", learner=1, generation=1, start_step=1, restarts=1)]
    if join:
        evs.append(ev("learner_join", 3.2, learner=1, alive=[0, 1]))
    if back_step_t is not None:
        evs.append(ev("step", back_step_t, "learner1.chip0", learner=1, step=2, tokens=TOK))
    return evs


def test_rejoined(tmp_path: Path) -> None:
    res = holds(rejoined(write_run(tmp_path, complete(outage(3.5)), name="a"), within_s=2.0))
    assert res.figure == pytest.approx(0.5)
    holds(rejoined(write_run(tmp_path, complete(decoupled_log()), name="b"), within_s=0.0))  # nobody failed
    violated(rejoined(write_run(tmp_path, complete(outage(6.25)), name="c"), within_s=2.0),
             "longest rejoin delay 3.25 s > bound 2 s", "learner 1 down at 2.000 s")
    violated(rejoined(write_run(tmp_path, complete(outage(None)), name="d"), within_s=2.0), "inf s > bound 2 s",
             "never back")
    violated(rejoined(write_run(tmp_path, complete(outage(3.5, join=False)), name="e"), within_s=2.0),
             "inf s > bound 2 s")
    again = outage(None) + [ev("learner_down", 3.4, "supervisor", learner=1, step=1, repair_s=1.0),
                            ev("step", 3.6, "learner1.chip0", learner=1, step=2, tokens=TOK)]
    violated(rejoined(write_run(tmp_path, complete(again), name="f"), within_s=2.0), "inf s > bound 2 s")


def test_rejoined_does_not_wait_for_a_learner_whose_repair_was_skipped(tmp_path: Path) -> None:
    """The torchft supervisor does not restart a group whose repair comes when no other group is left to heal it
    (`chip_repair_skipped`): that failure is not expected back; a skipped repair of another failure still is."""
    down = [ev("run_start", 0.0, "supervisor"),
            ev("learner_down", 2.0, "supervisor", learner=1, exitcodes={"learner1.chip0": -9}, step=1, repair_s=1.0),
            ev("chip_repair_skipped", 3.0, "supervisor", learner=1, chip=0, step=1, reason="no live peer")]
    res = holds(rejoined(write_run(tmp_path, complete(down), name="a"), within_s=2.0))
    assert "each repair skipped" in res.detail
    both = outage(3.5) + down[1:]  # learner 1 back at 3.5 s after its first failure; its second one skipped
    both[-2]["t"], both[-1]["t"] = 4.0, 5.0
    res = holds(rejoined(write_run(tmp_path, complete(both), name="b"), within_s=2.0))
    assert res.figure == pytest.approx(0.5) and "1 not restarted: chip_repair_skipped" in res.detail
    skipped_elsewhere = outage(None) + [ev("chip_repair_skipped", 3.5, "supervisor", learner=0, chip=0, step=1,
                                           reason="no live peer")]
    violated(rejoined(write_run(tmp_path, complete(skipped_elsewhere), name="c"), within_s=2.0), "never back")


# -- updates_accounted ----------------------------------------------------------------------------------------

def push(t: float, m: int, p: int, a: int, b: int, outcome: str = "accepted", round_id: int | None = 9,
         **extra: Any) -> dict[str, Any]:
    return ev("push", t, learner=m, fragment=p, round=round_id, c_steps=b - a + 1, c_tokens=TOK * (b - a + 1),
              first_step=a, last_step=b, base_version=0, outcome=outcome, final=round_id is None, **extra)


def test_updates_accounted_holds_on_a_healthy_run(tmp_path: Path) -> None:
    res = holds(updates_accounted(write_run(tmp_path, complete(decoupled_log()))))
    assert res.figure == 0 and "10 pushes, 10 merged contributions" in res.detail


def test_updates_accounted_finds_a_lost_push(tmp_path: Path) -> None:
    evs = decoupled_log() + [push(2.9, 0, 0, 5, 7, round_id=7)]
    violated(updates_accounted(write_run(tmp_path, complete(evs))), "pushes lost or merged twice 1 > bound 0",
             "push of learner 0 fragment 0 round 7 steps 5-7 accepted but never merged nor superseded")


def test_updates_accounted_finds_the_same_steps_merged_twice(tmp_path: Path) -> None:
    """What a real run did before stale pushes were declined: a final push re-sent steps an earlier round had
    merged (the learner had not applied that merge yet), and the drain merged them again."""
    evs = decoupled_log()
    evs += [push(3.5, 0, 0, 5, 8, round_id=None),
            ev("merge", 3.52, fragment=0, version=3, merges=7, round=3, participants=[0], c_steps=[4],
               c_tokens=[4 * TOK], step_ranges=[[5, 8]], base_versions=[1], tokens=4 * TOK / P, tokens_merged=0.0)]
    violated(updates_accounted(write_run(tmp_path, complete(evs))), "merged twice 1 > bound 0",
             "learner 0 fragment 0: steps 5-8 (v2) and 5-8 (v3) both merged")


def test_updates_accounted_late_stale_rejected_and_superseded_pushes(tmp_path: Path) -> None:
    ok = decoupled_log() + [
        push(2.9, 0, 0, 5, 8, outcome="late"),
        ev("push_superseded", 2.9, learner=0, fragment=0, reason="late", first_step=5, last_step=8),
        push(2.91, 1, 1, 3, 6, outcome="stale"),
        ev("push_superseded", 2.91, learner=1, fragment=1, reason="stale: its work is already in version 2",
           first_step=3, last_step=6, base_version=0),
        push(2.92, 1, 0, 5, 8, outcome="rejected_nonfinite"),
        ev("push_rejected", 2.92, learner=1, fragment=0, reason="rejected_nonfinite", first_step=5, last_step=8),
        # an answer replaced by a newer one of the same learner in the same round, which merged
        push(2.0, 0, 1, 3, 5, round_id=2),
        ev("push_superseded", 2.05, learner=0, fragment=1, first_step=3, last_step=5),
        ev("push_rejected", 2.93, learner=1, reason="malformed: missing key"),  # never became a push: no event
    ]
    holds(updates_accounted(write_run(tmp_path, complete(ok), name="ok")))
    late = decoupled_log() + [push(2.9, 0, 0, 5, 8, outcome="late")]
    violated(updates_accounted(write_run(tmp_path, complete(late), name="late")), "1 > bound 0",
             "outcome late but no push_superseded with reason late")
    rejected = decoupled_log() + [push(2.9, 0, 0, 5, 8, outcome="rejected_shape"),
                                  ev("push_rejected", 2.9, learner=0, fragment=0, reason="", first_step=5,
                                     last_step=8)]
    violated(updates_accounted(write_run(tmp_path, complete(rejected), name="rej")), "1 > bound 0",
             "outcome rejected_shape but no push_rejected with a reason")


def test_updates_accounted_a_carried_push_is_merged_in_a_later_round(tmp_path: Path) -> None:
    """An answer to round 7 that arrived after round 7 merged is carried: merged in round 8 of the fragment
    (another round id than the one it answered). Never merged, it is lost."""
    carried = push(3.0, 0, 0, 9, 10, outcome="carried", round_id=7, joined=None)
    merged = ev("merge", 3.2, fragment=0, version=3, merges=7, round=8, participants=[0], carried=[0], c_steps=[2],
                c_tokens=[2 * TOK], step_ranges=[[9, 10]], base_versions=[2], tokens=2 * TOK / P, tokens_merged=0.0)
    holds(updates_accounted(write_run(tmp_path, complete(decoupled_log() + [carried, merged]), name="ok")))
    violated(updates_accounted(write_run(tmp_path, complete(decoupled_log() + [carried]), name="lost")), "1 > bound 0",
             "push of learner 0 fragment 0 round 7 steps 9-10 carried but never merged nor superseded")


def test_updates_accounted_a_round_lost_with_the_syncer_is_re_pushed(tmp_path: Path) -> None:
    """The syncer dies with a round open; the learner's counters were not reset, so its next answer holds the
    same steps and more. That later merge accounts for the lost push; without it the push is lost."""
    base = decoupled_log()
    lost_round = [push(3.3, 0, 0, 9, 10, round_id=3), ev("syncer_down", 3.4, "supervisor", exitcode=-9)]
    repushed = [push(4.0, 0, 0, 9, 12, round_id=3),
                ev("merge", 4.1, fragment=0, version=3, merges=7, round=3, participants=[0], c_steps=[4],
                   c_tokens=[4 * TOK], step_ranges=[[9, 12]], base_versions=[2], tokens=2 * TOK, tokens_merged=0.0)]
    holds(updates_accounted(write_run(tmp_path, complete(base + lost_round + repushed), name="a")))
    violated(updates_accounted(write_run(tmp_path, complete(base + lost_round), name="b")), "1 > bound 0",
             "steps 9-10 accepted but never merged")


def test_updates_accounted_a_round_lost_with_the_syncer_then_given_up_on_rejoin(tmp_path: Path) -> None:
    """What a CI run did: the syncer dies with learner 0's push in an open round; restored, it merges learner 1's
    catch-up first, so learner 0 rejoins and is sent version 3, which it applies (its counters reset) before it
    answers a pull of fragment 0 again. Those steps were given up by the rejoin rule, not lost; without the
    apply of the version it was sent (or with an apply of another one), the push is lost."""
    base = decoupled_log() + [push(3.3, 0, 0, 9, 10, round_id=3), ev("syncer_down", 3.4, "supervisor", exitcode=-9),
                              ev("learner_join", 4.0, learner=0, peer="x", alive=[0, 1], versions=[3, 3])]
    applied = ev("apply", 4.1, "learner0.chip0", learner=0, step=14, fragments=[0, 1], versions=[3, 3])
    res = holds(updates_accounted(write_run(tmp_path, complete([*base, applied]), name="a")))
    assert "1 given up on rejoining the restored syncer" in res.detail
    violated(updates_accounted(write_run(tmp_path, complete(base), name="b")), "1 > bound 0",
             "steps 9-10 accepted but never")
    other = ev("apply", 4.1, "learner0.chip0", learner=0, step=14, fragments=[1], versions=[3])
    violated(updates_accounted(write_run(tmp_path, complete([*base, other]), name="c")), "1 > bound 0")
    before = [ev("learner_join", 3.2, learner=0, peer="x", alive=[0, 1], versions=[3, 3]), *base[:-1],
              ev("apply", 3.25, "learner0.chip0", learner=0, step=8, fragments=[0], versions=[3])]
    # a join before the crash
    violated(updates_accounted(write_run(tmp_path, complete(before), name="d")), "1 > bound 0")


def test_updates_accounted_given_up_on_rejoin_by_a_learner_that_finished_first(tmp_path: Path) -> None:
    """What a sharded CI run did: the syncer dies with learner 0's carried push; learner 0 finishes its steps
    while it is down, rejoins the restored syncer and sends its final push of those steps and more, based on a
    version older than the one it was just sent, so the syncer drops it (before_rejoin). The learner never
    applies the version it was sent (it has finished): the steps were given up by the rejoin rule, not lost.
    Without that drop, or with a drop that does not cover the push's steps, the push is lost."""
    base = decoupled_log() + [push(3.3, 0, 0, 9, 10, outcome="carried", round_id=3, joined=None),
                              ev("syncer_down", 3.4, "supervisor", exitcode=-9),
                              ev("learner_join", 4.0, learner=0, peer="x", alive=[0, 1], versions=[3, 3])]

    def dropped(first: int) -> list[dict]:
        return [push(4.1, 0, 0, first, 30, round_id=None, outcome="before_rejoin", joined=None),
                ev("push_superseded", 4.1, learner=0, fragment=0, reason="before rejoin", cause="before_rejoin",
                   first_step=first, last_step=30, base_version=1)]
    res = holds(updates_accounted(write_run(tmp_path, complete(base + dropped(9)), name="a")))
    assert "1 given up on rejoining the restored syncer" in res.detail
    violated(updates_accounted(write_run(tmp_path, complete(base), name="b")), "1 > bound 0",
             "steps 9-10 carried but never merged nor superseded")
    violated(updates_accounted(write_run(tmp_path, complete(base + dropped(10)), name="c")), "1 > bound 0")


def test_updates_accounted_a_restored_syncer_reusing_the_lost_round_id(tmp_path: Path) -> None:
    """The restored syncer numbers its next round of fragment 0 as the lost one was, and the learner, which has
    not stepped since, answers it with the same steps: the merge after the restart is the second push's, and
    the first push is accounted for as re-pushed, not the other way round (which would leave the second lost)."""
    evs = decoupled_log() + [push(3.3, 0, 0, 9, 10, round_id=3), ev("syncer_down", 3.4, "supervisor", exitcode=-9),
                             push(4.0, 0, 0, 9, 10, round_id=3),
                             ev("merge", 4.1, fragment=0, version=3, merges=7, round=3, participants=[0],
                                c_steps=[2], c_tokens=[2 * TOK], step_ranges=[[9, 10]], base_versions=[2],
                                tokens=TOK, tokens_merged=0.0)]
    holds(updates_accounted(write_run(tmp_path, complete(evs))))


def test_updates_accounted_counts_merges_the_killed_syncer_did_not_log(tmp_path: Path) -> None:
    """Persisted (version 3 of fragment 0 restored) but killed before its merge event: the push it took in is
    accounted for; with no such version restored, the same push is lost."""
    evs = decoupled_log() + [push(3.3, 0, 0, 9, 10, round_id=3), ev("syncer_down", 3.4, "supervisor", exitcode=-9)]
    restored = ev("syncer_restore", 4.0, fragments=[0, 1], versions=[3, 3], merges=6, clock=10, tokens_merged=0.0)
    res = holds(updates_accounted(write_run(tmp_path, complete([*evs, restored]), name="a")))
    assert "1 counted as merged in merges the killed syncer did not log" in res.detail
    same = ev("syncer_restore", 4.0, fragments=[0, 1], versions=[2, 3], merges=5, clock=10, tokens_merged=0.0)
    violated(updates_accounted(write_run(tmp_path, complete([*evs, same]), name="b")), "1 > bound 0")


def test_updates_accounted_finds_phantom_merges_and_repeated_versions(tmp_path: Path) -> None:
    evs = decoupled_log()
    merge = next(e for e in evs if e["ev"] == "merge" and e["fragment"] == 0 and e["version"] == 2)
    phantom = [e for e in evs if not (e["ev"] == "push" and e["fragment"] == 0 and e["last_step"] == 8
                                      and e["learner"] == 1)]
    violated(updates_accounted(write_run(tmp_path, complete(phantom), name="a")), "1 > bound 0",
             "took learner 1 steps 5-8, which no logged push accounts for")
    again = {**merge, "t": merge["t"] + 0.5, "participants": [], "step_ranges": [], "c_tokens": [], "c_steps": []}
    violated(updates_accounted(write_run(tmp_path, complete([*evs, again]), name="b")), "1 > bound 0",
             "fragment 0 version 2 made by 2 merges")


def test_updates_accounted_baselines_one_merge_per_round(tmp_path: Path) -> None:
    evs = [ev("run_start", 0.0, "supervisor", algorithm="diloco"),
           *[ev("merge", 1.0 + r, fragment=None, version=r, participants=[0, 1], c_tokens=[400, 400], round=r,
                step=4 * r, tokens=800, tokens_merged=800.0 * r) for r in (1, 2)]]
    holds(updates_accounted(write_run(tmp_path, complete(evs), config("diloco"), name="a")))
    twice = [*evs, {**evs[-1], "t": 3.5}]
    violated(updates_accounted(write_run(tmp_path, complete(twice), config("diloco"), name="b")),
             "1 > bound 0", "round 2 merged 2 times")


# -- token_accounting -----------------------------------------------------------------------------------------

def test_token_accounting_holds_on_a_healthy_run(tmp_path: Path) -> None:
    res = holds(token_accounting(write_run(tmp_path, complete(decoupled_log()))))
    assert res.figure == 0 and "1600 tokens merged (syncer_done) over 5 merges, P = 2" in res.detail


def test_token_accounting_finds_a_syncer_count_off_the_merges(tmp_path: Path) -> None:
    evs = decoupled_log()
    done = next(e for e in evs if e["ev"] == "syncer_done")
    done["tokens_merged"] += 100
    violated(token_accounting(write_run(tmp_path, complete(evs))),
             "tokens-merged discrepancy 100 tokens > bound 0.001 tokens",
             "syncer_done says 1700 tokens merged, merges logged 1600")


def test_token_accounting_finds_c_tokens_that_are_not_the_steps_tokens(tmp_path: Path) -> None:
    """The syncer's count agrees with its merges, but a push claimed more tokens than its steps trained."""
    evs = decoupled_log()
    m = next(e for e in evs if e["ev"] == "merge" and e["fragment"] == 0 and e["version"] == 1)
    m["c_tokens"] = [m["c_tokens"][0] + 300, m["c_tokens"][1]]
    for e in evs:
        if e["ev"] in ("merge", "syncer_done") and e["t"] >= m["t"]:
            e["tokens_merged"] += 150
    violated(token_accounting(write_run(tmp_path, complete(evs))), "discrepancy 150 tokens > bound 0.001",
             "learner 0 c_tokens 700 but its steps 1-4 logged 400 tokens")


def test_token_accounting_restored_count(tmp_path: Path) -> None:
    """A restored syncer's count above the log is explained only by restored versions no merge event shows."""
    evs = decoupled_log() + [ev("syncer_down", 3.4, "supervisor", exitcode=-9)]
    done = next(e for e in evs if e["ev"] == "syncer_done")
    done["t"], done["tokens_merged"] = 5.0, 1800.0
    unlogged = ev("syncer_restore", 4.0, fragments=[0, 1], versions=[3, 3], merges=6, tokens_merged=1800.0)
    holds(token_accounting(write_run(tmp_path, complete([*evs, unlogged]), name="a")))
    none = ev("syncer_restore", 4.0, fragments=[0, 1], versions=[2, 3], merges=5, tokens_merged=1800.0)
    violated(token_accounting(write_run(tmp_path, complete([*evs, none]), name="b")), "discrepancy 400 tokens",
             "restored syncer counts 1800.0 tokens merged, the log 1600")


def ddp_log(algorithm: str, steps: int = 3, tokens: int = 100) -> list[dict[str, Any]]:
    """A data-parallel run as logged: each step's merge (the averaged gradient) comes before the learners' step
    events, which they log once they have stepped on it."""
    evs: list[dict[str, Any]] = []
    for s in range(1, steps + 1):
        t = float(s)
        evs.append(ev("merge", t, step=s, participants=[0, 1], c_tokens=[tokens, tokens],
                      tokens_merged=2.0 * tokens * s))
        evs += [ev("step", t + 0.01, f"chip{m}.0", learner=m, step=s, tokens=tokens) for m in (0, 1)]
    return [*evs, ev("syncer_done", steps + 1.0, tokens_merged=2.0 * tokens * steps)]


@pytest.mark.parametrize("algorithm", ["ddp", "elastic_ddp"])
def test_token_accounting_checks_data_parallel_steps_logged_after_their_merge(tmp_path: Path,
                                                                             algorithm: str) -> None:
    cfg = config(algorithm)
    res = holds(token_accounting(write_run(tmp_path, complete(ddp_log(algorithm)), cfg, name="a")))
    assert "not checked" not in res.detail, res.detail  # every contribution was checked against its step
    evs = ddp_log(algorithm)
    next(e for e in evs if e["ev"] == "step" and e["learner"] == 1 and e["step"] == 2)["tokens"] = 50
    violated(token_accounting(write_run(tmp_path, complete(evs), cfg, name="b")), "discrepancy 50 tokens",
             "learner 1 c_tokens 100 but its steps 2-2 logged 50 tokens")


def test_token_accounting_is_not_vacuous(tmp_path: Path) -> None:
    evs = [e for e in decoupled_log() if e["ev"] not in ("merge", "syncer_done", "eval")]
    violated(token_accounting(write_run(tmp_path, complete(evs))), "n/a tokens > bound 0.001", "nothing merged")


# -- model_finite ---------------------------------------------------------------------------------------------

def test_model_finite(tmp_path: Path) -> None:
    good = {"w": torch.ones(3), "b": torch.zeros(2)}
    res = holds(model_finite(write_run(tmp_path, decoupled_log(), params=good, name="a")))
    assert "5 observations, all finite" in res.detail  # 2 tensors, the final flag, 2 evals
    bad = {"w": torch.tensor([1.0, math.nan, math.inf]), "b": torch.zeros(2)}
    violated(model_finite(write_run(tmp_path, decoupled_log(), params=bad, name="b")),
             "non-finite observations 1 > bound 0", "global.pt tensor w has 2 non-finite values")
    violated(model_finite(write_run(tmp_path, decoupled_log(final_loss=math.nan), name="c")),
             "non-finite observations 1 > bound 0", "final eval of version 5")


def test_model_finite_flag_and_no_evidence(tmp_path: Path) -> None:
    evs = decoupled_log()
    next(e for e in evs if e.get("kind") == "final")["finite"] = False
    violated(model_finite(write_run(tmp_path, evs, name="a")), "1 > bound 0", "checkpoint is not finite")
    bare = [e for e in decoupled_log() if e["ev"] != "eval"]
    holds(model_finite(write_run(tmp_path, bare, report={"global_model_finite": True}, name="b")))
    violated(model_finite(write_run(tmp_path, bare, name="c")), "n/a > bound 0", "no evidence")


# -- all at once ----------------------------------------------------------------------------------------------

def test_check_all(tmp_path: Path) -> None:
    from tests.invariants.test_protocol_invariants import with_protocol_facts  # it imports this module

    run = load_run(write_run(tmp_path, complete(with_protocol_facts(decoupled_log())), params={"w": torch.ones(2)}))
    results = check_all(run, max_loss=3.0, bound_s=1.0, min_uptime=0.9, within_s=5.0)
    assert [r.name for r in results] == ["converged", "no_global_downtime", "availability", "faults_fired",
                                         "rejoined", "updates_accounted", "work_kept", "token_accounting",
                                         "model_finite", "learners_finite", "rda_norms", "outer_lr", "token_weights",
                                         "pushes_received",
                                         "apply_schedule", "initial_pull"]  # the protocol invariants: decoupled
    assert all(r.ok for r in results), [str(r) for r in results if not r.ok]
    strict = check_all(run, max_loss=2.0)
    assert [r.name for r in strict if not r.ok] == ["converged"]


def test_updates_accounted_a_carried_push_dies_with_the_syncer(tmp_path: Path) -> None:
    """What a suite run did: learner 0's answer to fragment 0's round 3 arrives after that round merged, so it is
    carried into round 4; the learner applies version 3 (the round it missed: its counters reset, those steps
    are gone from it) and the syncer is killed before round 4 merges. The dead syncer's round held the only
    copy: lost with the syncer, not by it. A merge of the fragment between the push and the crash that left it
    out, or no apply after the push, and the push is lost."""
    carried = push(3.3, 0, 0, 9, 10, outcome="carried", round_id=3, joined=None)
    applied = ev("apply", 3.35, "learner0.chip0", learner=0, step=11, fragments=[0], versions=[3])
    crash = ev("syncer_down", 3.4, "supervisor", exitcode=-9)
    res = holds(updates_accounted(write_run(tmp_path, complete(decoupled_log() + [carried, applied, crash]), name="a")))
    assert "1 lost with the syncer's open round" in res.detail
    violated(updates_accounted(write_run(tmp_path, complete(decoupled_log() + [carried, crash]), name="b")),
             "1 > bound 0", "carried but never merged nor superseded")
    left_out = ev("merge", 3.38, fragment=0, version=4, merges=7, round=4, participants=[1], c_steps=[2],
                  c_tokens=[2 * TOK], step_ranges=[[9, 10]], base_versions=[3], tokens=2 * TOK / P, tokens_merged=0.0)
    pushed = push(3.36, 1, 0, 9, 10, round_id=4)
    evs = complete(decoupled_log() + [carried, applied, pushed, left_out, crash])
    violated(updates_accounted(write_run(tmp_path, evs, name="c")), "1 > bound 0",
             "learner 0 fragment 0 round 3 steps 9-10 carried")


# -- learners_finite ---------------------------------------------------------------------------------------

def test_learners_finite_holds_on_a_finite_run_and_names_learner_fragment_and_steps_when_not(
        tmp_path: Path) -> None:
    from diloco_chaos.harness.invariants import learners_finite

    holds(learners_finite(write_run(tmp_path, complete(decoupled_log()), name="ok")))
    # learner 1's loss turns NaN after step 5; the syncer rejects its pushes of both fragments
    bad = [e for e in decoupled_log() if not (e["ev"] == "step" and e["learner"] == 1 and e["step"] > 5)]
    bad += [ev("step", step_t(1, s), "learner1.chip0", learner=1, step=s, loss=math.nan, tokens=TOK, chips=1)
            for s in range(6, 9)]
    bad += [ev("learner_nonfinite", step_t(1, 6), "learner1.chip0", learner=1, step=6, loss=math.nan,
               error="training loss nan at step 6"),
            ev("push_rejected", 3.0, learner=1, fragment=0, reason="rejected_nonfinite", first_step=5, last_step=8),
            ev("push_rejected", 3.1, learner=1, fragment=1, reason="rejected_nonfinite", first_step=7, last_step=8),
            ev("push_rejected", 3.2, learner=0, reason="malformed: missing key"),  # not a non-finite push
            ev("learner_done", 3.3, "learner1.chip0", learner=1, steps=8, finite=False, timing={}, cpu_s=1.0)]
    violated(learners_finite(write_run(tmp_path, complete(bad), name="nan")),
             "learners with non-finite work 1 > bound 0", "learner 1: loss non-finite at steps 6-8",
             "fragment 0: non-finite work rejected, steps 5-8", "fragment 1: non-finite work rejected, steps 7-8",
             "2 pushes rejected_nonfinite", "parameters non-finite when it finished (step 8)")


def test_learners_finite_on_a_barrier_run_reads_the_rejected_contributions(tmp_path: Path) -> None:
    from diloco_chaos.harness.invariants import learners_finite

    steps = [ev("step", 1.0 + 0.1 * s, f"learner{m}.chip0", learner=m, step=s, loss=2.0, tokens=TOK, chips=1)
             for m in range(2) for s in range(1, 4)]
    ok = [*steps, ev("sync_rejected", 1.5, learner=0, step=3, reason="rejected_shape: not the model's tensor names")]
    holds(learners_finite(write_run(tmp_path, complete(ok), config("ddp"), name="ddp-ok")))
    bad = [*steps, ev("sync_rejected", 1.5, learner=0, step=3, reason="rejected_nonfinite"),
           ev("sync_rejected", 1.6, learner=0, step=4, reason="rejected_nonfinite")]
    violated(learners_finite(write_run(tmp_path, complete(bad), config("ddp"), name="ddp-nan")),
             "1 > bound 0", "learner 0: whole model: non-finite work rejected, steps 3-4")
    rounds = [*steps, ev("sync_rejected", 1.5, learner=1, round=2, reason="rejected_nonfinite")]
    violated(learners_finite(write_run(tmp_path, complete(rounds), config("diloco"), name="diloco-nan")),
             "learner 1: whole model: non-finite outer delta rejected, rounds 2")


def test_learners_finite_without_a_step_is_no_evidence(tmp_path: Path) -> None:
    from diloco_chaos.harness.invariants import learners_finite

    violated(learners_finite(write_run(tmp_path, complete([ev("run_start", 0.0, "supervisor")]))),
             "n/a > bound 0", "no learner logged a step")


def test_learners_finite_is_in_check_all_for_every_algorithm() -> None:
    from diloco_chaos.harness.algorithms.base import names
    from diloco_chaos.harness.invariants.registry import discover

    s = discover()["learners_finite"]
    assert s.mode == "always" and s.requires is None and s.algorithms == names()
