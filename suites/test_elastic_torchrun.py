"""elastic_ddp restarted as production restarts it (`[elastic] engine = "torchrun"`), through a chip loss, and
compare's verdict against decoupled on the same scenario (real processes; issue 29 item 5).

Every chip of the 2 learners x 2 chips is a worker of one torchrun elastic job; killing chip 1 of learner 1 makes
torchrun stop every worker, rendezvous again and start them all, and they resume from the checkpoint global
rank 0 wrote every CHECKPOINT_EVERY steps. Asserted: every worker is a new process, each restart phase was
measured (positive durations), the steps after the checkpoint were redone and counted as lost (the syncer's
rollback, goodput's discarded chip-time), the run converges, nothing is left behind (the plugin's hygiene), and
compare's verdict on decoupled vs elastic_ddp is computed and reported with both goodputs, whichever way it falls.
Public API: the pytest plugin's run_scenario fixture, diloco_chaos.harness.config.scenario.from_dict and
diloco_chaos.harness.report.compare.
"""

from __future__ import annotations

from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.report.compare import compare, verdict
from diloco_chaos.harness.report.results import ResultsFile, to_json

pytestmark = [pytest.mark.failure, pytest.mark.timeout(400)]

STEPS = 100
KILL_AT = 50
CHECKPOINT_EVERY = 20
MAX_FINAL_EVAL = 2.6
"""The run must have trained: the byte LM starts at ~5.56 and the fault-free 2x2 ddp run of 100 steps ends near
2.3 (measured 2.29 with this restart); the bound leaves room for the redone steps and the machine's noise."""


def scenario(algorithm: str = "elastic_ddp") -> Any:
    return from_dict({
        "name": "elastic-torchrun-chip-loss", "seed": 0, "algorithm": algorithm,
        "topology": {"learners": 2, "chips_per_learner": 2},
        "train": {"steps": STEPS},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 300.0},
        "recovery": {"policy": "elastic", "repair_s": 1.0},
        "elastic": {"engine": "torchrun", "checkpoint_every": CHECKPOINT_EVERY, "max_restarts": 2,
                    "rdzv_timeout_s": 60.0},
        "faults": [{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": KILL_AT, "learner": 0}}],
    })


def test_torchrun_restarts_every_worker_from_the_checkpoint_and_compare_judges_it(run_scenario):
    runs: dict[str, Any] = {}

    def runner(sc: Any) -> Any:
        runs[sc.algorithm] = run_scenario(sc, name=sc.algorithm)
        return runs[sc.algorithm]

    rows = compare(scenario(), algorithms=("elastic_ddp", "decoupled"), baseline=False, runner=runner)
    el = runs["elastic_ddp"]
    evs = el.events
    starts = [e for e in evs if e["ev"] == "chip_start"]
    first = {(e["learner"], e["rank"]): e["pid"] for e in starts if e["generation"] == 0}
    again = {(e["learner"], e["rank"]): e["pid"] for e in starts if e["generation"] == 1}
    assert set(first) == set(again) == {(m, r) for m in range(2) for r in range(2)}, starts
    assert all(first[k] != again[k] for k in first), "every worker restarted as a new process"

    phases = el.report["elastic_restarts"]
    assert phases["restarts"] == 1, phases
    for name, s in phases["per_restart"][0]["phases"].items():
        assert s is not None and s > 0, f"phase {name} not measured: {phases}"
    kill = next(e for e in evs if e["ev"] == "process_fault")
    ckpt = max(e["step"] for e in evs if e["ev"] == "elastic_checkpoint" and e["t"] < kill["t"])
    rb = next(e for e in evs if e["ev"] == "elastic_rollback")
    assert rb["to_step"] == ckpt and rb["from_step"] > ckpt, (rb, ckpt)
    assert phases["steps_redone"] == rb["from_step"] - rb["to_step"]
    resumes = [e for e in evs if e["ev"] == "resume"]
    assert sorted(e["learner"] for e in resumes) == [0, 1] and all(e["step"] == ckpt for e in resumes)
    redone = [e for e in evs if e["ev"] == "step" and ckpt < e["step"] <= rb["from_step"]]
    assert len({(e["learner"], e["step"]) for e in redone}) < len(redone), "steps after the checkpoint redone"
    assert el.report["goodput"]["discarded_chip_s"] > 0, "the first doing of the redone steps counts as lost"
    assert el.report["final_eval_loss"] < MAX_FINAL_EVAL, el.report["final_eval_loss"]

    row = next(r for r in rows if r.algorithm == "elastic_ddp")
    assert row.restart_phases is not None and row.restart_phases.restarts == 1
    assert row.restart_phases.steps_redone == phases["steps_redone"]
    out = to_json(ResultsFile(command="compare", runs=tuple(rows), claims=tuple(verdict(rows))))
    written = next(r for r in out["runs"] if r["algorithm"] == "elastic_ddp")["restart_phases"]
    assert written["restarts"] == 1 and written["steps_redone"] == phases["steps_redone"]
    listed = written["phases_s"]
    assert set(listed) >= {"detect", "stop", "rendezvous", "spawn", "worker_init", "pg_init", "checkpoint_load"}
    dec = next(r for r in rows if r.algorithm == "decoupled")
    claim = next(c for c in verdict(rows) if c.claim == "decoupled goodput above elastic_ddp")
    assert claim.holds == (dec.goodput > row.goodput), claim  # computed and reported, whichever way it falls
    el.figures({"decoupled_goodput": dec.goodput, "elastic_ddp_goodput": row.goodput,
                "verdict_decoupled_above": claim.holds, **{f"phase_{k}_s": v for k, v in listed.items()}})
    print(f"\ndecoupled goodput {dec.goodput} vs elastic_ddp (torchrun) {row.goodput}: "
          f"{'holds' if claim.holds else 'does not hold'}; phases {listed}")
