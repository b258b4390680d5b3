"""The same chip loss under ddp, elastic_ddp, diloco and decoupled (harness.compare, `diloco-chaos compare`).

The paper's availability claim in one table: with a chip lost and repaired, Decoupled DiLoCo keeps the global
model advancing (higher uptime) and its chips doing more useful work (higher goodput) than the synchronous
baselines, which stall everywhere until the learner is back, at a final eval loss close to fault-free ddp.
Public API only: harness.compare, with every run made by the plugin's `run_scenario` fixture (deadlines,
hygiene), and the invariants through ChaosRun.check. Scaled down from the built-in `chip-loss` scenario
(4 x 2, 300 steps) to 4 x 2, 120 steps; a real cluster runs the same schedule with minutes of repair.
"""

from __future__ import annotations

import pytest

from harness.compare import LOSS_TOLERANCE, compare, table, verdict
from harness.scenario import builtin

pytestmark = [pytest.mark.failure, pytest.mark.timeout(600)]

LEARNERS, STEPS = 4, 120
"""M = 4 as in the built-in scenario. Goodput is a share of the run's time and the repair takes the same 2 s in
every run, while decoupled trains faster than ddp here (no exchange at every step): it loses 1/M of its chips
for the outage, ddp all of them, so decoupled's goodput is ahead only while ddp's run is less than M times as
long. With M = 2 (2 x 2, 160 steps) ddp's run lasted 2.6 x decoupled's (18.9 s against 7.2 s) and its goodput
was ahead (0.873 against 0.839, 2026-12-04). At 4 x 2 on this shared 2-core machine: decoupled 0.928 / 0.899
against ddp 0.859 / 0.886 in two passing runs; a third failed when every process stopped for 2-3 s early in
decoupled's 11 s run (its goodput 0.720 and uptime 0.887, both below ddp's): the machine, not the fault."""
MAX_GAP_S = 1.5
"""Longest the decoupled global model may stand still while a learner is alive (the failure suite's bound)."""


def test_compare_failure_decoupled_beats_the_synchronous_baselines(run_scenario):
    sc = builtin("chip-loss")
    sc = sc.replace(topology=type(sc.topology)(learners=LEARNERS, chips_per_learner=2),
                    train=type(sc.train)(steps=STEPS, warmup_steps=10, budget="total"),
                    diloco=type(sc.diloco)(fragments=4, sync_every=8, overlap=2, min_quorum=1),
                    recovery=type(sc.recovery)(policy="restart", repair_s=2.0),
                    faults=[{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 40, "learner": 0}}])
    rows = {r.label: r for r in compare(sc, runner=run_scenario)}
    print("\n" + table(list(rows.values())))
    # goodput (docs/metrics.md): the share of allocated chip-time on useful training; a step's routine exchange
    # is useful, stalls beyond the local pace, discarded steps and time down or restarting are not.
    # LOSS_TOLERANCE: measured here +0.35, +0.52, +0.29 and +0.38 (asynchronous runs spread)
    claims = verdict(list(rows.values()))
    # goodput and uptime against ddp, elastic_ddp and diloco, elastic_ddp's goodput above ddp's, and the loss
    assert len(claims) == 8, claims
    assert all(c.holds for c in claims), [c for c in claims if not c.holds]
    decoupled = run_scenario.runs[-1]
    assert decoupled.scenario.algorithm == "decoupled"
    decoupled.check("converged", baseline_loss=rows["ddp, fault-free"].final_eval_loss, tolerance=LOSS_TOLERANCE)
    decoupled.check("no_global_downtime", bound_s=MAX_GAP_S)
    decoupled.check("faults_fired")
    decoupled.check("rejoined", within_s=10.0)
