"""diloco_chaos.harness.report.results and the `--json` options of `diloco-chaos run` and `compare`: the schema, strict
JSON, and both options on tiny real runs (1 learner x 1 chip, 20 steps: a few seconds each)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_table

from diloco_chaos.harness.cli import main
from diloco_chaos.harness.invariants import InvariantResult
from diloco_chaos.harness.report.compare import beside, loss_allowance
from diloco_chaos.harness.report.results import (
    SCHEMA_VERSION,
    Claim,
    InvariantFigure,
    ResultsFile,
    RunRow,
    read_results,
    write_results,
)

ROW_FIELDS = {"label", "algorithm", "scenario", "seed", "faults", "goodput", "merged_fraction", "uptime",
              "final_eval_loss", "tokens_trained", "tokens_merged", "tokens_merged_per_s", "merges", "longest_gap_s",
              "wall_s", "run_dir", "invariants", "vs_fault_free_ddp", "train_steps", "note", "ran", "back_s",
              "restart_phases", "mutation", "explained"}
"""The documented row fields (docs/metrics.md, "Results JSON"): renaming or removing one breaks readers."""
INVARIANT_FIELDS = {"name", "ok", "figure", "bound", "relation", "unit", "measure", "detail"}
BOUND_FREE = ["faults_fired", "updates_accounted", "token_accounting", "model_finite", "learners_finite"]


def bound_free(algorithm: str) -> list[str]:
    """The bound-free invariants of a row, in the registry's order: work_kept applies to decoupled only."""
    if algorithm != "decoupled":
        return BOUND_FREE
    return [*BOUND_FREE[:2], "work_kept", *BOUND_FREE[2:]]


PROTOCOL = ["rda_norms", "outer_lr", "token_weights", "pushes_received", "apply_schedule", "initial_pull"]
"""diloco_chaos/harness/invariants/protocol.py: in the row of a decoupled run only."""


def row(**kw: Any) -> RunRow:
    base = dict(label="decoupled", algorithm="decoupled", scenario="s", seed=0, faults=1, goodput=0.97,
                merged_fraction=0.6, uptime=1.0, final_eval_loss=2.4, tokens_trained=10, tokens_merged=9.5,
                tokens_merged_per_s=3.0, merges=4, longest_gap_s=0.2, wall_s=12.0, run_dir="runs/x")
    return RunRow(**{**base, **kw})


def test_the_schema_is_the_documented_field_list() -> None:
    assert {f.name for f in dataclasses.fields(RunRow)} == ROW_FIELDS
    assert {f.name for f in dataclasses.fields(InvariantFigure)} == INVARIANT_FIELDS
    assert {f.name for f in dataclasses.fields(Claim)} == {"claim", "holds", "figures"}


def test_write_and_read_back(tmp_path: Path) -> None:
    inv = InvariantFigure.of(InvariantResult("rejoined", False, math.inf, 10.0, "never came back", "delay", "s"))
    assert inv.figure is None and inv.bound == 10.0 and inv.relation == "<=", "inf is not JSON: null, detail says"
    res = ResultsFile("compare", (row(invariants=(inv,)), row(label="ddp, fault-free", final_eval_loss=None)),
                      (Claim("decoupled goodput above ddp", True, "0.970 vs 0.930"),))
    path = write_results(tmp_path / "deep" / "results.json", res)
    d = json.loads(path.read_text())
    assert d["schema_version"] == SCHEMA_VERSION and d["command"] == "compare"
    assert set(d["runs"][0]) == ROW_FIELDS and set(d["runs"][0]["invariants"][0]) == INVARIANT_FIELDS
    assert d["runs"][1]["final_eval_loss"] is None
    assert read_results(path) == res


def test_non_finite_figures_never_reach_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Out of range float"):
        write_results(tmp_path / "r.json", ResultsFile("run", (row(goodput=math.nan),)))
    assert not (tmp_path / "r.json").exists()


def test_a_newer_writers_extra_fields_are_kept_and_another_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_results(path, ResultsFile("run", (row(),)))
    d = json.loads(path.read_text())
    d["host"] = "ci-7"
    d["runs"][0]["new_figure"] = 1.5
    path.write_text(json.dumps(d))
    back = read_results(path)
    assert back.extra == {"host": "ci-7"} and back.runs == (row(),)
    d["schema_version"] = SCHEMA_VERSION + 1
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="schema_version"):
        read_results(path)


def write_toml(path: Path, table: dict[str, Any]) -> Path:
    def value(v: Any) -> str:
        return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else repr(v)

    lines = [f"{k} = {value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for k, v in table.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{kk} = {value(vv)}" for kk, vv in v.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def one_by_one(tmp_path: Path) -> Path:
    return write_toml(tmp_path / "tiny.toml", tiny_table("decoupled", learners=1, chips=1, steps=20))


def test_run_json_writes_one_row_with_its_invariants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out" / "run.json"
    rc = main(["run", str(one_by_one(tmp_path)), "--algorithm", "ddp", "--runs-dir", str(tmp_path / "runs"),
               "--quiet", "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    res = read_results(out)
    assert res.command == "run" and res.claims == ()
    (r,) = res.runs
    assert (r.label, r.algorithm, r.scenario, r.seed, r.faults) == ("ddp", "ddp", "tiny-decoupled", 1, 0)
    assert r.goodput is not None and 0.9 <= r.goodput <= 1.0, "a fault-free ddp run: only start-up jitter lost"
    assert r.merges == 20 and r.tokens_merged == r.tokens_trained > 0 and r.final_eval_loss is not None
    assert Path(r.run_dir).is_dir() and r.vs_fault_free_ddp is None
    assert [i.name for i in r.invariants] == BOUND_FREE and all(i.ok for i in r.invariants)
    report = json.loads((Path(r.run_dir) / "report.json").read_text())
    assert r.goodput == report["goodput"]["goodput"] and r.uptime == report["availability"]["uptime"]


def test_compare_json_writes_every_run_and_the_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "compare.json"
    rc = main(["compare", str(one_by_one(tmp_path)), "--runs-dir", str(tmp_path / "runs"), "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    res = read_results(out)
    assert res.command == "compare"
    assert [r.label for r in res.runs] == ["ddp, fault-free", "ddp, with faults", "elastic_ddp, with faults",
                                           "diloco, with faults", "decoupled, with faults",
                                           *(f"{a}, with faults" for a in beside())]
    ref = res.runs[0].final_eval_loss
    assert ref is not None
    for r in res.runs[5:]:  # torchft's, beside the built-in ones: a committed step is a merge
        assert (r.merges > 0 and r.goodput is not None and r.goodput > 0) if r.ran else \
            (r.note or "").startswith("not run"), r
    for r in res.runs[1:5]:
        assert r.final_eval_loss is not None and r.vs_fault_free_ddp == pytest.approx(r.final_eval_loss - ref,
                                                                                      abs=1e-3)
        protocol = PROTOCOL if r.algorithm == "decoupled" else []
        assert [i.name for i in r.invariants] == ["converged", *bound_free(r.algorithm), *protocol]
        failed = [f"{i.name}: {i.detail}" for i in (r.invariants[-len(protocol):] if protocol else []) if not i.ok]
        assert not failed, f"{r.label}: {failed} (run dir {r.run_dir})"
        converged = r.invariants[0]
        allowed = loss_allowance(r.train_steps)
        assert r.train_steps is not None and converged.bound == pytest.approx(ref + allowed, abs=1e-4)
        assert converged.ok == (r.final_eval_loss <= ref + allowed)
    assert [i.name for i in res.runs[0].invariants] == BOUND_FREE, "the reference is not judged against itself"
    assert res.claims and all(f"{'holds ' if c.holds else 'FAILS '} {c.claim}: {c.figures}" in printed
                              for c in res.claims)
