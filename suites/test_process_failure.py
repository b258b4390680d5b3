"""Process failure suite: chips and learners die or freeze for real (SIGKILL / SIGSTOP by pid), the others go on.

Decoupled DiLoCo's claim: a failure in one learner does not stop training elsewhere, and the repaired learner is
reintegrated. Each test runs the real system with a fault from the scenario's schedule, triggered by training
progress (another learner's step), with `recovery.policy = "restart"`: the supervisor stops the broken learner,
waits its repair delay, starts it as a new Gloo group; it pulls the global model and resumes its steps.
Public API only: the diloco-chaos pytest plugin (the run_scenario and cluster fixtures, which also check after
every test that no process of its runs is alive and no port bound) and diloco_chaos.harness.config.scenario.from_dict.
Each test checks a convergence and an availability invariant (diloco_chaos/harness/invariants/), whose figures it
prints.

Scaling to a real cluster: the same schedule entries apply; a chip is a host process there, and the repair delay
is the time to replace a machine (minutes, not seconds), which only lengthens the outage window asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.invariants import InvariantViolation
from diloco_chaos.harness.invariants.registry import spec
from diloco_chaos.harness.report.metrics import DOWNTIME_WINDOW_S
from diloco_chaos.harness.report.tolerance import SEED_SD, Reference
from diloco_chaos.trainers.mutations import ENV_VAR

pytestmark = [pytest.mark.failure, pytest.mark.timeout(600)]
"""600 s: a test's first use of the shared fault-free run (`cluster`) runs it inside that test's budget."""

STEPS = 240
REPAIR_S = 1.0
MAX_GAP_S = 1.5
"""Longest the global model may stand still while at least K = 1 learner is alive (fault-free: ~0.1 s)."""
REJOIN_S = 10.0
"""A failed learner must be back (its first step after the restart) within this of its repair delay ending."""
FAULT_FREE = Reference("process-failure fault-free", mean=2.166, sd=0.032, cost=0.10)
"""The fault-free run of this scenario (measured by bench/tolerances.py, docs/metrics.md "Loss tolerances"):
its run-to-run spread (9 runs: the bench's 6 and this suite's own 3), and what one of this suite's faults may
cost (the largest cost measured in one run of its tests, rounded up to 0.05)."""
LOSS_TOLERANCE = FAULT_FREE.tolerance()
"""Final eval loss may exceed the fault-free run of the same seed by at most this (nats per byte): the fault's
cost plus 3 standard deviations of the difference of two runs (diloco_chaos.harness.report.tolerance.loss_tolerance)."""
BASELINES = {"ddp": Reference("process-failure ddp 120 steps", mean=2.2420, sd=SEED_SD, cost=0.0),
             "diloco": Reference("process-failure diloco 120 steps", mean=2.4913, sd=SEED_SD, cost=0.10)}
"""The synchronous baselines' fault-free runs of the 120-step scenario: each repeats exactly on one machine
(sd: diloco_chaos.harness.report.tolerance.SEED_SD), and the chip loss may cost what it was measured to cost, rounded up
to 0.05."""


SYNCER_REPAIR_S = 1.5
SYNCER_BACK_S = 5.0
"""After its repair delay, the restored syncer must merge again within this."""


def scenario(faults: list[dict[str, Any]], chips: int = 2, algorithm: str = "decoupled", steps: int = STEPS,
             policy: str = "restart") -> Any:
    return from_dict({
        "name": "process-failure",
        "seed": 5,
        "algorithm": algorithm,
        "topology": {"learners": 2, "chips_per_learner": chips},
        "train": {"steps": steps, "warmup_steps": 10},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 240.0},
        "recovery": {"policy": policy, "repair_s": REPAIR_S, "max_restarts": 2,
                     "syncer_policy": "restart", "syncer_repair_s": SYNCER_REPAIR_S},
        "faults": faults,
    })


MIN_UPTIME = 0.9
"""Uptime (diloco_chaos/harness/report/metrics.py: the training span minus merge gaps beyond 1 s) of a decoupled run
with one fault; the fault-free run is at 1.0, a K=M run that stalls through a learner's outage falls below."""


@pytest.fixture
def fault_free(cluster) -> dict[str, Any]:
    """The fault-free run of the same scenario and seed: run once per module, shared by the tests."""
    return cluster(scenario([]), "fault-free").report


def check_invariants(res: Any, fault_free: dict[str, Any]) -> None:
    """Convergence and availability invariants, with their figures printed (they raise naming both)."""
    res.check("converged", baseline_loss=fault_free["final_eval_loss"], tolerance=LOSS_TOLERANCE)
    res.check("availability", min_uptime=MIN_UPTIME)
    res.check("no_global_downtime", bound_s=MAX_GAP_S)
    res.check("model_finite")
    unexpected = [e for e in res.report["errors"] if not e["expected"]]
    assert not unexpected, f"errors no injected fault explains: {unexpected}"


def check_outage(res: Any, fault_free: dict[str, Any], down_ev: str) -> dict[str, Any]:
    """Shared assertions: learner 0 and the global model went on through learner 1's outage; learner 1 came back
    and its later pushes were merged; the final model is as good as the fault-free one. Returns figures."""
    rep, evs = res.report, res.events
    (start,) = [e for e in evs if e["ev"] == "fault_start"]
    assert "missed" not in start, start
    t_down = start["t"]
    back = next(e for e in evs if e["ev"] == down_ev and e["learner"] == 1 and e["t"] > t_down)
    first_step_back = next(e for e in evs if e["ev"] == "step" and e["learner"] == 1 and e["t"] > back["t"])
    steps0 = [e for e in evs if e["ev"] == "step" and e["learner"] == 0 and t_down < e["t"] < first_step_back["t"]]
    merges = [e["t"] for e in evs if e["ev"] == "merge" and t_down <= e["t"] <= first_step_back["t"]]
    gaps = [b - a for a, b in zip([t_down, *merges], [*merges, first_step_back["t"]], strict=True)]
    later = [e for e in evs if e["ev"] == "merge" and e["t"] > first_step_back["t"] and 1 in e["participants"]]
    figures = {"outage_s": round(first_step_back["t"] - t_down, 3), "learner0_steps_in_outage": len(steps0),
               "merges_in_outage": len(merges), "max_gap_in_outage_s": round(max(gaps), 3),
               "merged_after_rejoin": len(later), "final_eval": rep["final_eval_loss"],
               "fault_free_eval": fault_free["final_eval_loss"]}
    res.figures(figures)
    assert len(steps0) >= 10, f"learner 0 stalled during learner 1's outage: {figures}"
    assert max(gaps) < MAX_GAP_S, f"global model stood still {max(gaps):.2f} s > {MAX_GAP_S} s: {figures}"
    assert later, f"learner 1's pushes after it came back were never merged: {figures}"
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values()), rep["per_learner"]
    check_invariants(res, fault_free)
    return figures


def at_step(step: int) -> dict[str, Any]:
    return {"step": step, "learner": 0}


def test_chip_loss_failure_restarts_the_learner(run_scenario, fault_free):
    res = run_scenario(scenario([{"action": "kill_chip", "learner": 1, "chip": 1, "at": at_step(STEPS // 4)}]))
    evs = res.events
    down = next(e for e in evs if e["ev"] == "learner_down")
    restart = next(e for e in evs if e["ev"] == "learner_restart")
    assert down["learner"] == 1 and restart["learner"] == 1 and restart["generation"] == 1
    assert restart["t"] - down["t"] >= REPAIR_S, "restarted before its repair delay"
    pull = next(e for e in evs if e["ev"] == "initial_pull" and e["learner"] == 1)
    assert pull["fragments"] == pull["of"] == 4, "a rejoining learner takes every global fragment first"
    assert restart["start_step"] == pull["step"] > 0
    groups = res.report["gloo_groups"]
    assert "learner1/gen1" in groups and "learner1/gen0" in groups, groups
    first_back = next(e for e in evs if e["ev"] == "step" and e["learner"] == 1 and e["t"] > restart["t"])
    assert first_back["t"] - (down["t"] + REPAIR_S) < REJOIN_S
    check_outage(res, fault_free, "learner_restart")


def test_chip_loss_failure_shrink_keeps_the_learner_training(run_scenario, fault_free):
    """recovery.policy = shrink: learner 1's surviving chip re-forms a one-chip group at once and trains on with
    half the tokens per step (which token-weighted merging sees); the repaired chip joins at a step boundary."""
    res = run_scenario(scenario([{"action": "kill_chip", "learner": 1, "chip": 1, "at": at_step(STEPS // 4)}],
                                policy="shrink"))
    rep, evs = res.report, res.events
    shrink = next(e for e in evs if e["ev"] == "learner_shrink")
    grow = next(e for e in evs if e["ev"] == "learner_grow")
    joined = next(e for e in evs if e["ev"] == "chip_joined")
    assert shrink["learner"] == 1 and shrink["lost"] == [1] and shrink["members"] == [0]
    assert grow["chip"] == 1 and grow["t"] - shrink["t"] >= REPAIR_S and joined["size"] == 2
    assert not [e for e in evs if e["ev"] == "learner_restart"], "a shrink is not a restart"
    steps1 = [e for e in evs if e["ev"] == "step" and e["learner"] == 1]
    # from the survivor's re-formed group (a step whose all-reduce finished before the kill may be logged
    # just after the supervisor's learner_shrink) to the repaired chip's join
    regrouped = next(e for e in evs if e["ev"] == "regroup" and e["learner"] == 1 and e["t"] > shrink["t"])
    small = [e for e in steps1 if regrouped["t"] < e["t"] < joined["t"]]
    full = [e for e in steps1 if e["t"] < shrink["t"] - 0.5 or e["t"] > joined["t"] + 0.5]
    assert len(small) >= 10 and {e["chips"] for e in small} == {1}, "the survivor trains on alone"
    assert {e["tokens"] for e in full} == {2 * small[0]["tokens"]}, "half the tokens per step while shrunk"
    # pushes of steps after the survivor re-formed alone (the supervisor's learner_shrink step is its view of
    # the learner's progress, which can be a step behind: a CI run's push of steps 63-64 held 1024 + 512 tokens)
    merged_small = [c_tok / c_st for e in evs if e["ev"] == "merge" and shrink["t"] < e["t"] < joined["t"]
                    for m, c_st, c_tok in zip(e["participants"], e["c_steps"], e["c_tokens"], strict=True)
                    if m == 1 and e["step_ranges"][e["participants"].index(1)][0] > regrouped["step"]]
    assert merged_small and max(merged_small) == small[0]["tokens"], "merges weighted the shrunk learner's tokens"
    steps0 = [e for e in evs if e["ev"] == "step" and e["learner"] == 0 and shrink["t"] < e["t"] < joined["t"]]
    figures = {"shrunk_s": round(joined["t"] - shrink["t"], 3), "learner1_steps_shrunk": len(small),
               "learner0_steps_meanwhile": len(steps0), "tokens_per_step": [small[0]["tokens"], full[0]["tokens"]],
               "longest_gap_s": rep["longest_gap_s"], "final_eval": rep["final_eval_loss"],
               "fault_free_eval": fault_free["final_eval_loss"]}
    res.figures(figures)
    assert rep["longest_gap_s"] < MAX_GAP_S, figures
    assert {"learner1/gen0", "learner1/gen1", "learner1/gen2"} <= set(rep["gloo_groups"])
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    check_invariants(res, fault_free)


def test_learner_loss_failure_restarts_the_learner(run_scenario, fault_free):
    res = run_scenario(scenario([{"action": "kill_learner", "learner": 1, "at": at_step(STEPS // 3)}]))
    evs = res.events
    kill = next(e for e in evs if e["ev"] == "process_fault")
    assert kill["kind"] == "kill_learner" and len(kill["pids"]) == 2 and kill["signal"] == "SIGKILL"
    check_outage(res, fault_free, "learner_restart")


def test_freeze_failure_learner_resumes_after_sigcont(run_scenario, fault_free):
    """A frozen host stops talking; the syncer drops it after timeouts.liveness_s; after SIGCONT it reconnects."""
    res = run_scenario(scenario([{"action": "freeze", "learner": 1, "at": at_step(STEPS // 4),
                                  "until": {"after_s": 4.0}}]))
    evs = res.events
    assert [e["kind"] for e in evs if e["ev"] == "process_fault"] == ["freeze"]
    assert [e["kind"] for e in evs if e["ev"] == "process_fault_off"] == ["freeze"]
    assert not [e for e in evs if e["ev"] == "learner_restart"], "a freeze is not a failure: no restart"
    check_outage(res, fault_free, "process_fault_off")


@pytest.mark.parametrize("algorithm", ["ddp", "diloco"])
def test_chip_loss_failure_stalls_the_synchronous_baselines(run_scenario, algorithm):
    """The same chip loss stops ddp and diloco everywhere until the learner is back (it resumes from the syncer's
    state: ddp's replica and AdamW moments, diloco's global model after the last round)."""
    steps = 120
    res = run_scenario(scenario([{"action": "kill_chip", "learner": 1, "chip": 1, "at": at_step(steps // 4)}],
                                algorithm=algorithm, steps=steps))
    rep, evs = res.report, res.events
    t_down = next(e["t"] for e in evs if e["ev"] == "fault_start")
    resume = next(e for e in evs if e["ev"] == "resume" and e["learner"] == 1)
    back = next(e["t"] for e in evs if e["ev"] == "step" and e["learner"] == 1 and e["t"] > resume["t"])
    steps0 = [e["step"] for e in evs if e["ev"] == "step" and e["learner"] == 0 and t_down + 0.5 < e["t"] < back]
    figures = {"outage_s": round(back - t_down, 3), "learner0_steps_in_outage": len(steps0),
               "longest_gap_s": rep["longest_gap_s"], "resumed_at_step": resume["step"],
               "final_eval": rep["final_eval_loss"]}
    res.figures(figures)
    sync_every = 4
    assert len(steps0) <= (1 if algorithm == "ddp" else sync_every), f"{algorithm} did not stall: {figures}"
    assert rep["longest_gap_s"] >= REPAIR_S, figures
    assert resume["step"] > 0 and (algorithm == "ddp" or resume["step"] % sync_every == 0), resume
    assert all(d["steps"] == steps for d in rep["per_learner"].values()), "the baseline resumes after the repair"
    res.check("converged", max_loss=BASELINES[algorithm].bound())
    stalled = res.measure("no_global_downtime", bound_s=REPAIR_S)
    assert not stalled.ok, f"{algorithm} must stall everywhere while one learner is down: {stalled}"


@pytest.mark.syncer
def test_syncer_crash_failure_restores_and_loses_nothing_seen(run_scenario, fault_free):
    """SIGKILL the syncer mid-run. Learners keep training through the outage; the supervisor restarts it on the
    same port after its repair delay; it restores every fragment from its checkpoint (written before each
    broadcast), so no fragment version any learner applied is lost, and merging resumes from those versions."""
    res = run_scenario(scenario([{"action": "kill_syncer", "at": {"merges": 60}}]))
    rep, evs = res.report, res.events
    kill = next(e for e in evs if e["ev"] == "process_fault")
    assert kill["kind"] == "kill_syncer" and kill["signal"] == "SIGKILL"
    down = next(e for e in evs if e["ev"] == "syncer_down")
    restart = next(e for e in evs if e["ev"] == "syncer_restart")
    restore = next(e for e in evs if e["ev"] == "syncer_restore")
    assert restart["t"] - down["t"] >= SYNCER_REPAIR_S
    before = [e for e in evs if e["ev"] == "merge" and e["t"] < kill["t"]]
    after = [e for e in evs if e["ev"] == "merge" and e["t"] > restore["t"]]
    # nothing seen is lost: each fragment comes back at (at least) the last version broadcast, with its content
    for p in range(4):
        last = [e for e in before if e["fragment"] == p][-1]
        restored = restore["versions"][p]
        assert restored >= last["version"], f"fragment {p}: restored v{restored} < broadcast v{last['version']}"
        if restored == last["version"]:
            assert restore["digests"][str(p)] == last["digest"], f"fragment {p}: restored content differs"
        applied = [v for e in evs if e["ev"] == "apply" and e["t"] < kill["t"]
                   for q, v in zip(e["fragments"], e["versions"], strict=True) if q == p]
        assert max(applied, default=0) <= restored, f"fragment {p}: a learner applied a version the syncer lost"
        first_after = next(e for e in after if e["fragment"] == p)
        assert first_after["version"] == restored + 1, "merging resumes from the restored version"
    steps_out = {m: [e for e in evs if e["ev"] == "step" and e["learner"] == m and down["t"] < e["t"] < restart["t"]]
                 for m in (0, 1)}
    figures = {"syncer_outage_s": round(after[0]["t"] - kill["t"], 3), "merges_before": len(before),
               "restored_versions": restore["versions"], "merges_after": len(after),
               "steps_in_outage": {m: len(v) for m, v in steps_out.items()},
               "final_eval": rep["final_eval_loss"], "fault_free_eval": fault_free["final_eval_loss"]}
    res.figures(figures)
    assert all(len(v) >= 5 for v in steps_out.values()), f"learners stalled while the syncer was down: {figures}"
    assert after[0]["t"] - restart["t"] < SYNCER_BACK_S, figures
    assert {0, 1} <= {m for e in after for m in e["participants"]}, "both learners rejoined the restored syncer"
    assert rep["syncer_restarts"] == 1 and rep["merge_count"] == len(before) + len(after) + sum(
        1 for e in evs if e["ev"] == "merge" and kill["t"] <= e["t"] <= restore["t"])
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    res.check("converged", baseline_loss=fault_free["final_eval_loss"], tolerance=LOSS_TOLERANCE)
    # The syncer's outage is real downtime, and its length is bounded above (repair delay, then back within
    # SYNCER_BACK_S). Its share of the run is not fixed (2.6 s of a 5.7 s span on a fast CI machine, of ~10 s
    # here), so the bound is: no downtime beyond the merge gap that outage made (of which the first window_s
    # is not downtime); 1e-3 covers the report's rounding.
    first_step, last_step = res.record.train_span()
    gap = after[0]["t"] - max(e["t"] for e in evs if e["ev"] == "merge" and e["t"] < restore["t"])
    res.check("availability",
              min_uptime=round(1 - max(0.0, gap - DOWNTIME_WINDOW_S) / (last_step - first_step) - 1e-3, 4))
    res.check("updates_accounted")
    res.check("model_finite")


def test_random_failures_failure_drawn_schedule_fires_and_heals(run_scenario, fault_free):
    """A seeded `[random_faults]` table (per-chip MTBF, exponential repair times) draws explicit faults before the
    run: here a chip loss on learner 1 and a freeze of learner 0. Every drawn fault fires on its step, every
    killed learner comes back after its own drawn repair delay, and training ends as well as without faults."""
    table = scenario([]).to_dict()
    table.pop("random_faults_source")
    table["faults"] = []
    table["random_faults"] = {"mtbf_steps": 400, "actions": {"kill_chip": 2, "freeze": 1}, "repair": "exponential",
                              "repair_mean_s": 1.0, "repair_min_s": 0.5, "repair_max_s": 2.0, "freeze_s": 1.5,
                              "start_step": 30, "min_gap_steps": 60}
    sc = from_dict(table)
    assert [f.action for f in sc.faults] == ["kill_chip", "freeze"], "the seeded draw this test is written for"
    res = run_scenario(sc)
    rep, evs = res.report, res.events
    starts = [e for e in evs if e["ev"] == "fault_start"]
    assert [(e["action"], e["learner"]) for e in starts] == [(f.action, f.learner) for f in sc.faults]
    for e, f in zip(starts, sc.faults, strict=True):
        assert "missed" not in e and e["progress"]["steps"][str(f.learner)] >= f.at.step
    down = next(e for e in evs if e["ev"] == "learner_down")
    restart = next(e for e in evs if e["ev"] == "learner_restart")
    assert down["repair_s"] == sc.faults[0].repair_s, "the drawn repair delay, not recovery.repair_s"
    assert restart["t"] - down["t"] >= sc.faults[0].repair_s
    figures = {"faults": [f.describe() for f in sc.faults], "final_eval": rep["final_eval_loss"],
               "fault_free_eval": fault_free["final_eval_loss"], "longest_gap_s": rep["longest_gap_s"],
               "uptime": rep["availability"]["uptime"]}
    res.figures(figures)
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    res.check("faults_fired")
    res.check("rejoined", within_s=REJOIN_S)
    res.check("converged", baseline_loss=fault_free["final_eval_loss"], tolerance=LOSS_TOLERANCE)
    res.check("availability", min_uptime=0.75)  # a freeze of one host and a chip loss on the other can overlap


def test_k_equals_m_failure_is_caught_by_the_availability_invariant(run_scenario, fault_free):
    """The algorithm deliberately broken: K = M = 2. The same chip loss (repaired after 3 s) is run with K = 1,
    where the availability invariant holds, and with K = M, where nobody merges through learner 1's outage:
    there it must fail, naming itself, the measured uptime and the bound."""
    sc = scenario([{"action": "kill_chip", "learner": 1, "chip": 1, "at": at_step(STEPS // 4), "repair_s": 3.0}])
    good = run_scenario(sc, "k-1")
    evs = good.events
    restart = next(e["t"] for e in evs if e["ev"] == "learner_restart")
    assert not [e for e in evs if e["ev"] == "learner_bye" and e["learner"] == 1 and e["t"] < restart], \
        "a failed learner's link closes without BYE: the syncer sees a loss and waits for the restart"
    assert [e for e in evs if e["ev"] == "learner_join" and e["learner"] == 1 and e["t"] > restart], \
        "the restarted learner rejoined the syncer"
    good.check("availability", min_uptime=MIN_UPTIME)
    good.check("converged", baseline_loss=fault_free["final_eval_loss"], tolerance=LOSS_TOLERANCE)
    broken = run_scenario(sc.replace(diloco=type(sc.diloco)(fragments=4, sync_every=4, overlap=1, min_quorum=2)),
                          "k-equals-m")
    with pytest.raises(InvariantViolation, match=r"invariant availability violated: uptime [0-9.]+ < bound 0\.9"):
        broken.check("availability", min_uptime=MIN_UPTIME)


FINISH_IN_OUTAGE = """
name = "finish-in-outage"
seed = 5
algorithm = "decoupled"
[topology]
learners = 2
chips_per_learner = 1
[train]
steps = 120
warmup_steps = 10
[diloco]
fragments = 4
sync_every = 4
overlap = 1
max_staleness = 32
[eval]
every_s = 2.0
batches = 2
[timeouts]
run_s = 240.0
connect_s = 10.0
[recovery]
policy = "restart"
syncer_policy = "restart"
syncer_checkpoint = "every_merge"

[[faults]]
action = "slow"                         # learner 1 at half speed until learner 0's step 100: learner 0
learner = 1                             # finishes first, far ahead, while learner 1 trains on at full speed
speed = 0.5
at = { step = 1, learner = 0 }
until = { step = 100, learner = 0 }

[[faults]]
action = "degrade"                      # learner 0's slow WAN from the syncer's crash on: it rejoins the restored
learner = 0                             # syncer seconds after learner 1, whose merges meanwhile move every fragment
latency_ms = 1000                       # past the versions learner 0's final pushes are based on
at = { step = DEGRADE_AT, learner = 0 }

[[faults]]
action = "kill_syncer"                  # 10 steps before learner 0's last: it finishes while the syncer is down
repair_s = 3.0
at = { step = 110, learner = 0 }
"""
"""Learner 0 finishes while the syncer is down (issue 26), and rejoins the restored syncer after learner 1 has
merged every fragment again. max_staleness 32: its final pushes, based on versions several merges behind, are
judged by the rejoin rule here, not by lagging. connect_s 10: its hand-shake crosses the 1 s latency twice."""


def _finish_in_outage(tmp_path: Any, degrade_at: int) -> Any:
    """The scenario with learner 0's slow WAN from its step `degrade_at`: 110 (the syncer's crash) lets the merges
    of learner 0's earlier pushes reach it before the crash, so each final push holds only unmerged steps; 60 leaves
    learner 0 behind on merges for the last 50 steps, so its final pushes are based on versions the restored syncer
    has moved past, which is what the old before_rejoin rule dropped (and where a final push can be a stale copy:
    docs/metrics.md)."""
    path = tmp_path / "finish-in-outage.toml"
    path.write_text(FINISH_IN_OUTAGE.replace("DEGRADE_AT", str(degrade_at)))
    return path


def test_syncer_crash_failure_keeps_the_final_pushes_of_a_learner_that_finished_meanwhile(run_scenario, tmp_path):
    """Learner 0 finishes its steps while the syncer is down; its link keeps the final pushes (timeouts.
    final_flush_s) and delivers them to the restored syncer, which merges every one of them (a finished learner
    applies nothing, so the before_rejoin rule must not drop them): no discarded work lacks a cause."""
    res = run_scenario(_finish_in_outage(tmp_path, degrade_at=110))
    evs = res.events
    down = next(e for e in evs if e["ev"] == "syncer_down")
    restore = next(e for e in evs if e["ev"] == "syncer_restore")
    done0 = next(e for e in evs if e["ev"] == "learner_done" and e["learner"] == 0)
    assert down["t"] < done0["t"] < restore["t"], "learner 0 must finish while the syncer is down"
    finals = [e for e in evs if e["ev"] == "push" and e["learner"] == 0 and e["final"] and e["t"] > restore["t"]]
    merged = {(m, e["fragment"], a, b) for e in evs if e["ev"] == "merge"
              for m, (a, b) in zip(e["participants"], e["step_ranges"], strict=True)}
    missing = [e for e in finals if (0, e["fragment"], e["first_step"], e["last_step"]) not in merged]
    stale = [e for e in missing if e["outcome"] == "stale"]
    discarded = {m: g["discarded_chip_s"] for m, g in res.report["goodput"]["per_learner"].items()}
    res.figures({"final_pushes": len(finals), "not_merged": len(missing), "stale": len(stale),
                 "discarded_chip_s": discarded})
    assert finals and len(finals) == 4, f"learner 0's four final pushes reach the restored syncer: {finals}"
    # Known gap (docs/metrics.md, "Which work can be discarded"): when the merge of learner 0's last pull was
    # checkpointed but its broadcast died with the syncer, the restored syncer declines the final push as a stale
    # copy; work_kept attributes it to that rule. Issue 29's bounded wait at the overlap's end closes it; until
    # then this run asserts the fix of issue 26 (no final push declined for any other reason, before_rejoin
    # included) and records how many were stale (one fresh-clone CI run in about ten had one).
    assert not [e for e in missing if e["outcome"] != "stale"], f"final pushes of learner 0 not merged: {missing}"
    assert not [e for e in evs if e["ev"] == "final_pushes_given_up"]
    res.check("work_kept")
    res.check("updates_accounted")
    res.check("pushes_received")


def test_syncer_crash_failure_work_kept_catches_final_pushes_dropped_on_rejoin(tmp_path):
    """The same run, learner 0 behind on merges (degrade_at 60), with the old rule back (mutation
    final_before_rejoin, set in the environment of a CLI run, as the mutation switch requires: run processes
    inherit the environment their forkserver started with): the restored syncer declines learner 0's final
    pushes as before_rejoin, its last steps reach no merge, and work_kept fails naming them."""
    runs = tmp_path / "runs"
    env = dict(os.environ, **{ENV_VAR: "final_before_rejoin"})
    scenario = _finish_in_outage(tmp_path, degrade_at=60)
    out = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "run", str(scenario), "--runs-dir",
                          str(runs)], env=env, capture_output=True, text=True, timeout=300)
    (run_dir,) = [d for d in runs.iterdir() if d.is_dir()]
    result = spec("work_kept")(run_dir)
    assert not result.ok and result.figure > 0, (result, out.stdout[-3000:])
    assert "learner 0 steps" in result.detail and "unexplained_final_dropped" in result.detail, result.detail
