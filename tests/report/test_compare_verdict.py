"""diloco_chaos.harness.report.compare.verdict over hand-built rows: each claim holds or fails on its own figures."""

from __future__ import annotations

import dataclasses

import pytest

from diloco_chaos.harness.report.compare import (
    GAP_SD,
    PARITY_CURVE,
    compared,
    goodput_order,
    loss_allowance,
    parity_gap,
    verdict,
)
from diloco_chaos.harness.report.results import RestartPhases, RunRow


def r(label: str, alg: str, goodput: float, uptime: float, gap: float) -> RunRow:
    return RunRow(label=label, algorithm=alg, scenario="t", seed=0, faults=0 if "fault-free" in label else 1,
                  goodput=goodput, merged_fraction=goodput, uptime=uptime, final_eval_loss=2.0 + gap,
                  tokens_trained=100, tokens_merged=100.0, tokens_merged_per_s=10.0, merges=10, longest_gap_s=0.1,
                  wall_s=1.0, run_dir="-", vs_fault_free_ddp=gap)


def rows(dec_goodput: float, dec_uptime: float, dec_gap: float) -> list[RunRow]:
    return [r("ddp, fault-free", "ddp", 0.99, 1.0, 0.0), r("ddp, with faults", "ddp", 0.6, 0.95, 0.0),
            r("diloco, with faults", "diloco", 0.8, 0.9, 0.5),
            r("decoupled, with faults", "decoupled", dec_goodput, dec_uptime, dec_gap)]


def test_every_claim_holds() -> None:
    claims = verdict(rows(0.9, 1.0, 0.6), tolerance=0.7)
    assert [c.claim for c in claims] == [
        "decoupled goodput above ddp", "decoupled goodput above diloco", "decoupled uptime at least ddp",
        "decoupled uptime at least diloco", "decoupled final eval within 0.700 of fault-free ddp"]
    assert all(c.holds for c in claims)


def test_each_claim_fails_on_its_own_figure() -> None:
    claims = {c.claim: c for c in verdict(rows(0.75, 0.92, 0.8), tolerance=0.7)}
    assert claims["decoupled goodput above ddp"].holds and not claims["decoupled goodput above diloco"].holds
    assert claims["decoupled goodput above diloco"].figures == "0.750 vs 0.800"
    assert not claims["decoupled uptime at least ddp"].holds and claims["decoupled uptime at least diloco"].holds
    assert not claims["decoupled final eval within 0.700 of fault-free ddp"].holds
    assert verdict(rows(0.9, 1.0, 0.1)[:3]) == [], "no decoupled row: nothing to judge"


def test_equal_uptime_holds_and_equal_goodput_does_not() -> None:
    claims = {c.claim: c.holds for c in verdict(rows(0.6, 0.95, 0.1))}
    assert claims["decoupled uptime at least ddp"] and not claims["decoupled goodput above ddp"]


def test_with_elastic_ddp_goodput_ranks_decoupled_then_elastic_then_ddp() -> None:
    assert "elastic_ddp" in compared() and goodput_order() == ("decoupled", "elastic_ddp", "ddp")
    rs = rows(0.9, 1.0, 0.1) + [r("elastic_ddp, with faults", "elastic_ddp", 0.7, 0.99, 0.0)]
    claims = {c.claim: c for c in verdict(rs)}
    assert claims["decoupled goodput above elastic_ddp"].holds
    assert claims["elastic_ddp goodput above ddp"].holds and claims["elastic_ddp goodput above ddp"].figures == \
        "0.700 vs 0.600"
    assert claims["decoupled uptime at least elastic_ddp"].holds
    rs[-1] = r("elastic_ddp, with faults", "elastic_ddp", 0.55, 0.99, 0.0)
    claims = {c.claim: c for c in verdict(rs)}
    assert not claims["elastic_ddp goodput above ddp"].holds
    # without a ddp row the chain is decoupled > elastic_ddp only
    claims = {c.claim: c for c in verdict([x for x in rs if x.label != "ddp, with faults"])}
    assert "elastic_ddp goodput above ddp" not in claims and "decoupled goodput above elastic_ddp" in claims


def test_parity_gap_follows_the_measured_curve() -> None:
    for steps, gap in PARITY_CURVE:
        assert parity_gap(steps) == pytest.approx(gap)
    (s0, g0), (s1, g1) = PARITY_CURVE[0], PARITY_CURVE[1]
    mid = parity_gap((s0 + s1) // 2)
    assert min(g0, g1) < mid < max(g0, g1)
    last_steps, last_gap = PARITY_CURVE[-1]
    assert 0 < parity_gap(4 * last_steps) < last_gap, "beyond the curve the gap keeps shrinking"
    assert 0 < parity_gap(s0 // 2) < g0, "before it, towards chance where both start, too"
    assert parity_gap(None) == g0
    with pytest.raises(ValueError, match="steps > 0"):
        parity_gap(0)


def test_the_default_bound_is_the_parity_gap_plus_the_measured_spread() -> None:
    steps = PARITY_CURVE[0][0]
    allowed = loss_allowance(steps)
    assert allowed == pytest.approx(parity_gap(steps) + 3 * GAP_SD)
    rs = rows(0.9, 1.0, 0.0)
    for gap, holds in ((allowed - 0.01, True), (allowed + 0.01, False)):
        rs[-1] = dataclasses.replace(rows(0.9, 1.0, gap)[-1], train_steps=steps)
        claim = [c for c in verdict(rs) if "final eval" in c.claim]
        assert [c.holds for c in claim] == [holds], claim
        assert claim[0].claim == f"decoupled final eval within {allowed:.3f} of fault-free ddp"
        assert f"parity gap at {steps} steps" in claim[0].figures


def test_the_printed_table_lists_a_torchrun_restarts_phases_and_no_section_without_one() -> None:
    from diloco_chaos.harness.report.compare import table

    plain = rows(0.9, 1.0, 0.6)
    assert "restarts (elastic.engine" not in table(plain)
    phases = RestartPhases(2, 17, {"detect": 0.21, "stop": 0.5, "rendezvous": 1.25, "spawn": 0.4,
                                   "worker_init": 11.8, "pg_init": 0.05, "checkpoint_load": None})
    el = dataclasses.replace(r("elastic_ddp, with faults", "elastic_ddp", 0.7, 1.0, 0.1), restart_phases=phases)
    out = table([*plain, el])
    assert ("elastic_ddp, with faults: 2 restart(s), 17 steps redone, detect 0.21, stop 0.50, rendezvous 1.25, "
            "spawn 0.40, worker_init 11.80, pg_init 0.05") in out, out
