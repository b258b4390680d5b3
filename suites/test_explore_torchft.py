"""Explore on the torchft target: `diloco-chaos explore --builtin torchft-ddp-explore` draws, runs, judges, shrinks
and confirms on real torchft 0.2.0 replica groups, and the minimal incident's printed command reproduces it
(docs/targets/torchft.md "Explore against torchft").

The failure is made certain, not hoped for: `[explore] within_s = 0.01` asks `rejoined` for a killed group back
(committing in a quorum) 10 ms after its repair, which no restarted process can do (its start alone takes
longer), so the one explored schedule (one kill_learner, triggered by the group's own step 5-20 of 100, repaired
after 0.5 s) fails `rejoined` and nothing else; the other invariants of the table (replicas_agree,
commits_monotonic, quorum_ids_monotonic, quorum_floor, converged) are judged on the same run and must hold. The
budget is one schedule, one shrink run and one confirmation run (1 of 1), then the printed command once more:
four short runs. Every process any of them started is gone afterwards.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from diloco_chaos.harness.config.scenario import builtin
from diloco_chaos.harness.explore.records import read_lines
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.report.results import recorded_invariants
from diloco_chaos.harness.run.replay import load_incident

pytest.importorskip("torchft", reason="the torchft target needs torchft (the `torchft` extra, in `dev`)")
pytestmark = [pytest.mark.torchft, pytest.mark.timeout(600)]

SETS = ['explore.kinds=["kill_learner"]', "explore.max_faults=1", "explore.steps=100", "explore.last_step=20",
        "explore.min_duration_s=0.5", "explore.max_duration_s=0.5", "explore.within_s=0.01", "explore.tries=1",
        "explore.must_fail=1", "explore.shrink_runs=1", "explore.confirm_runs=1", "explore.confirm_must_fail=1"]
CLI = [sys.executable, "-m", "diloco_chaos.harness.entry"]
JUDGED = ("replicas_agree", "commits_monotonic", "quorum_ids_monotonic", "quorum_floor", "rejoined", "converged")


def _alive(root: Path) -> list[int]:
    """Pids that any run under `root` started (its processes, its Lighthouses) and that are still alive."""
    pids = set()
    for events in root.rglob(EVENTS_FILE):
        for e in read_events(events):
            if e["ev"] in ("process_start", "lighthouse_ready"):
                pids.add(int(e["child_pid"]))
    assert pids, f"no run under {root} started a process"
    return sorted(p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE)


def test_explore_on_torchft_judges_shrinks_confirms_and_reproduces(tmp_path: Path) -> None:
    out = tmp_path / "explore"
    sets = [a for s in SETS for a in ("--set", s)]
    p = subprocess.run([*CLI, "explore", "--builtin", "torchft-ddp-explore", *sets, "--runs", "1", "--out",
                        str(out)], capture_output=True, text=True, timeout=500)
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])  # 1: a finding
    assert "kinds kill_learner;" in p.stderr and "(torchft_ddp, 3x1, 100 steps per run)" in p.stderr, p.stderr

    lines = read_lines(out / "explore.jsonl")
    (explored,) = [x for x in lines if x.phase == "explore"]
    assert explored.outcome == "failed" and explored.failed == ("rejoined",), explored
    assert [f["action"] for f in explored.faults] == ["kill_learner"]
    verdicts = {v.name: v for v in explored.verdicts}
    assert set(JUDGED) <= set(verdicts) and all(verdicts[n].judged for n in JUDGED), verdicts
    assert all(verdicts[n].ok for n in JUDGED if n != "rejoined"), verdicts
    assert verdicts["rejoined"].figure is not None and verdicts["rejoined"].figure > 0.01
    assert len([x for x in lines if x.phase == "shrink"]) <= 3  # one shrink run, one confirmation (+1 backed out)
    assert "repeats: failed 1 of 1 fresh runs" in p.stdout, p.stdout
    summary = json.loads((out / "explore-summary.json").read_text())
    assert summary["runs"] == 1 and summary["failed_invariants"] == {"rejoined": 1}, summary

    minimal = out / "minimal-rejoined.toml"
    faults = load_incident(minimal, builtin("torchft-ddp-explore")).faults
    assert [f.action for f in faults] == ["kill_learner"], faults
    (command,) = [x.split("reproduce: ", 1)[1] for x in p.stdout.splitlines() if "reproduce: " in x]
    words = shlex.split(command)
    assert words[:4] == ["diloco-chaos", "run", "--builtin", "torchft-ddp-explore"], command

    runs = tmp_path / "again"
    again = subprocess.run([*CLI, *words[1:], "--runs-dir", str(runs), "--quiet"], capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    (run_dir,) = [d for d in runs.iterdir() if d.is_dir()]
    recorded = {f.name: f for f in recorded_invariants(run_dir) or ()}
    assert recorded["replicas_agree"].ok and recorded["commits_monotonic"].ok, recorded
    assert _alive(out) == [] and _alive(runs) == []
