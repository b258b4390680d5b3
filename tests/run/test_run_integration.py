"""End-to-end runs with real processes: a tiny 2 learners x 2 chips run of each algorithm."""

from __future__ import annotations

import psutil
import pytest
from conftest import tiny

from diloco_chaos.harness.record.events import read_events
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, CONFIG_FILE, REPORT_FILE, read_json
from diloco_chaos.harness.run.supervisor import run_scenario


def assert_no_survivors(pids: list[int]) -> None:
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"processes of the run still alive: {alive}"


def test_decoupled_2x2_end_to_end(runs_dir):
    sc = tiny("decoupled", steps=80)
    res = run_scenario(sc, runs_dir)
    rep = res.report
    for name in (CONFIG_FILE, REPORT_FILE, CHECKPOINT_FILE, "events.jsonl"):
        assert (res.run_dir / name).exists(), name
    assert read_json(res.run_dir / CONFIG_FILE)["algorithm"] == "decoupled"
    # real processes: 4 distinct chip pids in 2 Gloo groups, none left afterwards
    assert len(rep["chip_pids"]) == 4
    assert rep["gloo_groups"] == ["learner0/gen0", "learner1/gen0"]
    assert_no_survivors(res.pids + rep["chip_pids"])
    # every learner ran all its steps, the syncer merged, the model learned
    assert {m: d["steps"] for m, d in rep["per_learner"].items()} == {"0": 80, "1": 80}
    assert rep["tokens_trained"] == 2 * 80 * 2 * sc.data.batch_size * sc.model.seq_len
    assert rep["merge_count"] >= 80 // sc.diloco.sync_every
    assert 0 < rep["tokens_merged"] <= rep["tokens_trained"]
    assert rep["initial_eval_loss"] == pytest.approx(5.55, abs=0.1)
    assert rep["final_eval_loss"] < rep["initial_eval_loss"] - 1.5, rep["final_eval_loss"]
    assert rep["global_model_finite"] is True
    assert rep["errors"] == [] and rep["pushes_rejected"] == 0 and rep["frames_rejected"] == 0
    # the event log tells the algorithm's story: pulls, pushes with step ranges, weighted merges, applies
    evs = read_events(res.run_dir / "events.jsonl")
    kinds = {e["ev"] for e in evs}
    assert {"pull", "push", "merge", "apply", "step", "learner_join", "eval"} <= kinds
    # the eval curve is dense whatever the run's length: eval.points spread over the planned training
    # (eval.every_s = 1 s alone, eval.points = 0: 5 points in one such run), within eval.max_share of a core
    periodic = [e for e in evs if e["ev"] == "eval" and e.get("kind") == "periodic"]
    assert len(rep["eval_curve"]) >= 8 and sum(e.get("trigger") == "progress" for e in periodic) >= 6
    share = sum(e.get("cpu_s", 0.0) for e in periodic) / rep["train_s"]
    assert share <= 2 * sc.eval.max_share, f"periodic evals took {share:.1%} of a core"
    merges = [e for e in evs if e["ev"] == "merge"]
    assert all(abs(sum(e["weights"]) - 1) < 1e-5 for e in merges)
    assert all(len(e["step_ranges"]) == len(e["participants"]) for e in merges)
    # a finished learner's goodbye: its final push of every fragment reached the syncer, and the syncer, not
    # the learner, closed the connection after the BYE (a learner closing first, with the syncer's fragments
    # unread, reset the connection and lost the final pushes still in its or its proxy's send buffer)
    sent = {(e["learner"], e["fragment"]) for e in evs if e["ev"] == "push_sent" and e["round"] is None}
    finals = {(e["learner"], e["fragment"]) for e in evs if e["ev"] == "push" and e.get("final")}
    assert sent and finals == sent, (sent, finals)
    closed = [e for e in evs if e["ev"] == "conn_closed" and e.get("learner") is not None]
    assert sorted(e["learner"] for e in closed if e["reason"] == "learner said BYE") == [0, 1], closed


@pytest.mark.parametrize("algorithm", ["ddp", "diloco"])
def test_baselines_2x1_converge(runs_dir, algorithm):
    res = run_scenario(tiny(algorithm, chips=1, steps=60), runs_dir)
    rep = res.report
    assert rep["algorithm"] == algorithm
    assert {m: d["steps"] for m, d in rep["per_learner"].items()} == {"0": 60, "1": 60}
    expected_rounds = 60 if algorithm == "ddp" else 60 // 4
    assert rep["merge_count"] == expected_rounds
    assert rep["tokens_merged"] == rep["tokens_trained"]  # synchronous: every token reaches the model
    assert rep["final_eval_loss"] < rep["initial_eval_loss"] - 1.5
    assert_no_survivors(res.pids + rep["chip_pids"])


def test_a_scheduled_fault_that_never_fires_fails_the_run(runs_dir):
    """A chaos test whose fault did not happen proves nothing: the run must say so loudly."""
    from diloco_chaos.harness.run.supervisor import RunFailed

    # merges are not known before the run (a step past train.steps is refused by validation instead)
    sc = tiny("decoupled", learners=2, chips=1, steps=30).replace(
        faults=[{"action": "partition", "learner": 1, "at": {"merges": 100_000}}])
    with pytest.raises(RunFailed, match=r"never fired: faults\[0\] partition\(learner 1"):
        run_scenario(sc, runs_dir)


def test_a_fault_past_the_last_step_is_refused_before_the_run(runs_dir):
    from diloco_chaos.harness.config.sections import ScenarioError

    with pytest.raises(ScenarioError, match=r"faults\[0\].at.step = 10000: never reached, train.steps = 30"):
        tiny("decoupled", learners=2, chips=1, steps=30).replace(
            faults=[{"action": "partition", "learner": 1, "at": {"step": 10_000}}])


def test_chip_failure_with_policy_fail_fails_the_run(runs_dir):
    """Without a restart policy a lost chip is an error, and the run says which learner and why."""
    from diloco_chaos.harness.run.supervisor import RunFailed

    sc = tiny("decoupled", learners=2, chips=2, steps=200).replace(
        recovery=type(tiny().recovery)(policy="restart", max_restarts=0),
        faults=[{"action": "kill_chip", "learner": 0, "chip": 1, "at": {"step": 20, "learner": 1}}])
    with pytest.raises(RunFailed, match=r"learner 0 failed \(max_restarts = 0 used\)"):
        run_scenario(sc, runs_dir)
