"""Real fault-free runs on the torchft target (docs/targets/torchft.md): torchft's Lighthouse and two replica
groups train the scenario's task; the run directory is a builtin run's, every group committed steps, the replica
groups agree on the global weights at every compared step and rank (and, for torchft_ddp's replicated ranks, the
ranks of each group agree), the loss went down and nothing is left running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny

from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.harness.testing.hygiene import leftovers

pytest.importorskip("torchft", reason="the torchft target needs torchft (the `torchft` extra, in `dev`)")
pytestmark = pytest.mark.torchft

RUN_FILES = ("config.json", "events.jsonl", "report.json", "invariants.json", "processes.json", "global.pt")


def _check(runs_dir: Path, algorithm: str, chips: int, steps: int, torchft: dict[str, Any] | None = None,
           **extra: Any) -> list[dict[str, Any]]:
    sc = tiny(algorithm, chips=chips, steps=steps, torchft={"min_replicas": 2, **(torchft or {})}, **extra)
    res = run_scenario(sc, runs_dir)
    for name in RUN_FILES:
        assert (res.run_dir / name).is_file(), name
    logs = {p.name for p in (res.run_dir / "logs").iterdir()}
    assert "lighthouse.stderr" in logs and "learner1.chip0.stderr" in logs
    events = read_events(res.run_dir / EVENTS_FILE)
    syncs = [e for e in events if e["ev"] == "torchft_sync" and e["committed"]]
    assert {e["learner"] for e in syncs} == {0, 1}, "each replica group committed steps"
    assert {e["rank"] for e in syncs} == set(range(chips))
    inv = {r["name"]: r for r in json.loads((res.run_dir / "invariants.json").read_text())["invariants"]}
    assert inv["replicas_agree"]["ok"], inv["replicas_agree"]
    compared = int(inv["replicas_agree"]["detail"].split()[0])
    assert compared >= 4, inv["replicas_agree"]["detail"]
    assert "token_accounting" not in inv and "updates_accounted" not in inv  # builtin-protocol invariants
    if chips > 1:
        assert inv["ranks_agree"]["detail"].endswith("compared across their ranks, all equal"), inv["ranks_agree"]
    assert all(r["ok"] for r in inv.values()), inv
    report = res.report
    assert all(d["tokens"] > 0 for d in report["per_learner"].values()), report["per_learner"]
    assert report["final_eval_loss"] < report["initial_eval_loss"]
    assert leftovers(res, events) == {"processes": [], "ports": []}
    return events


def test_torchft_ddp_two_groups_of_two(runs_dir: Path) -> None:
    _check(runs_dir, "torchft_ddp", chips=2, steps=24)


def test_torchft_diloco_two_groups_of_one(runs_dir: Path) -> None:
    _check(runs_dir, "torchft_diloco", chips=1, steps=32, diloco={"fragments": 2, "sync_every": 4, "overlap": 1})


def test_torchft_ddp_through_torchfts_ddp_module_two_groups_of_two(runs_dir: Path) -> None:
    """torchft.ddp_api = "ddp_module": torchft.ddp.DistributedDataParallel's comm hook averages each rank's
    gradients across the groups, LearnerCore's collective then inside the group; every rank of every group holds
    the same weights after each committed step (one digest per step, all four processes)."""
    events = _check(runs_dir, "torchft_ddp", chips=2, steps=24, torchft={"ddp_api": "ddp_module"})
    digests: dict[int, set[str]] = {}
    for e in events:
        if e["ev"] == "torchft_sync" and e["committed"]:
            digests.setdefault(e["step"], set()).add(e["digest"])
    assert len(digests) == 24 and all(len(d) == 1 for d in digests.values()), digests
