"""compare's torchft rows (diloco_chaos/harness/report/compare.py `beside`, `not_run`; the scenario change of
diloco_chaos/harness/algorithms/base.py `switch`) with a hand-built runner: they follow the built-in rows,
torchft_diloco's scenario is the compared one with the smallest
Streaming-DiLoCo change (said in the row), a scenario the torchft target refuses gives a row that says so instead
of stopping compare, and the verdict stays about decoupled against the built-in baselines."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.algorithms.base import switch
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.report.compare import beside, compare, compared, table, verdict
from diloco_chaos.harness.report.results import SCHEMA_VERSION, ResultsFile, read_results, write_results
from diloco_chaos.harness.targets import base as targets

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="torchft is not installed")


@dataclasses.dataclass
class Fake:
    """What compare needs of a finished run: report.json's figures and a run directory (config, verdicts)."""

    report: dict[str, Any]
    run_dir: Path


def fake_runner(tmp_path: Path, asked: list[Scenario]) -> Any:
    goodput = {"ddp": 0.5, "elastic_ddp": 0.6, "diloco": 0.7, "decoupled": 0.9, "torchft_ddp": 0.95,
               "torchft_diloco": 0.97}

    def runner(sc: Scenario) -> Fake:
        asked.append(sc)
        d = tmp_path / f"{len(asked)}-{sc.algorithm}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(sc.to_dict()))
        (d / "invariants.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "invariants": []}))
        rep = {"algorithm": sc.algorithm, "name": sc.name, "seed": sc.seed, "final_eval_loss": 3.0,
               "tokens_trained": 1000, "tokens_merged": 900.0, "train_s": 10.0, "merge_count": 30,
               "longest_gap_s": 0.5, "wall_s": 12.0, "goodput": {"goodput": goodput[sc.algorithm]},
               "availability": {"uptime": 1.0}}
        (d / "report.json").write_text(json.dumps(rep))
        (d / "events.jsonl").write_text("")  # compare's `converged` reads the final loss from report.json
        return Fake(rep, d)

    return runner


def test_torchft_rows_follow_the_builtin_ones_and_are_not_judged(tmp_path: Path) -> None:
    assert beside() == ("torchft_ddp", "torchft_diloco")
    sc = scenario_mod.builtin("fault-free")
    asked: list[Scenario] = []
    rows = compare(sc, runner=fake_runner(tmp_path, asked))
    assert [r.algorithm for r in rows] == ["ddp", *compared(), *beside()]
    assert all(r.ran for r in rows)
    by = {r.algorithm: r for r in rows[1:]}
    assert by["torchft_ddp"].goodput == 0.95 and by["torchft_ddp"].vs_fault_free_ddp == 0.0
    claims = [c.claim for c in verdict(rows)]
    assert claims and not any("torchft" in c for c in claims), claims
    assert all(c.holds for c in verdict(rows) if "goodput" in c.claim), "torchft's higher goodput is beside them"


def test_torchft_diloco_gets_the_smallest_streaming_diloco_change() -> None:
    sc = scenario_mod.builtin("chip-loss")  # fragments 8 = sync_every 8, overlap 2: torchft needs overlap < 1
    assert (sc.diloco.fragments, sc.diloco.sync_every, sc.diloco.overlap) == (8, 8, 2)
    fixed, note = switch(sc.replace(faults=()), "torchft_diloco")
    assert (fixed.diloco.fragments, fixed.diloco.overlap) == (8, 0) and fixed.algorithm == "torchft_diloco"
    assert note is not None and note.startswith("diloco.overlap 2 -> 0 (Streaming DiLoCo needs")
    odd = sc.replace(faults=(), diloco=dataclasses.replace(sc.diloco, fragments=3, overlap=1))
    fixed, note = switch(odd, "torchft_diloco")
    assert (fixed.diloco.fragments, fixed.diloco.overlap) == (2, 1), "largest divisor of 8 not above 3"
    assert note is not None and note.startswith("diloco.fragments 3 -> 2 (")
    same, none = switch(sc.replace(faults=()), "torchft_ddp")
    assert none is None and same.diloco == sc.diloco


def test_a_scenario_the_torchft_target_refuses_gets_a_row_saying_so(tmp_path: Path) -> None:
    carried = targets.get("torchft").fault_kinds
    sc = scenario_mod.builtin("default")  # kill_chip, degrade (on loopback) and slow
    if carried is None or "slow" in carried:
        pytest.skip("the torchft target carries the default scenario's straggler: its rows are real runs now")
    asked: list[Scenario] = []
    rows = compare(sc, runner=fake_runner(tmp_path, asked))
    assert [s.algorithm for s in asked] == ["ddp", *compared()], "no torchft run was attempted"
    refused = [r for r in rows if not r.ran]
    assert [r.algorithm for r in refused] == list(beside())
    assert refused[0].note is not None and "not run: the torchft target refuses the scenario" in refused[0].note
    assert "'slow'" in refused[0].note and refused[0].goodput is None
    assert f"{refused[0].label}: not run" in table(rows)
    assert verdict(rows), "the verdict still judges the built-in rows"
    path = write_results(tmp_path / "out.json", ResultsFile("compare", tuple(rows), tuple(verdict(rows))))
    back = {r.algorithm: r for r in read_results(path).runs}
    assert not back["torchft_ddp"].ran and back["ddp"].ran and back["torchft_ddp"].note == refused[0].note


def test_a_scenario_with_the_torchrun_engine_compares_every_algorithm(tmp_path: Path) -> None:
    """`[elastic] engine = "torchrun"` is elastic_ddp's only: the fault-free ddp reference and the other rows run
    with the in-place engine (said in their notes), elastic_ddp's row with torchrun."""
    table = scenario_mod.builtin("chip-loss").to_dict()
    table.update(algorithm="elastic_ddp", elastic={"engine": "torchrun", "checkpoint_every": 25})
    sc = scenario_mod.from_dict(table)
    asked: list[Scenario] = []
    rows = compare(sc, runner=fake_runner(tmp_path, asked), algorithms=("ddp", "elastic_ddp", "decoupled"))
    engines = {(s.algorithm, bool(s.faults)): s.elastic.engine for s in asked}
    assert engines == {("ddp", False): "regroup", ("ddp", True): "regroup", ("elastic_ddp", True): "torchrun",
                       ("decoupled", True): "regroup"}, engines
    assert [r.note is not None and "elastic.engine = 'regroup'" in r.note for r in rows[1:]] == [True, False, True]
