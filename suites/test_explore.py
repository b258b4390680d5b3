"""Explore suite: `diloco-chaos explore` finds a planted bug, shrinks it, and the minimal incident reproduces it.

The planted bug is the mutation `skip_initial_pull` (diloco_chaos/trainers/mutations.py: a restarted learner
skips its initial pull of the global model), switched on in the environment of the explore command, which every
run's processes inherit. The invariant written for it, `initial_pull`, catches it in every run with a learner
restart (docs/sensitivity.md). The scenario is small (2 learners x 1 chip, 30 steps) and its `[explore]` table
draws only the fault that can trigger the bug (kill_learner, one or two per schedule), with a tiny budget: one
explored schedule, at most two shrink runs and one confirmation run, 1 of 1 tries (the measured repeat rate of
this failure is 10 of 10, docs/explore.md). Then `diloco-chaos run SCENARIO --incident
minimal-initial_pull.toml`, the printed command, must fail the same invariant.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from diloco_chaos.harness.config.scenario import load
from diloco_chaos.harness.explore.records import read_lines
from diloco_chaos.harness.report.results import recorded_invariants
from diloco_chaos.harness.run.replay import load_incident
from diloco_chaos.trainers.mutations import ENV_VAR

pytestmark = [pytest.mark.timeout(600)]

SCENARIO = """
name = "explore-planted"
seed = 0
algorithm = "decoupled"

[topology]
learners = 2
chips_per_learner = 1

[train]
steps = 30
warmup_steps = 5

[diloco]
fragments = 4
sync_every = 4
overlap = 3

[eval]
every_s = 2.0
batches = 2

[recovery]
policy = "restart"
repair_s = 0.5
max_restarts = 2

[explore]
kinds = ["kill_learner"]
min_faults = 1
max_faults = 2
steps = 30
max_duration_s = 1.0
tries = 1
must_fail = 1
shrink_runs = 2
confirm_runs = 1
confirm_must_fail = 1
"""
CLI = [sys.executable, "-m", "diloco_chaos.harness.entry"]


def test_explore_finds_shrinks_and_reproduces_a_planted_bug(tmp_path: Path) -> None:
    scenario = tmp_path / "planted.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "explore"
    env = dict(os.environ, **{ENV_VAR: "skip_initial_pull"})
    p = subprocess.run([*CLI, "explore", str(scenario), "--budget-s", "1", "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=500)
    assert p.returncode == 1, (p.returncode, p.stdout[-2000:], p.stderr[-3000:])  # 1: a finding
    assert "1 runs done, 1 failures found (initial_pull 1)" in p.stderr and "s left" in p.stderr, p.stderr[-3000:]

    lines = read_lines(out / "explore.jsonl")
    explored = [x for x in lines if x.phase == "explore"]
    assert len(explored) == 1 and explored[0].outcome == "failed" and "initial_pull" in explored[0].failed
    assert len([x for x in lines if x.phase == "shrink"]) <= 3  # two shrink runs and one confirmation
    assert "repeats: failed 1 of 1 fresh runs" in p.stdout, p.stdout

    minimal = out / "minimal-initial_pull.toml"
    assert minimal.is_file(), p.stdout
    sc = load(scenario)
    faults = load_incident(minimal, sc).faults
    assert 1 <= len(faults) <= 2 and all(f.action == "kill_learner" for f in faults)
    (command,) = [x.split("reproduce: ", 1)[1] for x in p.stdout.splitlines() if "reproduce: " in x]
    words = shlex.split(command)
    assert words[0] == f"{ENV_VAR}=skip_initial_pull" and words[1:3] == ["diloco-chaos", "run"], command
    assert "report: " in p.stdout and (Path(p.stdout.split("report: ")[1].split("\n")[0])).is_file()

    runs = tmp_path / "again"
    again = subprocess.run([*CLI, *words[2:], "--runs-dir", str(runs), "--quiet"], env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    (run_dir,) = [d for d in runs.iterdir() if d.is_dir()]
    verdicts = {f.name: f for f in recorded_invariants(run_dir) or ()}
    assert not verdicts["initial_pull"].ok, verdicts["initial_pull"]
