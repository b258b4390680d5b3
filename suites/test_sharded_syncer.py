"""Sharded synchronizer suite: one shard of two is SIGKILLed mid-run; the other keeps merging its fragments.

The claim (docs/sharded-syncer.md): with `syncer.shards = 2`, losing shard 0 stops only shard 0's fragments.
While it is down, shard 1 merges its own fragments and the learners keep training; after its repair delay the
supervisor starts shard 0 again on its port, it restores its fragments from its own checkpoint slots and merges
again; no update is lost or merged twice and the tokens each shard counts are the tokens of the steps its
merges took in (both invariants per shard). A run with one shard (the default) is the existing suites' business
(suites/test_process_failure.py's syncer crash runs unchanged).

Public API only: the diloco-chaos pytest plugin's run_scenario fixture and
diloco_chaos.harness.config.scenario.from_dict.
"""

from __future__ import annotations

from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict

pytestmark = [pytest.mark.failure, pytest.mark.syncer, pytest.mark.timeout(300)]

STEPS = 320
"""Long enough that shard 0 is back (repair, restore, the learners' reconnect backoff) well before the learners
finish: at ~50 steps/s per learner on an idle machine the 280 steps after the kill take over 5 s."""
SYNCER_REPAIR_S = 1.5
MAX_GAP_S = 1.5
"""Longest the global model may stand still while a learner is connected to some shard (fault-free: ~0.1 s)."""
BACK_S = 5.0
"""After its repair delay, the restored shard must merge again within this."""


def scenario(faults: list[dict[str, Any]], shards: int = 2) -> Any:
    return from_dict({
        "name": "sharded-syncer",
        "seed": 5,
        "topology": {"learners": 2, "chips_per_learner": 1},
        "train": {"steps": STEPS, "warmup_steps": 10},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 200.0},
        "recovery": {"policy": "restart", "syncer_policy": "restart", "syncer_repair_s": SYNCER_REPAIR_S},
        "syncer": {"shards": shards},
        "faults": faults,
    })


def test_one_shard_down_the_other_merges_on(run_scenario):
    res = run_scenario(scenario([{"action": "kill_syncer", "shard": 0, "at": {"step": STEPS // 8, "learner": 0}}]))
    rep, evs = res.report, res.events
    kill = next(e for e in evs if e["ev"] == "process_fault")
    assert kill["kind"] == "kill_syncer" and kill["shard"] == 0 and len(kill["pids"]) == 1
    down = next(e for e in evs if e["ev"] == "syncer_down")
    restart = next(e for e in evs if e["ev"] == "syncer_restart")
    restore = next(e for e in evs if e["ev"] == "syncer_restore")
    assert down["shard"] == restart["shard"] == 0 and restore["proc"] == "syncer.s0"
    assert restart["t"] - down["t"] >= SYNCER_REPAIR_S
    owned = {e["shard"]: set(e["owned"]) for e in evs if e["ev"] == "syncer_start"}
    assert owned[0] | owned[1] == {0, 1, 2, 3} and not owned[0] & owned[1], owned
    merges = [e for e in evs if e["ev"] == "merge"]
    assert all(e["fragment"] in owned[int(e["proc"][-1])] for e in merges), "a shard merged a fragment it does not own"
    during = [e for e in merges if kill["t"] < e["t"] < restore["t"]]
    back = [e for e in merges if e["proc"] == "syncer.s0" and e["t"] > restore["t"]]
    steps_out = {m: sum(1 for e in evs if e["ev"] == "step" and e["learner"] == m and kill["t"] < e["t"] < restart["t"])
                 for m in (0, 1)}
    figures = {"merges_in_outage": len(during), "shard0_merges_after": len(back),
               "shard0_back_after_s": round(back[0]["t"] - restart["t"], 3) if back else None,
               "steps_in_outage": steps_out, "shards": rep["shards"], "final_eval": rep["final_eval_loss"]}
    res.figures(figures)
    assert during and all(e["proc"] == "syncer.s1" for e in during), f"shard 1 did not merge on: {figures}"
    assert back and back[0]["t"] - restart["t"] < BACK_S, f"shard 0 did not merge again after its restore: {figures}"
    # the report's outage runs from the kill to shard 0's first merge after its restore
    assert rep["shards"]["0"]["merges_in_outage"] == sum(1 for e in merges if kill["t"] < e["t"] < back[0]["t"])
    assert all(n >= 5 for n in steps_out.values()), f"learners stalled while shard 0 was down: {figures}"
    assert rep["syncer_restarts"] == 1 and rep["shards"]["0"]["restarts"] == 1 and rep["shards"]["1"]["restarts"] == 0
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    for name in ("updates_accounted", "token_accounting", "model_finite"):
        res.check(name)
    res.check("no_global_downtime", bound_s=MAX_GAP_S)  # shard 1 advanced the global model through the outage
    pull = [e for e in evs if e["ev"] == "apply"]
    assert {q for e in pull for q in e["fragments"]} == {0, 1, 2, 3}, "learners applied every shard's fragments"


def test_every_shard_down_then_each_restores_its_own(run_scenario):
    """`kill_syncer` without `shard` kills every shard: each is restored from its own checkpoint slots on its own
    port, each merges its own fragments again, and no update is lost or merged twice across the two restores."""
    res = run_scenario(scenario([{"action": "kill_syncer", "at": {"step": STEPS // 8, "learner": 0}}]))
    rep, evs = res.report, res.events
    kill = next(e for e in evs if e["ev"] == "process_fault")
    assert kill["kind"] == "kill_syncer" and kill.get("shard") is None and len(kill["pids"]) == 2
    restarts = {e["shard"]: e for e in evs if e["ev"] == "syncer_restart"}
    restores = {e["proc"]: e for e in evs if e["ev"] == "syncer_restore"}
    assert set(restarts) == {0, 1} and set(restores) == {"syncer.s0", "syncer.s1"}, (restarts, restores)
    owned = {e["shard"]: set(e["owned"]) for e in evs if e["ev"] == "syncer_start"}
    assert set(restores["syncer.s0"]["fragments"]) == owned[0] and set(restores["syncer.s1"]["fragments"]) == owned[1]
    merges = [e for e in evs if e["ev"] == "merge"]
    back = {k: [e for e in merges if e["proc"] == f"syncer.s{k}" and e["t"] > restores[f"syncer.s{k}"]["t"]]
            for k in (0, 1)}
    res.figures(shards=rep["shards"], merges_after={k: len(v) for k, v in back.items()},
                final_eval=rep["final_eval_loss"])
    assert all(back.values()), f"a shard did not merge again after its restore: {rep['shards']}"
    assert rep["syncer_restarts"] == 2 and all(rep["shards"][k]["restarts"] == 1 for k in ("0", "1"))
    assert all(d["steps"] == STEPS for d in rep["per_learner"].values())
    for name in ("updates_accounted", "token_accounting", "model_finite"):
        res.check(name)
