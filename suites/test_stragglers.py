"""Mixed-speed learners: learners held to a speed profile from outside their training loop (SIGSTOP/SIGCONT).

Decoupled DiLoCo's claim: learners never wait for each other, so a slow learner (an older hardware generation)
slows only itself. The `slow` fault holds a learner to `speed` x the progress of the learners that are not
slowed (a feedback controller on the steps in the event log, diloco_chaos/chaos/processes.py); the suite checks the
achieved ratio (report.json `speed_profiles`) is the profile within +-15%, that the fast learners run at the
speed they have when nobody is slow, and that a transient straggler is released after its window (no longer
held to its profile). Each test also checks a convergence invariant (converged: the final eval loss well below the
initial one; model_finite) and availability invariants (no_global_downtime with a learner alive, uptime) of
diloco_chaos/harness/invariants/, whose figures it prints: a slow learner must neither stall nor spoil the global
model. Public API only: the diloco-chaos pytest plugin (the run_scenario and cluster fixtures, which also check after
every test that no process of its runs is alive and no port bound) and diloco_chaos.harness.config.scenario.from_dict.

Scaling to a real cluster: `slow` models a chip generation at `speed` of the newest; there it is the hardware
itself, and the same assertions (achieved speed per learner, the fast learners unaffected) apply.
"""

from __future__ import annotations

from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.report.tolerance import Reference

pytestmark = [pytest.mark.straggler, pytest.mark.timeout(600)]
"""600 s: a test's first use of the shared full-speed run (`cluster`) runs it inside that test's budget."""

STEPS = 160
TOLERANCE = 0.15
"""Achieved speed within +-15% of the profile (issue 4)."""
FAST_FLOOR = 0.85
"""The fast learners keep at least this fraction of their steps/s (summed) in the run where nobody is slow."""
FULL_SPEED = Reference("stragglers full-speed", mean=2.287, sd=0.044, cost=0.0)
"""The run where nobody is slow (bench/tolerances.py, docs/metrics.md "Loss tolerances"): its run-to-run spread
(8 runs: the bench's 6 and this suite's own 2), and what two half-speed learners may cost: nothing (they ended
0.05 and 0.12 below their twin). A run with stragglers may end at most FULL_SPEED.tolerance() above its
full-speed twin."""
TRANSIENT = Reference("stragglers 2x1 240 steps", mean=2.3094, sd=0.019, cost=0.0)
"""The transient test's scenario without its straggler (2 x 1, TRANSIENT_STEPS steps), measured the same way;
the run with the straggler ended 0.02 below it twice (cost 0) and may end at most TRANSIENT.bound()."""
MAX_GAP_S = 1.5
"""Longest the global model may stand still while at least K = 1 learner is alive: the fast learners keep it
moving whatever the slow ones do (a fault-free decoupled run: ~1 s at worst on this shared 2-core machine)."""
MIN_UPTIME = 0.9
"""Uptime (diloco_chaos/harness/report/metrics.py: the training span minus merge gaps beyond their first second) with
stragglers; K = 1 never waits for them, so it stays near 1.0 (docs/process-chaos.md measured 1.00)."""


def scenario(faults: list[dict[str, Any]], learners: int = 4, steps: int = STEPS) -> Any:
    return from_dict({
        "name": "stragglers",
        "seed": 9,
        "algorithm": "decoupled",
        "topology": {"learners": learners, "chips_per_learner": 1},
        "train": {"steps": steps, "warmup_steps": 10},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 3.0, "batches": 2},
        "faults": faults,
    })


@pytest.fixture
def full_speed(cluster) -> dict[str, Any]:
    """The run of the same scenario and seed where nobody is slow: run once per module, shared by the tests."""
    return cluster(scenario([]), "full-speed").report


def check_invariants(res: Any, **converged: Any) -> None:
    """Convergence (`converged` with the given bounds) and availability invariants, with their figures printed
    (they raise naming both)."""
    res.check("converged", **converged)
    res.check("model_finite")
    res.check("no_global_downtime", bound_s=MAX_GAP_S, min_alive=1)
    res.check("availability", min_uptime=MIN_UPTIME)


def test_straggler_two_half_speed_learners_achieve_their_profile(run_scenario, full_speed):
    res = run_scenario(scenario([{"action": "slow", "learner": m, "speed": 0.5} for m in (2, 3)]))
    rep = res.report
    profiles = {p["learner"]: p for p in rep["speed_profiles"]}
    fast = {m: rep["per_learner"][str(m)]["steps_per_s"] for m in (0, 1)}
    ref = {m: full_speed["per_learner"][str(m)]["steps_per_s"] for m in (0, 1)}
    res.figures({"achieved": {m: p["achieved"] for m, p in profiles.items()},
                 "window_s": {m: p["window_s"] for m, p in profiles.items()}, "fast_steps_s": fast,
                 "fast_steps_s_nobody_slow": ref, "final_eval": rep["final_eval_loss"],
                 "final_eval_nobody_slow": full_speed["final_eval_loss"]})
    assert sorted(profiles) == [2, 3]
    for m, p in profiles.items():
        assert p["achieved"] is not None and abs(p["achieved"] - 0.5) <= TOLERANCE * 0.5, \
            f"learner {m}: achieved {p['achieved']}, profile 0.5 +- {TOLERANCE:.0%}"
    # Summed over the fast learners: with four chips on two cores the scheduler shares the CPU unevenly between
    # them, and not the same way in every run (CI: learners 0 and 1 at 17.7 and 23.2 steps/s with nobody slow)
    assert sum(fast.values()) >= FAST_FLOOR * sum(ref.values()), f"the fast learners waited for the slow ones: " \
        f"{fast} vs {ref}"
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    check_invariants(res, baseline_loss=full_speed["final_eval_loss"], tolerance=FULL_SPEED.tolerance())


TRANSIENT_STEPS = 240
"""The transient test's run: a 100-step window (learner 0's steps 40 to 140) and 100 steps after it. The slow
controller's error is a step or two whatever the window (diloco_chaos/chaos/processes.py): over a 60-step window, 18
steps at 0.3, it achieved 0.27-0.36 here (CI failed once at 0.356); over 100 steps 0.290-0.299 in 20 runs."""
UNHELD_FLOOR = 0.6
"""After its window the transient straggler is no longer held to its profile: its steps/s over learner 0's is
at least twice the profile 0.3. Not 1.0: two chips, the syncer, the proxy and the link processes share two
cores, and which chip shares a core with the rest decides. Measured here over the 100 steps after the window,
20 runs: 0.77-1.37, median 1.02; with nobody slow, over learner 0's first 40 steps, as low as 0.63."""


def test_straggler_transient_window_then_released(run_scenario):
    """Learner 1 at 0.3 while learner 0 goes from step 40 to 140; afterwards it is no longer held to 0.3."""
    res = run_scenario(scenario([{"action": "slow", "learner": 1, "speed": 0.3, "at": {"step": 40, "learner": 0},
                                  "until": {"step": 140, "learner": 0}}], learners=2, steps=TRANSIENT_STEPS))
    rep, evs = res.report, res.events
    (p,) = rep["speed_profiles"]
    off = next(e["t"] for e in evs if e["ev"] == "process_fault_off")
    done0 = next(e["t"] for e in evs if e["ev"] == "learner_done" and e["learner"] == 0)

    def steps_between(m: int, a: float, b: float) -> int:
        s = [e["step"] for e in evs if e["ev"] == "step" and e["learner"] == m and a <= e["t"] <= b]
        return max(s) - min(s) if len(s) > 1 else 0

    after = (steps_between(1, off, done0), steps_between(0, off, done0))
    res.figures({"achieved": p["achieved"], "window_s": p["window_s"], "steps_after_window": after,
                 "final_eval": rep["final_eval_loss"]})
    assert abs(p["achieved"] - 0.3) <= TOLERANCE * 0.3, f"achieved {p['achieved']}, profile 0.3 +- {TOLERANCE:.0%}"
    assert after[0] >= UNHELD_FLOOR * after[1], f"learner 1 still held after its window: {after} steps " \
        f"(learner 1, learner 0), floor {UNHELD_FLOOR}"
    check_invariants(res, max_loss=TRANSIENT.bound())


def test_straggler_under_ddp_ending_at_a_step_is_not_held_for_ever(run_scenario):
    """ddp's learners wait for the straggler's gradient every step, so the others' progress stands still while it
    is held: held to `speed` x that progress it was stopped for ever and a straggler window ending at a step never
    ended (a ddp run stood at step ~153 until stopped). With the others stalled the controller runs a duty cycle
    of the straggler's own pace (diloco_chaos/chaos/processes.py, STALLED_OTHERS_S): the run finishes."""
    sc = from_dict({**scenario([]).to_dict(), "algorithm": "ddp", "name": "stragglers-ddp",
                    "topology": {"learners": 2, "chips_per_learner": 1}, "train": {"steps": 60, "warmup_steps": 5},
                    "faults": [{"action": "slow", "learner": 1, "speed": 0.5, "at": {"step": 10, "learner": 0},
                                "until": {"step": 30, "learner": 0}}]})
    res = run_scenario(sc)
    ends = [e for e in res.events if e["ev"] == "fault_end"]
    res.figures(wall_s=res.report["wall_s"], slow_ended_t=[round(e["t"], 2) for e in ends])
    assert ends, "the straggler window never ended"
    assert all(d["steps"] == 60 for d in res.report["per_learner"].values()), res.report["per_learner"]
