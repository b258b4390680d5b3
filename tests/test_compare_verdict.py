"""harness.compare.verdict over hand-built rows: each claim holds or fails on its own figures."""

from __future__ import annotations

from harness.compare import verdict


def rows(dec_goodput: float, dec_uptime: float, dec_gap: float) -> list[dict]:
    def r(run: str, alg: str, goodput: float, uptime: float, gap: float) -> dict:
        return {"run": run, "algorithm": alg, "goodput": goodput, "uptime": uptime, "vs_fault_free_ddp": gap}
    return [r("ddp, fault-free", "ddp", 0.7, 1.0, 0.0), r("ddp, with faults", "ddp", 0.6, 0.95, 0.0),
            r("diloco, with faults", "diloco", 0.8, 0.9, 0.5),
            r("decoupled, with faults", "decoupled", dec_goodput, dec_uptime, dec_gap)]


def test_every_claim_holds() -> None:
    claims = verdict(rows(0.9, 1.0, 0.6), tolerance=0.7)
    assert [c for c, _, _ in claims] == ["goodput above ddp", "goodput above diloco", "uptime above ddp",
                                         "uptime above diloco", "final eval within 0.7 of fault-free ddp"]
    assert all(ok for _, ok, _ in claims)


def test_each_claim_fails_on_its_own_figure() -> None:
    claims = dict((c, (ok, f)) for c, ok, f in verdict(rows(0.75, 0.92, 0.8), tolerance=0.7))
    assert claims["goodput above ddp"][0] and not claims["goodput above diloco"][0]
    assert claims["goodput above diloco"][1] == "0.750 vs 0.800"
    assert not claims["uptime above ddp"][0] and claims["uptime above diloco"][0]
    assert not claims["final eval within 0.7 of fault-free ddp"][0]
    assert verdict(rows(0.9, 1.0, 0.1)[:3]) == [], "no decoupled row: nothing to judge"
