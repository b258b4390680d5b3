"""docs/targets.md "Adding a target", followed: a third target (`toy`, algorithm `toy_avg`) added in one module outside
the package (tests/targets/toy_target.py, loaded through DILOCO_CHAOS_PLUGINS) is known to validation (in this
process and in a fresh `diloco-chaos validate`), refuses what it cannot carry naming itself and the fault kind,
runs for real (its learners' processes learn of the plugin too) into the run directory a builtin run writes,
gets the general invariants and not the builtin's or torchft's, carries kill_learner through the builtin
recovery, and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny, tiny_table

import diloco_chaos
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import ScenarioError, from_dict
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.targets import base as targets
from diloco_chaos.harness.testing.hygiene import leftovers

ROOT = Path(diloco_chaos.__file__).parent.parent
MODULE = "tests.targets.toy_target"
RUN_FILES = ("config.json", "events.jsonl", "report.json", "invariants.json", "processes.json", "global.pt")
GENERAL = ("faults_fired", "model_finite", "learners_finite")
"""Bound-free invariants that apply to every system: invariants.json holds them for a toy run."""
NOT_TOY = ("updates_accounted", "token_accounting", "replicas_agree", "commits_monotonic", "quorum_ids_monotonic",
           "quorum_floor")
"""Registered for the builtin system or torchft only (`register(systems=...)`)."""


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[targets.Target]:
    """The toy target registered through DILOCO_CHAOS_PLUGINS for one test; dropped again after it."""
    monkeypatch.setenv(algorithms.PLUGINS_ENV, MODULE)
    yield targets.get("toy")
    monkeypatch.delenv(algorithms.PLUGINS_ENV)
    assert "toy" not in targets.names() and "toy_avg" not in algorithms.names()


def refused(table: dict[str, Any], *parts: str) -> None:
    with pytest.raises(ScenarioError) as e:
        from_dict(table)
    for p in parts:
        assert p in str(e.value), str(e.value)


def test_the_toy_validates_and_refuses_by_its_descriptor(toy: targets.Target, tmp_path: Path) -> None:
    assert targets.names() == ("builtin", "torchft", "toy") and algorithms.get("toy_avg").system == "toy"
    sc = from_dict(tiny_table("toy_avg", chips=1))
    assert targets.system_of(sc) == "toy" and sc.target.system == "auto"
    assert from_dict(tiny_table("toy_avg", chips=1, target={"system": "toy"})).target.system == "toy"
    refused(tiny_table("ddp", chips=1, target={"system": "toy"}),
            "target.system = 'toy': algorithm = 'ddp' runs on the 'builtin' system, not 'toy'")
    refused(tiny_table("toy_avg", chips=1, target={"system": "builtin"}),
            "algorithm = 'toy_avg' runs on the 'toy' system, not 'builtin'")
    refused(tiny_table("toy_avg", chips=1, target={"system": "toyy"}), "toyy", "toy")
    refused(tiny_table("toy_avg", chips=2), "topology.chips_per_learner = 2: target 'toy' runs one process per learner")
    table = tiny_table("toy_avg", chips=1)
    table["faults"] = [{"action": "freeze", "learner": 1, "at": {"step": 5}, "until": {"after_s": 1.0}}]
    refused(table, "faults[0].action = 'freeze': target 'toy' cannot carry this fault kind",
            "the toy trainer carries only the kill of a whole learner", "it carries: kill_learner")

    doc = tmp_path / "toy.toml"
    doc.write_text('algorithm = "toy_avg"\n[topology]\nlearners = 2\nchips_per_learner = 1\n[train]\nsteps = 20\n'
                   '[target]\nsystem = "toy"\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cli = [sys.executable, "-m", "diloco_chaos.harness.entry", "validate", str(doc)]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "toy_avg" in out.stdout, out.stdout + out.stderr
    bad = subprocess.run(cli, env={k: v for k, v in env.items() if k != algorithms.PLUGINS_ENV},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "target.system" in bad.stdout + bad.stderr, bad.stdout + bad.stderr


def test_the_toy_is_listed_with_the_invariants_that_apply_to_it(toy: targets.Target,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from diloco_chaos.harness.cli import main

    assert main(["invariants"]) == 0
    table = capsys.readouterr().out
    applies = {line.split("|")[1].strip(" `"): line.split("|")[4] for line in table.splitlines()
               if line.startswith("| `")}
    assert all("toy_avg" in applies[name] for name in GENERAL)
    assert not any("toy_avg" in applies[name] for name in NOT_TOY)
    assert "torchft_ddp" in applies["replicas_agree"] and "ddp" in applies["token_accounting"]


def _run(sc: Any, runs_dir: Path) -> tuple[Any, list[dict[str, Any]], dict[str, dict[str, Any]]]:
    from diloco_chaos.harness.run.supervisor import run_scenario

    res = run_scenario(sc, runs_dir)
    for name in RUN_FILES:
        assert (res.run_dir / name).is_file(), name
    assert {p.name for p in (res.run_dir / "logs").iterdir()} >= {"learner0.chip0.stderr", "learner1.chip0.stderr"}
    events = read_events(res.run_dir / EVENTS_FILE)
    inv = {r["name"]: r for r in json.loads((res.run_dir / "invariants.json").read_text())["invariants"]}
    assert set(GENERAL) <= set(inv) and not set(NOT_TOY) & set(inv), sorted(inv)
    assert all(r["ok"] for r in inv.values()), inv
    report = res.report
    assert report["algorithm"] == "toy_avg" and report["final_eval_loss"] < report["initial_eval_loss"], report
    assert all(d["tokens"] > 0 for d in report["per_learner"].values()), report["per_learner"]
    assert leftovers(res, events) == {"processes": [], "ports": []}
    return res, events, inv


def test_a_toy_run_writes_a_builtin_run_directory(toy: targets.Target, runs_dir: Path) -> None:
    res, events, _ = _run(tiny("toy_avg", learners=2, chips=1, steps=20), runs_dir)
    merges = [e for e in events if e["ev"] == "merge"]
    assert [e["round"] for e in merges] == [1, 2, 3, 4, 5] and all(e["participants"] == [0, 1] for e in merges)
    assert {e["learner"] for e in events if e["ev"] == "learner_done"} == {0, 1}
    assert res.report["goodput"]["goodput"] is not None


def test_kill_learner_restarts_the_toy_learner(toy: targets.Target, runs_dir: Path) -> None:
    kill = {"action": "kill_learner", "learner": 1, "at": {"step": 10, "learner": 1}, "repair_s": 0.5}
    sc = tiny("toy_avg", learners=2, chips=1, steps=20, recovery={"policy": "restart"}, faults=[kill])
    _, events, inv = _run(sc, runs_dir)
    fired = [e for e in events if e["ev"] == "process_fault"]
    assert [(e["kind"], e["learner"]) for e in fired] == [("kill_learner", 1)]
    assert [e["learner"] for e in events if e["ev"] == "learner_down"] == [1]
    restarts = [e for e in events if e["ev"] == "learner_restart"]
    assert [(e["learner"], e["generation"]) for e in restarts] == [(1, 1)]
    starts = [e["generation"] for e in events if e["ev"] == "chip_start" and e["learner"] == 1]
    assert starts == [0, 1] and inv["faults_fired"]["ok"]
    assert {e["learner"] for e in events if e["ev"] == "learner_done"} == {0, 1}
