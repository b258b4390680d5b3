"""How often a failure explore found repeats: the figure behind `[explore] tries` and `must_fail` (docs/explore.md).

Not a test: it prints one line per run and a summary. It runs the same schedule (a scenario and an incident file,
e.g. explore's minimal-<invariant>.toml) N times through explore's own runner (diloco_chaos/harness/explore/
runner.py: a `diloco-chaos run --incident` child per run, judged as explore judges it) and counts the runs that
violate the invariant. Run it once with the mutation in the environment (the repeat rate of a real failure) and
once without (the false-alarm rate of the same schedule).

    DILOCO_CHAOS_MUTATION=skip_initial_pull python bench/explore_repeat.py SCENARIO INCIDENT --invariant initial_pull
        [--times 10] [--set KEY=VALUE ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from diloco_chaos.chaos.schedule import parse_fault
from diloco_chaos.harness.config.sections import read_toml
from diloco_chaos.harness.explore.records import Base, Trial
from diloco_chaos.harness.explore.runner import run_trial
from diloco_chaos.trainers.mutations import ENV_VAR


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("incident")
    ap.add_argument("--invariant", required=True)
    ap.add_argument("--times", type=int, default=10)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    base = Base(a.scenario, "default", tuple(s for s in a.set if not s.startswith("train.steps=")))
    sc = base.load(a.set)
    faults = tuple(parse_fault(t, f"faults[{i}]", sc.topology.learners)
                   for i, t in enumerate(read_toml(a.incident, "incident file")["faults"]))
    trial = Trial(faults, sc.train.steps, sc.topology.learners)
    out = Path(a.out or tempfile.mkdtemp(prefix="explore-repeat-"))
    failed = errors = 0
    for i in range(a.times):
        line = run_trial(base, trial, sc.topology.learners, out / f"run-{i:02d}", sc.explore, sc.timeouts.run_s,
                         index=i, seed=0)
        failed += a.invariant in line.failed
        errors += line.outcome in ("run_failed", "crashed")
        print(f"run {i}: {line.outcome} {','.join(line.failed)} {line.wall_s:.0f} s {line.error}", flush=True)
    print(f"{ENV_VAR}={os.environ.get(ENV_VAR, '') or 'none'}: {a.invariant} failed in {failed} of {a.times} runs, "
          f"{errors} harness errors ({out})")


if __name__ == "__main__":
    main()
