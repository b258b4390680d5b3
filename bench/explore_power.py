"""Does explore find the planted fault-path bugs? Each one, with a fixed budget, then its shrunk incident rerun.

Not a test: it prints a table (docs/explore.md, "Explore's power on the planted bugs"). For each planted mutation
(diloco_chaos/trainers/mutations.py; docs/explore-planted.md: bugs no fault-free run shows) it runs `diloco-chaos
explore SCENARIO --budget-s B` with DILOCO_CHAOS_MUTATION set, on the planted scenario with explore's default
vocabulary (every fault kind the scenario accepts: nothing tells explore which fault reaches the bug), and reports:
found or not (an explored run failed one of the invariants that catch that bug), the explore time and runs to the
first such failure, the size of the shrunk schedule (faults, steps, learners), explore's own confirmation of it
(how many of its `confirm_runs` fresh runs failed; smaller schedules backed out of because they did not repeat),
and, independently of that, how many of `--reruns` reruns of that minimal incident, through explore's own runner
with the mutation, fail the same invariant.

    python bench/explore_power.py [--budget-s 900] [--reruns 5] [--seed 0] [--mutations NAME ...]
                                  [--scenario examples/incidents/planted-scenario.toml] [--out DIR] [--set K=V ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from diloco_chaos.chaos.schedule import parse_fault
from diloco_chaos.harness.config.sections import read_toml
from diloco_chaos.harness.explore.records import Base, Trial, read_lines
from diloco_chaos.harness.explore.runner import run_trial
from diloco_chaos.trainers.mutations import ENV_VAR

CATCHES = {
    "restore_older_slot": ("updates_accounted", "token_accounting"),
    "restore_tokens_reset": ("token_accounting",),
    "restore_drops_momentum": ("outer_lr",),
    "resume_one_step_early": ("token_accounting",),
    "skip_initial_pull": ("initial_pull",),
}
"""Each planted fault-path bug and the invariants that catch it (docs/explore-planted.md, docs/sensitivity.md)."""
SCENARIO = "examples/incidents/planted-scenario.toml"


@dataclass(frozen=True)
class Power:
    """One planted bug's row."""

    mutation: str
    found: str | None
    """The catching invariant explore found failing first; None: not found in the budget."""
    first_s: float | None
    """Explore's run time up to and including the first failing run."""
    first_runs: int | None
    explored: int
    faults: int | None
    steps: int | None
    learners: int | None
    shrink_runs: int | None
    """Runs shrinking made, its confirmation runs included."""
    confirmed: str | None
    """Explore's own confirmation of the minimal schedule: "5 of 5" (its fresh runs that failed), None: none."""
    backed_out: int
    """Smaller schedules that shrinking reached but that did not repeat at the rate asked for."""
    reproduced: int
    reruns: int
    wall_s: float


def explore(mutation: str, a: argparse.Namespace, out: Path) -> Power:
    """Explore with the mutation, then rerun the minimal incident of the catching invariant `a.reruns` times."""
    env = dict(os.environ, **{ENV_VAR: mutation})
    cmd = [sys.executable, "-m", "diloco_chaos.harness.entry", "explore", a.scenario, "--budget-s", str(a.budget_s),
           "--until-found",
           "--seed", str(a.seed), "--out", str(out), *(x for s in a.set for x in ("--set", s))]
    t0 = time.monotonic()
    with open(out.with_suffix(".log"), "w") as log:
        subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False,
                       timeout=a.budget_s * 3 + 600)
    wall = time.monotonic() - t0
    jsonl = out / "explore.jsonl"
    lines = [x for x in read_lines(jsonl) if x.phase == "explore"] if jsonl.exists() else []
    catches = CATCHES[mutation]
    first, spent = None, 0.0
    for i, line in enumerate(lines):
        spent += line.wall_s
        hit = [v for v in line.failed if v in catches]
        if hit:
            first = (hit[0], spent, i + 1)
            break
    summary = json.loads((out / "explore-summary.json").read_text()) if (out / "explore-summary.json").exists() \
        else {"minimal": []}
    minimal = next((m for m in summary["minimal"] if first is not None and m["invariant"] == first[0]), None)
    reproduced = 0
    if minimal is not None:
        base = Base(a.scenario, "default", tuple(a.set))
        sc = base.load()
        steps, learners = minimal["trial"]["steps"], minimal["trial"]["learners"]
        faults = tuple(parse_fault(t, f"faults[{i}]", learners)
                       for i, t in enumerate(read_toml(minimal["incident"], "incident file")["faults"]))
        os.environ[ENV_VAR] = mutation  # run_trial's child inherits it
        try:
            for k in range(a.reruns):
                line = run_trial(base, Trial(faults, steps, learners), sc.topology.learners, out / f"rerun-{k}",
                                 sc.explore, sc.timeouts.run_s, index=k, seed=a.seed)
                reproduced += minimal["invariant"] in line.failed
        finally:
            os.environ.pop(ENV_VAR, None)
    return Power(mutation, first[0] if first else None, round(first[1], 1) if first else None,
                 first[2] if first else None, len(lines), len(minimal["trial"]["faults"]) if minimal else None,
                 minimal["trial"]["steps"] if minimal else None, minimal["trial"]["learners"] if minimal else None,
                 minimal["runs"] if minimal else None,
                 f"{minimal['repeat_fails']} of {minimal['repeat_runs']}" if minimal and minimal["repeat_runs"]
                 else None, len(minimal["rejected"]) if minimal else 0, reproduced, a.reruns if minimal else 0,
                 round(wall, 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget-s", type=float, default=900.0)
    ap.add_argument("--reruns", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mutations", nargs="+", default=list(CATCHES), choices=list(CATCHES))
    ap.add_argument("--scenario", default=SCENARIO)
    ap.add_argument("--set", action="append", default=[], help="scenario override for every explore (repeatable)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--json", default=None, help="also write the rows here")
    a = ap.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="explore-power-"))
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in a.mutations:
        row = explore(m, a, root / m)
        rows.append(row)
        print(f"  {row}", flush=True)
    print(f"\nexplore {a.scenario}, budget {a.budget_s:g} s a bug, seed {a.seed}, {a.reruns} reruns of each minimal "
          f"incident ({root})")
    print(f"{'mutation':24}{'found':>20}{'first after':>13}{'runs':>6}{'explored':>9}{'minimal':>22}"
          f"{'shrink runs':>12}{'confirmed':>10}{'backed out':>11}{'reproduced':>11}{'wall s':>8}")
    for r in rows:
        size = f"{r.faults} faults, {r.steps} st, {r.learners} L" if r.faults is not None else "-"
        print(f"{r.mutation:24}{r.found or 'not found':>20}{(f'{r.first_s:.0f} s' if r.first_s else '-'):>13}"
              f"{r.first_runs or '-':>6}{r.explored:>9}{size:>22}{r.shrink_runs or '-':>12}"
              f"{r.confirmed or '-':>10}{r.backed_out:>11}"
              f"{(f'{r.reproduced} of {r.reruns}' if r.reruns else '-'):>11}{r.wall_s:>8.0f}")
    if a.json:
        Path(a.json).write_text(json.dumps([r.__dict__ for r in rows], indent=1))


if __name__ == "__main__":
    main()
