"""The planted fault-path bugs (diloco_chaos/trainers/mutations.py; docs/explore-planted.md): each is invisible in a
fault-free run and caught by a named invariant once its fault fires, on real runs.

For every planted mutation, with the scenario examples/incidents/planted-scenario.toml and its incident
examples/incidents/planted/<mutation>.toml (one fault, triggered by learner 0's progress):
(a) the mutation without the fault: every invariant recorded at the end of the run holds (a fault-path bug);
(b) the mutation with the fault: the invariant named below fails;
(c) the fault without the mutation: every invariant holds (the fault alone is not what fails it).
A mutation is switched on only by DILOCO_CHAOS_MUTATION in the environment the run's forkserver starts with, so
(a) and (b) run the CLI in a subprocess with the variable set (as suites/test_process_failure.py does); (c) runs
through the pytest plugin's `cluster` fixture, in this process, whose environment names no mutation.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diloco_chaos.harness.config.scenario import load
from diloco_chaos.harness.invariants.registry import spec
from diloco_chaos.harness.report.results import recorded_invariants
from diloco_chaos.harness.run.replay import load_incident
from diloco_chaos.trainers.mutations import ENV_VAR, MUTATIONS

pytestmark = [pytest.mark.failure, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
INCIDENTS = ROOT / "examples" / "incidents"
SCENARIO = INCIDENTS / "planted-scenario.toml"

PLANTED = {
    "restore_older_slot": "updates_accounted",
    "restore_tokens_reset": "token_accounting",
    "restore_drops_momentum": "outer_lr",
    "resume_one_step_early": "token_accounting",
}
"""Planted fault-path mutation -> the invariant its incident's fault makes fail."""


def cli_run(tmp_path: Path, mutation: str, incident: Path | None) -> Path:
    """Run the planted scenario (with `incident` on top) through the CLI under `mutation`; its run directory."""
    runs = tmp_path / ("faulty" if incident is not None else "fault-free")
    cmd = [sys.executable, "-m", "diloco_chaos.harness.entry", "run", str(SCENARIO), "--runs-dir", str(runs)]
    if incident is not None:
        cmd += ["--incident", str(incident)]
    env = {**os.environ, ENV_VAR: mutation, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    dirs = [d for d in runs.iterdir() if d.is_dir()] if runs.exists() else []
    assert len(dirs) == 1 and (dirs[0] / "invariants.json").exists(), (out.returncode, out.stderr[-3000:])
    assert json.loads((dirs[0] / "config.json").read_text())["mutation"] == mutation
    return dirs[0]


def violated(run_dir: Path) -> list[str]:
    """The invariants the run recorded as violated (invariants.json), one line each."""
    recorded = recorded_invariants(run_dir)
    assert recorded, f"no invariants recorded in {run_dir}"
    return [f"{f.name}: {f.detail}" for f in recorded if not f.ok]


def test_every_planted_mutation_is_registered_and_has_an_incident() -> None:
    assert set(PLANTED) <= set(MUTATIONS)
    planted = sorted(p.stem for p in (INCIDENTS / "planted").glob("*.toml"))
    assert planted == sorted(PLANTED), planted
    for name in PLANTED:
        sc = load_incident(INCIDENTS / "planted" / f"{name}.toml", load(SCENARIO))
        assert 1 <= len(sc.faults) <= 2 and all(f.at.step is not None for f in sc.faults), sc.faults


@pytest.mark.parametrize("mutation", sorted(PLANTED))
def test_a_planted_bug_shows_only_under_its_fault(mutation: str, tmp_path: Path, cluster) -> None:
    incident = INCIDENTS / "planted" / f"{mutation}.toml"
    name = PLANTED[mutation]
    quiet = cli_run(tmp_path, mutation, None)
    assert violated(quiet) == [], f"{mutation} without a fault must pass every invariant ({quiet})"
    faulty = cli_run(tmp_path, mutation, incident)
    result = spec(name)(faulty)
    print(f"[{mutation}] {result}")
    assert not result.ok, f"{mutation} under {incident.name}: {name} must fail ({faulty})"
    assert any(line.startswith(f"{name}:") for line in violated(faulty))
    clean = cluster(load_incident(incident, load(SCENARIO)), name=f"planted-{incident.stem}-unmutated")
    clean.check_all()  # the same fault without the mutation: every invariant holds, faults_fired included
