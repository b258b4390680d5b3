"""compare's torchft rows (diloco_chaos/harness/report/compare.py `beside`, `not_run`, `explain`; the scenario
change of diloco_chaos/harness/algorithms/base.py `switch`) with a hand-built runner: they follow the built-in
rows, torchft_diloco's scenario is the compared one with the smallest change to a layout torchft's DiLoCo supports
(said in the row), a scenario the torchft target refuses gives a row that says so instead of stopping compare, a
failed invariant a classified finding explains is named with it, and the verdict stays about decoupled against
the built-in baselines."""

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
    # torchft_diloco runs one rank per group: its `converged` is judged against a fault-free ddp on that topology
    assert [r.algorithm for r in rows] == ["ddp", *compared(), "torchft_ddp", "ddp", "torchft_diloco"]
    assert [s.topology.chips_per_learner for s in asked] == [2] * (2 + len(compared())) + [1, 1]
    assert rows[-2].label == "ddp, fault-free (4 x 1)" and not asked[-2].faults
    assert rows[-1].note is not None and rows[-1].note.endswith("converged judged against ddp, fault-free (4 x 1)")
    assert "converged judged" not in (rows[-3].note or "")
    assert all(r.ran for r in rows)
    by = {r.algorithm: r for r in rows[1:] if r.label.endswith("with faults")}
    assert by["torchft_ddp"].goodput == 0.95 and by["torchft_ddp"].vs_fault_free_ddp == 0.0
    claims = [c.claim for c in verdict(rows)]
    assert claims and not any("torchft" in c for c in claims), claims
    assert all(c.holds for c in verdict(rows) if "goodput" in c.claim), "torchft's higher goodput is beside them"


def test_torchft_diloco_gets_the_smallest_change_to_a_supported_layout() -> None:
    """chip-loss (4 x 2, a kill of learner 1's chip 1) becomes one rank per replica group, the only layout of
    torchft's DiLoCo with full copies (the kill aimed at the group's only rank), then the Streaming DiLoCo change."""
    sc = scenario_mod.builtin("chip-loss")  # fragments 8 = sync_every 8, overlap 2: torchft needs overlap < 1
    assert (sc.diloco.fragments, sc.diloco.sync_every, sc.diloco.overlap) == (8, 8, 2)
    assert sc.topology.chips_per_learner == 2 and sc.faults[0].chip == 1
    fixed, note = switch(sc, "torchft_diloco")
    assert (fixed.diloco.fragments, fixed.diloco.overlap) == (8, 0) and fixed.algorithm == "torchft_diloco"
    assert fixed.topology.chips_per_learner == 1 and fixed.faults[0].action == "kill_chip"
    assert fixed.faults[0].chip is None and fixed.faults[0].learner == 1 and fixed.faults[0].at == sc.faults[0].at
    assert note == ("topology.chips_per_learner 2 -> 1 (torchft's DiLoCo runs one rank per replica group); "
                    "faults[0].chip 1 -> 0; diloco.overlap 2 -> 0 (Streaming DiLoCo needs sync_every % fragments "
                    "== 0 and overlap < sync_every / fragments)"), note
    one = sc.replace(faults=(), topology=dataclasses.replace(sc.topology, chips_per_learner=1))
    odd = one.replace(diloco=dataclasses.replace(sc.diloco, fragments=3, overlap=1))
    fixed, note = switch(odd, "torchft_diloco")
    assert (fixed.diloco.fragments, fixed.diloco.overlap) == (2, 1), "largest divisor of 8 not above 3"
    assert note is not None and note.startswith("diloco.fragments 3 -> 2 (")
    same, none = switch(sc.replace(faults=()), "torchft_ddp")
    assert none is None and same.diloco == sc.diloco and same.topology == sc.topology


def test_torchft_diloco_with_several_ranks_per_group_is_refused_naming_the_key_and_why() -> None:
    table = scenario_mod.builtin("chip-loss").to_dict()
    table.update(algorithm="torchft_diloco", diloco={**table["diloco"], "overlap": 0})
    with pytest.raises(scenario_mod.ScenarioError) as e:
        scenario_mod.from_dict(table)
    msg = str(e.value)
    assert msg.startswith("topology.chips_per_learner = 2: torchft_diloco runs one rank per replica group"), msg
    assert "heals each rank of a group from its own source group" in msg and "chips_per_learner = 1" in msg, msg


def test_a_failure_a_finding_explains_is_named_in_the_table(tmp_path: Path) -> None:
    """A torchft row whose replicas_agree fails under min_replicas = 1 is explained by the finding
    min-replicas-1-fork (permitted by configuration): the table names it, the results file keeps it; a failure
    no finding explains (quorum_floor here) is printed bare, and under min_replicas 2 the fork is not explained."""
    failing = {"replicas_agree", "quorum_floor"}
    base = fake_runner(tmp_path, [])

    def runner(sc: Scenario) -> Fake:
        res = base(sc)
        figs = [{"name": n, "ok": n not in failing, "figure": 1, "bound": 0, "relation": "<=", "unit": "",
                 "measure": "", "detail": ""} for n in ("replicas_agree", "quorum_floor", "commits_monotonic")]
        (res.run_dir / "invariants.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION,
                                                                 "invariants": figs}))
        return res

    sc = scenario_mod.builtin("chip-loss")
    assert sc.torchft.min_replicas == 1
    rows = compare(sc, runner=runner, algorithms=("torchft_ddp",), baseline=False)
    assert [(x.invariant, x.finding, x.verdict) for x in rows[0].explained] == [
        ("replicas_agree", "min-replicas-1-fork", "permitted by configuration")]
    assert ("FAIL replicas_agree (finding min-replicas-1-fork: permitted by configuration), quorum_floor"
            in table(rows)), table(rows)
    path = write_results(tmp_path / "out.json", ResultsFile("compare", tuple(rows), ()))
    assert read_results(path).runs[0].explained == rows[0].explained
    two = sc.replace(torchft=dataclasses.replace(sc.torchft, min_replicas=2))
    rows = compare(two, runner=runner, algorithms=("torchft_ddp",), baseline=False)
    assert rows[0].explained == () and "FAIL replicas_agree, quorum_floor" in table(rows)


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
