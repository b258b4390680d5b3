"""The algorithm registry (diloco_chaos/harness/algorithms/): no list of algorithm names and no branch on one
outside it, and an algorithm defined in one module outside the package (tests/package/toy_algorithm.py, loaded
through DILOCO_CHAOS_PLUGINS) is known to validation, a real run (its child processes included), compare's
list, the invariant table and the run's report."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import tiny

import diloco_chaos
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.run.rundir import REPORT_FILE

PACKAGE = Path(diloco_chaos.__file__).parent
REGISTRY_DIR = PACKAGE / "harness" / "algorithms"
BUILTIN = ("decoupled", "diloco", "ddp", "elastic_ddp")
TORCHFT = ("torchft_ddp", "torchft_diloco")
"""The algorithms of the torchft system under test (diloco_chaos/harness/targets/torchft/)."""
TOY = "toy_ddp"
TOY_MODULE = "tests.package.toy_algorithm"
BRANCH = re.compile(r'algorithm ?(==|!=) *"|in \("(' + "|".join(BUILTIN) + r')"')


def _sources() -> Iterator[Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if REGISTRY_DIR not in path.parents:
            yield path


def _names_in(node: ast.AST) -> list[str]:
    elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in BUILTIN]


def _mentions_algorithm(node: ast.AST) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "algorithm" in name


def test_no_algorithm_list_or_branch_outside_the_registry() -> None:
    """The registry is the only place that names algorithms in code: no `algorithm == "x"` / `in ("x", ...)`
    (the issue's grep), no tuple, list, set or dict literal holding two or more algorithm names, and no
    comparison of an `algorithm` variable with one. Docstrings may name them."""
    found: list[str] = []
    for path in _sources():
        text = path.read_text()
        rel = path.relative_to(PACKAGE.parent)
        found += [f"{rel}:{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1) if BRANCH.search(line)]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and len(_names_in(node)) >= 2:
                found.append(f"{rel}:{node.lineno}: a list of algorithms {_names_in(node)}")
            elif isinstance(node, ast.Compare) and any(_mentions_algorithm(x) for x in [node.left, *node.comparators]):
                consts = [x for x in node.comparators if isinstance(x, ast.Constant) and x.value in BUILTIN]
                if consts or any(_names_in(x) for x in node.comparators):
                    found.append(f"{rel}:{node.lineno}: a branch on an algorithm's name")
    assert not found, "algorithm names outside diloco_chaos/harness/algorithms/:\n" + "\n".join(found)


def test_the_built_in_descriptors() -> None:
    assert algorithms.names() == (*BUILTIN, *TORCHFT)
    by_system = {s: tuple(a.name for a in algorithms.every() if a.system == s) for s in ("builtin", "torchft")}
    assert by_system == {"builtin": BUILTIN, "torchft": TORCHFT}
    assert algorithms.with_trait("elastic") == ("decoupled", "elastic_ddp")
    assert algorithms.with_trait("outer_step") == ("decoupled", "diloco")
    assert algorithms.with_trait("data_parallel") == ("ddp", "elastic_ddp", "torchft_ddp")
    assert algorithms.with_trait("fragmented") == algorithms.with_trait("shardable_syncer") == ("decoupled",)
    with pytest.raises(ValueError, match="unknown algorithm 'dpp'.*did you mean 'ddp'"):
        algorithms.get("dpp")


@pytest.fixture
def early_forkserver() -> None:
    """The runs' forkserver started before the plugin is in force (as an earlier test of the session may have
    started it): its children do not see the variable, they learn of the plugin from their specs."""
    from multiprocessing import forkserver

    from diloco_chaos.harness.run.forkserver import context

    assert algorithms.PLUGINS_ENV not in os.environ
    context()
    forkserver.ensure_running()


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[algorithms.Algorithm]:
    """The toy algorithm registered through DILOCO_CHAOS_PLUGINS for one test; dropped again after it."""
    monkeypatch.setenv(algorithms.PLUGINS_ENV, TOY_MODULE)
    yield algorithms.get(TOY)
    monkeypatch.delenv(algorithms.PLUGINS_ENV)
    assert TOY not in algorithms.names()


def test_a_plugin_is_in_force_while_the_variable_names_it(toy: algorithms.Algorithm) -> None:
    assert algorithms.names() == (*BUILTIN, *TORCHFT, TOY) and toy.run_learner is algorithms.get("ddp").run_learner
    assert [r.module for r in algorithms.plugin_refs()] == [TOY_MODULE]


def test_a_toy_algorithm_validates_runs_compares_and_reports(early_forkserver: None, toy: algorithms.Algorithm,
                                                             runs_dir: Path,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from diloco_chaos.harness.cli import main
    from diloco_chaos.harness.invariants import check_all, load_run
    from diloco_chaos.harness.invariants.doc import render
    from diloco_chaos.harness.report.compare import compare, compared
    from diloco_chaos.harness.run.supervisor import RunResult, run_scenario

    # validate: a scenario naming it validates, in this process and in a fresh `diloco-chaos validate`
    sc = tiny(TOY, learners=2, chips=1, steps=20)
    assert sc.algorithm == TOY
    doc = tmp_path / "toy.toml"
    doc.write_text(f'algorithm = "{TOY}"\n[topology]\nlearners = 2\nchips_per_learner = 1\n[train]\nsteps = 20\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "validate", str(doc)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"{TOY}" in out.stdout, out.stdout + out.stderr
    bad = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "validate", str(doc)], timeout=120,
                         env={k: v for k, v in env.items() if k != algorithms.PLUGINS_ENV},
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "must be one of decoupled, diloco, ddp, elastic_ddp" in bad.stdout + bad.stderr

    # run: a short real run (chips and syncer learn of the plugin through their specs), with a report
    res = run_scenario(sc, runs_dir)
    report = json.loads((res.run_dir / REPORT_FILE).read_text())
    assert report["algorithm"] == TOY
    assert report["merges"]["quorum_size"] == {"max": 2.0, "mean": 2.0, "n": 20, "p50": 2.0}  # ddp: a merge a step
    assert report["goodput"]["goodput"] is not None
    config = json.loads((res.run_dir / "config.json").read_text())
    assert config["algorithm"] == TOY
    results = check_all(load_run(res.run_dir))
    assert results and all(r.ok for r in results), [str(r) for r in results if not r.ok]

    # compare: in compare's list, and its row made from the real run
    assert compared()[-1] == TOY and set(BUILTIN) < set(compared())
    asked: list[str] = []

    def runner(s: Scenario) -> RunResult:
        asked.append(s.algorithm)
        return res

    rows = compare(sc, baseline=False, runner=runner, algorithms=(TOY,))
    assert asked == [TOY] and rows[0].label == f"{TOY}, with faults" and rows[0].algorithm == TOY

    # the invariant table: every invariant that requires no trait applies to it, the protocol ones do not
    assert main(["invariants"]) == 0
    table = capsys.readouterr().out
    assert table == render()
    rows_of = {line.split("|")[1].strip(" `"): line.split("|")[4] for line in table.splitlines()
               if line.startswith("| `")}
    assert TOY in rows_of["learners_finite"] and TOY not in rows_of["apply_schedule"]
