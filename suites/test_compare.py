"""The same chip loss under ddp, elastic_ddp, diloco and decoupled (diloco_chaos.harness.report.compare, `diloco-chaos
compare`).

The paper's availability claim in one table: with a chip lost and repaired, Decoupled DiLoCo keeps the global
model advancing (higher uptime) and its chips doing more useful work (higher goodput) than the synchronous
baselines, which stall everywhere until the learner is back, at a final eval loss close to fault-free ddp.
Each algorithm recovers its own way (recovery.policy = "elastic", as in the built-in scenario); decoupled's
goodput above elastic_ddp's is reported, not asserted (NOT_ASSERTED says why).
Public API only: diloco_chaos.harness.report.compare, with every run made by the plugin's `run_scenario` fixture
(deadlines, hygiene), and the invariants through ChaosRun.check. Scaled down from the built-in `chip-loss` scenario
(4 x 2, 300 steps) to 4 x 2, 120 steps; a real cluster runs the same schedule with minutes of repair.
"""

from __future__ import annotations

from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import builtin
from diloco_chaos.harness.report.compare import compare, compared, loss_allowance, table, verdict

pytestmark = [pytest.mark.failure, pytest.mark.timeout(600)]

LEARNERS, STEPS = 4, 120
"""M = 4 as in the built-in scenario. Goodput is a share of the run's time and the repair takes the same 2 s in
every run, while decoupled trains faster than ddp here (no exchange at every step): it loses 1/M of its chips
for the outage, ddp all of them, so decoupled's goodput is ahead only while ddp's run is less than M times as
long. With M = 2 (2 x 2, 160 steps) ddp's run lasted 2.6 x decoupled's (18.9 s against 7.2 s) and its goodput
was ahead (0.873 against 0.839, 2026-12-04). At 4 x 2 on this shared 2-core machine: decoupled 0.928 / 0.899
against ddp 0.859 / 0.886 in two passing runs; a third failed when every process stopped for 2-3 s early in
decoupled's 11 s run (its goodput 0.720 and uptime 0.887, both below ddp's): the machine, not the fault."""
NOT_ASSERTED = "decoupled goodput above elastic_ddp"
"""The one claim of compare's verdict this suite does not assert, with the reason measured. Under recovery.policy
= "elastic" elastic_ddp is elastic at chip granularity like decoupled: both lose learner 1's one dead chip for the
same outage (2 s repair plus the chip's start and join), and elastic_ddp's extra cost, every learner waiting
while learner 1 re-forms its Gloo group, is 0.01-0.04 s on localhost (docs/algorithm.md, Baselines), within
its step-to-step noise. Decoupled's run is shorter (no exchange every step), so the same one-chip outage is a
larger share of it: here decoupled 0.920 against elastic_ddp 0.966 (spans ~5 s and ~8 s, 2026-12-04, quiet
machine); on the built-in 4 x 2, 300-step scenario 0.973 against 0.987. The paper's ranking rests on elastic
data parallel paying a whole-job downtime per reconfiguration, which a localhost regroup does not. The run
records both figures (`figures`) and the verdict still reports the claim."""
MAX_GAP_S = 1.5
"""Longest the decoupled global model may stand still while a learner is alive (the failure suite's bound)."""


def compare_scenario() -> Any:
    """The built-in chip-loss scenario scaled down: 4 x 2, STEPS steps of total budget, one chip lost."""
    sc = builtin("chip-loss")
    return sc.replace(topology=type(sc.topology)(learners=LEARNERS, chips_per_learner=2),
                      train=type(sc.train)(steps=STEPS, warmup_steps=10, budget="total"),
                      diloco=type(sc.diloco)(fragments=4, sync_every=8, overlap=2, min_quorum=1),
                      recovery=type(sc.recovery)(policy="elastic", repair_s=2.0),
                      faults=[{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 40, "learner": 0}}])


def test_compare_failure_decoupled_beats_the_synchronous_baselines(run_scenario):
    sc = compare_scenario()
    rows = {r.label: r for r in compare(sc, algorithms=compared(), runner=run_scenario)}  # the builtin system
    print("\n" + table(list(rows.values())))
    # goodput (docs/metrics.md): the share of allocated chip-time on useful training; a step's routine exchange
    # is useful, stalls beyond the local pace, discarded steps and time down or restarting are not.
    # the loss claim's bound: the parity curve at STEPS plus the measured spread
    # (diloco_chaos.harness.report.compare.loss_allowance)
    claims = verdict(list(rows.values()))
    # goodput and uptime against ddp, elastic_ddp and diloco, elastic_ddp's goodput above ddp's, and the loss
    assert len(claims) == 8, claims
    asserted = [c for c in claims if c.claim != NOT_ASSERTED]
    assert len(asserted) == 7 and all(c.holds for c in asserted), [c for c in asserted if not c.holds]
    decoupled = run_scenario.runs[-1]
    assert decoupled.scenario.algorithm == "decoupled"
    decoupled.figures({NOT_ASSERTED: next(f"{c.figures} ({'holds' if c.holds else 'does not hold'})"
                                          for c in claims if c.claim == NOT_ASSERTED)})
    decoupled.check("converged", baseline_loss=rows["ddp, fault-free"].final_eval_loss,
                    tolerance=loss_allowance(STEPS))
    decoupled.check("no_global_downtime", bound_s=MAX_GAP_S)
    decoupled.check("faults_fired")
    decoupled.check("rejoined", within_s=10.0)
