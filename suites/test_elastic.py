"""Elastic data parallel through a chip loss, against plain ddp on the same scenario (real processes).

Two recoveries: under the restart policy the elastic unit is the learner (it leaves the global group and
rejoins after its restart); under the elastic policy (shrink for elastic_ddp) the learner's surviving chip
re-forms its group and the learner stays in the global group with fewer chips, every learner waiting only
while it re-forms.

The paper's comparator: elastic data parallel (slice granularity) goes on with the learners left while a lost
one is repaired, stalling only while the group reconfigures; plain data parallel stalls everywhere until the
learner is back. Each run kills chip 1 of learner 1 (SIGKILL by pid) when learner 0 reaches step 30; under the
restart policy the supervisor stops the learner's other chip (which closes its link: the signal elastic_ddp
reconfigures on) and restarts it after `REPAIR_S`; it resumes from the syncer's state at a step boundary.
Public API only: the diloco-chaos pytest plugin's run_scenario fixture and
diloco_chaos.harness.config.scenario.from_dict.
"""

from __future__ import annotations

from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.report.tolerance import SEED_SD, Reference

pytestmark = [pytest.mark.failure, pytest.mark.timeout(300)]

STEPS = 120
KILL_AT = 30
REPAIR_S = 2.0
FAULT_FREE = Reference("elastic ddp fault-free", mean=2.3138, sd=SEED_SD, cost=0.15)
"""ddp's fault-free run of this scenario (elastic_ddp computes the same steps without a fault), measured by
bench/tolerances.py (docs/metrics.md, "Loss tolerances"): it repeats exactly on one machine (sd:
diloco_chaos.harness.report.tolerance.SEED_SD); the chip loss may cost what it was measured to cost under either policy,
rounded up. Each elastic_ddp run with the chip loss must end at most FAULT_FREE.bound()."""
SHRINK_STALL_S = 0.5
"""Longest the survivors may wait at the barrier on the lost learner (the shrink's `elastic_reconfigure`
stall_s). A chip death closes the learner's link within ~0.2 s of the kill, often before the survivors' next
gradient is in (measured 0.0 and 0.014 s in this test's runs); the bound is a quarter of the repair
delay."""
GROW_STALL_S = 1.0
"""Longest the members may wait on the rejoining learner's first gradient (the grow's stall_s): it loads the
state and computes one step in a fresh process (measured 0.08, 0.15 and 0.18 s in this test's runs; single
steps of up to ~1 s were seen on this machine while others loaded it). Half the repair delay."""
MAX_GAP_IN_OUTAGE_S = REPAIR_S / 2
"""Longest interval without a merge from the kill until learner 1 is back, for elastic_ddp (measured 0.44 and
0.45 s). The reconfiguration costs a few hundredths of a second; the rest is the machine's own step-time noise
(steps of up to ~1 s on this shared 2-core machine). ddp's gap over the same window is the whole repair delay
(>= REPAIR_S; measured 2.29 and 2.68 s)."""


MIN_ALONE_MERGES = 10
"""Steps learner 0 must merge alone while learner 1 is down (about REPAIR_S plus its restart): measured 50 with
the machine lightly shared and 19 at a load average of 25 on its 2 cores."""
MAX_DDP_MERGES_IN_OUTAGE = 2
"""ddp over the same window: the step in flight when the chip died (its host may have sent that gradient
already) and learner 1's first step back (merged just before its step event is logged); measured 1 and 2."""


def scenario(algorithm: str, policy: str = "restart") -> Any:
    return from_dict({
        "name": "elastic-chip-loss",
        "seed": 11,
        "algorithm": algorithm,
        "topology": {"learners": 2, "chips_per_learner": 2},
        "train": {"steps": STEPS, "warmup_steps": 10},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 200.0},
        "recovery": {"policy": policy, "repair_s": REPAIR_S, "max_restarts": 1},
        "faults": [{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": KILL_AT, "learner": 0}}],
    })


def outage(evs: list[dict[str, Any]]) -> tuple[float, float, list[dict[str, Any]]]:
    """(kill time, learner 1's first step after its restart, the merges in between)."""
    t_down = next(e["t"] for e in evs if e["ev"] == "fault_start")
    restart = next(e["t"] for e in evs if e["ev"] == "learner_restart" and e["learner"] == 1)
    back = next(e["t"] for e in evs if e["ev"] == "step" and e["learner"] == 1 and e["t"] > restart)
    return t_down, back, [e for e in evs if e["ev"] == "merge" and t_down <= e["t"] <= back]


def longest_gap(t0: float, t1: float, merges: list[dict[str, Any]]) -> float:
    ts = [t0, *(e["t"] for e in merges), t1]
    return max(b - a for a, b in zip(ts, ts[1:], strict=False))


def test_elastic_ddp_trains_through_a_chip_loss_while_ddp_stalls(run_scenario):
    el = run_scenario(scenario("elastic_ddp"), name="elastic_ddp")
    evs = el.events
    t_down, back, merges = outage(evs)
    recs = [e for e in evs if e["ev"] == "elastic_reconfigure"]
    assert [(e["kind"], e["learner"], e["members_before"], e["members_after"]) for e in recs] == \
        [("shrink", 1, [0, 1], [0]), ("grow", 1, [0], [0, 1])], recs
    shrink, grow = recs
    assert shrink["t"] - t_down < REPAIR_S / 2, "the loss is known from the link's close, not the repair"
    resume = next(e for e in evs if e["ev"] == "resume" and e["learner"] == 1)
    assert grow["step"] == resume["step"] + 1, "admitted at the step after the state it was sent"
    alone = [e for e in merges if e["participants"] == [0]]
    ddp = run_scenario(scenario("ddp"), name="ddp")
    d_down, d_back, d_merges = outage(ddp.events)
    figures = {
        "elastic_merges_in_outage": len(merges), "elastic_merges_learner0_alone": len(alone),
        "elastic_max_gap_in_outage_s": round(longest_gap(t_down, back, merges), 3),
        "shrink_stall_s": round(shrink["stall_s"], 4), "grow_stall_s": round(grow["stall_s"], 4),
        "elastic_outage_s": round(back - t_down, 3), "elastic_final_eval": el.report["final_eval_loss"],
        "ddp_merges_in_outage": len(d_merges), "ddp_max_gap_in_outage_s": round(longest_gap(d_down, d_back,
                                                                                           d_merges), 3),
        "ddp_final_eval": ddp.report["final_eval_loss"],
    }
    el.figures(figures)
    assert shrink["stall_s"] <= SHRINK_STALL_S and grow["stall_s"] <= GROW_STALL_S, figures
    assert figures["elastic_max_gap_in_outage_s"] <= MAX_GAP_IN_OUTAGE_S, figures
    assert len(alone) >= MIN_ALONE_MERGES, f"learner 0 did not train on alone while learner 1 was down: {figures}"
    assert figures["ddp_max_gap_in_outage_s"] >= REPAIR_S, f"ddp must stall for the repair: {figures}"
    assert len(d_merges) <= MAX_DDP_MERGES_IN_OUTAGE, f"ddp merged without learner 1: {figures}"
    assert all(d["steps"] == STEPS for d in el.report["per_learner"].values()), el.report["per_learner"]
    el.check("converged", max_loss=FAULT_FREE.bound())
    el.check("updates_accounted")
    el.check("token_accounting")
    el.check("model_finite")


REGROUP_STALL_S = REPAIR_S / 2
"""Longest the global model may stand still around learner 1's regroups under the shrink path (the interval
between the merges either side of its host's regroup, after the kill and when the repaired chip joins): every
learner waits at the barrier for learner 1's gradient while it re-forms. Measured in three runs of this test on
a quiet machine: 0.058, 0.128 and 0.088 s after the kill (the survivors re-formed 0.01-0.06 s after it), 0.083,
0.081 and 0.067 s around the join, against ~0.04 s steps; the bound leaves room for this shared machine's
single steps of up to ~1 s under load, as MAX_GAP_IN_OUTAGE_S does."""


def chip_loss_events(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """The shrink path's events for learner 1: its shrink, its host's regroups, the repaired chip joining."""
    return {
        "kill": next(e["t"] for e in evs if e["ev"] == "fault_start"),
        "shrink": [e for e in evs if e["ev"] == "learner_shrink"],
        "regroups": [e for e in evs if e["ev"] == "regroup" and e["learner"] == 1 and e["chip"] == 0],
        "joined": [e for e in evs if e["ev"] == "chip_joined"],
        "merges": [e for e in evs if e["ev"] == "merge"],
    }


def gap_around(t: float, merges: list[dict[str, Any]]) -> float:
    """The interval between the last merge before `t` and the first one after it."""
    before = max(e["t"] for e in merges if e["t"] <= t)
    after = min(e["t"] for e in merges if e["t"] > t)
    return after - before


def test_elastic_ddp_shrinks_the_learner_and_keeps_it_in_the_global_group(run_scenario):
    """recovery.policy = 'elastic': learner 1 loses chip 1, goes on with one chip in the global group (every step
    averaged over both learners, its gradient weighted by its tokens); every learner waits only while it
    re-forms; the repaired chip joins at a step boundary and receives the state."""
    run = run_scenario(scenario("elastic_ddp", policy="elastic"), name="elastic_ddp_shrink")
    evs = run.events
    ev = chip_loss_events(evs)
    start = next(e for e in evs if e["ev"] == "run_start")
    assert start["learner_policy"] == "shrink", start
    assert [(e["learner"], e["lost"], e["members"]) for e in ev["shrink"]] == [(1, [1], [0])], ev["shrink"]
    assert not [e for e in evs if e["ev"] in ("learner_down", "learner_restart", "elastic_reconfigure")], \
        "the learner stays in the global group: no learner-level drop"
    assert [(e["size"], e["why"].split(":")[0]) for e in ev["regroups"]] == \
        [(1, "collective failed"), (2, "membership changed")], ev["regroups"]
    assert [(e["learner"], e["chip"], e["size"]) for e in ev["joined"]] == [(1, 1, 2)], ev["joined"]
    shrunk, grown = ev["regroups"]
    joined = ev["joined"][0]
    assert joined["step"] == grown["step"], "the repaired chip took the host's state at the step boundary"
    one_chip = [e for e in evs if e["ev"] == "step" and e["learner"] == 1 and shrunk["t"] <= e["t"] <= grown["t"]]
    assert one_chip and all(e["chips"] == 1 for e in one_chip), "learner 1 trains on with its one chip"
    assert all(e["participants"] == [0, 1] for e in ev["merges"]), "every global step waits for learner 1"
    full = next(e["tokens"] for e in evs if e["ev"] == "step" and e["learner"] == 1)
    merged = {e["step"]: dict(zip(e["participants"], e["c_tokens"], strict=True)) for e in ev["merges"]}
    assert all(merged[e["step"]][1] == e["tokens"] for e in one_chip), "each step logs the tokens merged for it"
    # The step in flight at the kill is redone with one chip; when the syncer had already answered its exchange
    # (the chip died in the broadcast after it), the merge holds the two-chip gradient and the step logs that.
    assert all(e["tokens"] * 2 == full for e in one_chip[1:]), "its gradient is weighted by its (halved) tokens"
    assert one_chip[0]["tokens"] in (full, full // 2), one_chip[0]
    figures = {
        "regroup_gap_s": round(gap_around(shrunk["t"], ev["merges"]), 3),
        "kill_to_regroup_s": round(shrunk["t"] - ev["kill"], 3),
        "join_gap_s": round(gap_around(grown["t"], ev["merges"]), 3),
        "one_chip_steps": len(one_chip), "final_eval": run.report["final_eval_loss"],
        "goodput": run.report.get("goodput", {}).get("goodput"),
    }
    run.figures(figures)
    assert figures["regroup_gap_s"] <= REGROUP_STALL_S and figures["join_gap_s"] <= REGROUP_STALL_S, figures
    assert all(d["steps"] == STEPS for d in run.report["per_learner"].values()), run.report["per_learner"]
    run.check("converged", max_loss=FAULT_FREE.bound())
    run.check("updates_accounted")
    run.check("token_accounting")
    run.check("model_finite")
