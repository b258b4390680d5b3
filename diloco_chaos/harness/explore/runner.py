"""Running one schedule for real, and judging it.

What: `run_trial` writes the schedule as an incident file in its own folder and runs
`python -m diloco_chaos.harness.entry run SCENARIO --set ... --incident FILE --runs-dir FOLDER --quiet` as a child
process: exactly what a user's `diloco-chaos run` does (the same validation, the same run directory), with this
process's environment, so a DILOCO_CHAOS_MUTATION reaches every process of the run. Its verdicts are read from
the run directory (invariants.json, through diloco_chaos/harness/report/results.py `invariant_figures`), plus the
bounded invariants the `[explore]` table gives a bound for (max_loss, min_uptime, bound_s, within_s), checked on
the run now. A run that exits 1 (diloco-chaos run's "run failed") or gives no result is a harness error,
recorded with its reason and never shrunk.

Why a child process per run: each run is already a tree of processes started from a forkserver that inherits the
environment of the process that starts it; one child per run keeps runs apart (their own run directory, their
own Toxiproxy server) so `--jobs J` runs J of them at once from threads that only wait.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from diloco_chaos.harness.config.sections import ExploreConfig
from diloco_chaos.harness.explore.incident import write_incident
from diloco_chaos.harness.explore.records import Base, RunLine, Trial, Verdict
from diloco_chaos.harness.invariants import check_all_keywords, load_run
from diloco_chaos.harness.invariants import spec as invariant_spec
from diloco_chaos.harness.report.results import invariant_figures
from diloco_chaos.harness.run.rundir import CONFIG_FILE, REPORT_FILE, read_json

BOUND_KEYS = ("max_loss", "min_uptime", "bound_s", "within_s")
"""`[explore]` keys that are bounds of check_all's bounded invariants (one name everywhere)."""
NOT_JUDGED_BY_DEFAULT = ("faults_fired",)
"""Recorded, not a finding unless `[explore] invariants` names it: a drawn fault can hit a target already down."""
MUTATION_WARNING = "diloco-chaos: WARNING: this run "
"""How `diloco-chaos run` starts its mutation warnings (cli.warn_mutation): printed last, after the error a run
failed with, so the error is the last line that is not one."""
GRACE_S = 120.0
"""A run's child is given timeouts.run_s plus this (start, post-run phase) before it is counted as crashed."""


def judged(name: str, ex: ExploreConfig) -> bool:
    """Whether a violation of invariant `name` is a finding under the `[explore]` table."""
    return name in ex.invariants if ex.invariants else name not in NOT_JUDGED_BY_DEFAULT


def verdicts(run_dir: str | Path, ex: ExploreConfig) -> tuple[Verdict, ...]:
    """The run's recorded verdicts, and those of the bounded invariants the table gives a bound for."""
    out = [Verdict(f.name, f.ok, f.figure, f.bound, judged(f.name, ex)) for f in invariant_figures(run_dir)]
    bounds: dict[str, dict[str, float]] = {}
    for key in BOUND_KEYS:
        value = getattr(ex, key)
        if value:
            inv, name = check_all_keywords()[key]
            bounds.setdefault(inv, {})[name] = value
    if bounds:
        run = load_run(run_dir)
        for inv, args in bounds.items():
            if run.algorithm in invariant_spec(inv).algorithms:
                r = invariant_spec(inv)(run, **args)
                out.append(Verdict(r.name, bool(r.ok), r.figure, r.bound, judged(r.name, ex)))
    return tuple(out)


def _run_dir(folder: Path) -> Path | None:
    dirs = sorted(d for d in folder.iterdir() if d.is_dir() and (d / CONFIG_FILE).is_file())
    return dirs[-1] if dirs else None


def run_trial(base: Base, trial: Trial, default_learners: int, folder: Path, ex: ExploreConfig, timeout_s: float,
              *, index: int, seed: int, phase: Literal["explore", "shrink"] = "explore", shrinking: str = ""
              ) -> RunLine:
    """Run `trial` once in `folder` (created; it gets incident.toml and the run directory) and judge it."""
    folder.mkdir(parents=True, exist_ok=True)
    incident = write_incident(folder / "incident.toml", trial.tables(), f"explore {phase} run {index}")
    cmd = [sys.executable, "-m", "diloco_chaos.harness.entry", "run", *base.run_args(trial, default_learners),
           "--incident", str(incident), "--runs-dir", str(folder), "--quiet"]
    t0 = time.monotonic()
    common = dict(index=index, phase=phase, seed=seed, faults=tuple(trial.tables()), steps=trial.steps,
                  learners=trial.learners, shrinking=shrinking)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s + GRACE_S)
    except subprocess.TimeoutExpired:
        return RunLine(outcome="crashed", failed=(), error=f"no result within {timeout_s + GRACE_S:g} s",
                       wall_s=time.monotonic() - t0, **common)  # type: ignore[arg-type]
    wall = round(time.monotonic() - t0, 2)
    rd = _run_dir(folder)
    if p.returncode != 0 or rd is None or not (rd / REPORT_FILE).is_file():
        said = [x for x in p.stderr.strip().splitlines() if not x.startswith(MUTATION_WARNING)]
        last = (said or [f"exit code {p.returncode}"])[-1]
        return RunLine(outcome="run_failed" if p.returncode == 1 else "crashed", failed=(), error=last,
                       run_dir=str(rd) if rd else None, wall_s=wall, **common)  # type: ignore[arg-type]
    vs = verdicts(rd, ex)
    failed = tuple(v.name for v in vs if v.judged and not v.ok)
    unexpected = sum(not e.get("expected") for e in read_json(rd / REPORT_FILE).get("errors", []))
    return RunLine(outcome="failed" if failed else "passed", failed=failed, verdicts=vs, run_dir=str(rd),
                   wall_s=wall, unexpected_errors=unexpected, **common)  # type: ignore[arg-type]
