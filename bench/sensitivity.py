"""Sensitivity of the invariants: inject known regressions into the algorithm and count how often they are caught.

Not a test: it prints a table. For each mutation of diloco_chaos/trainers/mutations.py (switched on by the environment
variable DILOCO_CHAOS_MUTATION, which only the process tree of one run sees), it runs a small scenario on real
processes for each seed, applies every invariant of diloco_chaos.harness.invariants.check_all (converged, faults_fired,
updates_accounted, token_accounting, model_finite and the protocol invariants of
diloco_chaos/harness/invariants/protocol.py) and counts a run as *detected* when at least one of them is violated (or
the run itself failed). The same scenarios, seeds and invariants on the unmodified algorithm give the false-alarm
rate. Scenarios (2 learners x 1 chip, P = H = 4, tau = 3):

* `fault_free`: no fault; every mutation but skip_initial_pull runs on it;
* `restart`: learner 1 killed (`kill_learner`) when learner 0 reaches a third of its steps, restarted after
  0.5 s (`recovery.policy = "restart"`): the scenario a restarted learner's initial pull needs (skip_initial_pull,
  resume_one_step_early);
* `syncer_restart`: the syncer killed (`kill_syncer`) when learner 0 reaches a third of its steps, restored from its
  per-merge checkpoint after 0.5 s (`recovery.syncer_policy = "restart"`): the fault path of the restore_* mutations.

`converged` is bounded by the median final eval loss of the unmodified runs of the same scenario plus
`--loss-tolerance` (0.5 nats: asynchronous runs on a loaded 2-core machine spread by ~0.4 at this length).

    python bench/sensitivity.py [--seeds 5] [--steps 120] [--mutations a,b] [--json out.json] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from diloco_chaos.harness.invariants import check_all, final_loss, load_run
from diloco_chaos.trainers.mutations import ENV_VAR, MUTATIONS

NONE = "none"
"""The unmodified algorithm: its detections are false alarms."""
SCENARIO_OF = ({name: "fault_free" for name in MUTATIONS}
               | {"skip_initial_pull": "restart", "resume_one_step_early": "restart"}
               | {name: "syncer_restart" for name in MUTATIONS if name.startswith("restore_")})
"""The scenario each mutation runs on: a fault-path mutation needs the fault whose path it sits on
(docs/explore-planted.md)."""
LOSS_TOLERANCE = 0.5
RUN_TIMEOUT_S = 300.0
CHILD = ("import json, sys\n"
         "from diloco_chaos.harness.config.scenario import from_dict\n"
         "from diloco_chaos.harness.run.supervisor import run_scenario\n"
         "if __name__ == '__main__':\n"
         "    print(run_scenario(from_dict(json.loads(sys.argv[1])), sys.argv[2]).run_dir)\n")


def scenario_table(kind: str, seed: int, steps: int) -> dict[str, Any]:
    """The scenario `kind` (fault_free, restart or syncer_restart) as a table for
    diloco_chaos.harness.config.scenario.from_dict."""
    table: dict[str, Any] = {
        "name": f"sensitivity-{kind}", "seed": seed, "algorithm": "decoupled",
        "topology": {"learners": 2, "chips_per_learner": 1},
        "train": {"steps": steps, "warmup_steps": 10},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 3},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": RUN_TIMEOUT_S - 30},
    }
    if kind == "restart":
        table["recovery"] = {"policy": "restart", "repair_s": 0.5, "max_restarts": 2}
        table["faults"] = [{"action": "kill_learner", "learner": 1, "at": {"step": steps // 3, "learner": 0}}]
    if kind == "syncer_restart":
        table["recovery"] = {"syncer_policy": "restart", "syncer_repair_s": 0.5, "syncer_checkpoint": "every_merge"}
        table["faults"] = [{"action": "kill_syncer", "at": {"step": steps // 3, "learner": 0}}]
    return table


@dataclass
class RunOutcome:
    """One run and what the invariants said about it."""

    mutation: str
    scenario: str
    seed: int
    run_dir: str | None
    final_eval_loss: float | None
    wall_s: float
    error: str | None = None
    """Why the run did not complete (its exit status and last stderr line), None when it did."""
    violated: list[str] = field(default_factory=list)
    """Invariants that did not hold (plus "run_failed" for a run that did not complete)."""
    messages: list[str] = field(default_factory=list)
    """Their messages."""

    @property
    def detected(self) -> bool:
        return bool(self.violated)


@dataclass
class Row:
    """One line of the table: a mutation (or none) on one scenario, over the seeds."""

    mutation: str
    doc: str
    scenario: str
    runs: int
    detected: int
    rate: float
    caught_by: dict[str, int]
    """Invariant -> runs in which it was violated."""
    mean_final_loss: float | None
    note: str = ""


def run_one(mutation: str, kind: str, seed: int, steps: int, root: Path) -> RunOutcome:
    """Run one scenario in a subprocess whose environment names the mutation (so does every process of the run:
    they start from a forkserver that inherits it), then judge it."""
    out_root = root / mutation / f"{kind}-s{seed}"
    out_root.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env[ENV_VAR] = "" if mutation == NONE else mutation
    t0 = time.monotonic()
    table = json.dumps(scenario_table(kind, seed, steps))
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, table, str(out_root)], env=env, capture_output=True,
                           text=True, timeout=RUN_TIMEOUT_S)
        error = None if p.returncode == 0 else f"exit {p.returncode}: {(p.stderr.strip().splitlines() or [''])[-1]}"
    except subprocess.TimeoutExpired:
        error = f"no result within {RUN_TIMEOUT_S} s"
    dirs = sorted(d for d in out_root.iterdir() if d.is_dir())
    run_dir = dirs[-1] if dirs else None
    res = RunOutcome(mutation, kind, seed, str(run_dir) if run_dir else None, None, time.monotonic() - t0, error)
    if error is not None:
        res.violated.append("run_failed")
        res.messages.append(error)
    return res


def judge(res: RunOutcome, loss_bound: float) -> None:
    """Apply check_all (converged with `loss_bound`) to a finished run; fills violated and messages."""
    if res.run_dir is None or not (Path(res.run_dir) / "events.jsonl").exists():
        return
    record = load_run(res.run_dir)
    res.final_eval_loss = final_loss(record)
    for r in check_all(record, max_loss=loss_bound):
        if not r.ok:
            res.violated.append(r.name)
            res.messages.append(r.message())


def rows_of(outcomes: list[RunOutcome]) -> list[Row]:
    rows = []
    keys = sorted({(o.mutation, o.scenario) for o in outcomes}, key=lambda k: (k[0] != NONE, k[0], k[1]))
    for mutation, kind in keys:
        xs = [o for o in outcomes if o.mutation == mutation and o.scenario == kind]
        caught: Counter[str] = Counter(name for o in xs for name in dict.fromkeys(o.violated))
        losses = [o.final_eval_loss for o in xs if o.final_eval_loss is not None]
        n_det = sum(o.detected for o in xs)
        note = "not caught by any invariant" if mutation != NONE and n_det == 0 else ""
        rows.append(Row(mutation, MUTATIONS.get(mutation, "the unmodified algorithm (false alarms)"), kind, len(xs),
                        n_det, round(n_det / len(xs), 3) if xs else 0.0, dict(caught.most_common()),
                        round(statistics.mean(losses), 3) if losses else None, note))
    return rows


def print_table(rows: list[Row], bounds: dict[str, float]) -> None:
    print(f"\nconverged bound per scenario: {', '.join(f'{k} {v:.3f}' for k, v in bounds.items())}")
    head = f"{'mutation':<22} {'scenario':<11} {'runs':>4} {'detected':>8} {'rate':>5} {'loss':>6}  caught by"
    print(head)
    print("-" * len(head) + "-" * 30)
    for r in rows:
        label = f"{r.mutation} (false alarm)" if r.mutation == NONE else r.mutation
        caught = ", ".join(f"{k} {v}/{r.runs}" for k, v in r.caught_by.items()) or "-"
        loss = f"{r.mean_final_loss:.3f}" if r.mean_final_loss is not None else "n/a"
        print(f"{label:<22} {r.scenario:<11} {r.runs:>4} {r.detected:>8} {r.rate:>5.2f} {loss:>6}  {caught}"
              + (f"  [{r.note}]" if r.note else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 for every mutation and the baseline")
    ap.add_argument("--steps", type=int, default=120, help="inner steps per learner")
    ap.add_argument("--mutations", default=",".join(MUTATIONS), help="comma-separated subset of: "
                    + ", ".join(MUTATIONS))
    ap.add_argument("--loss-tolerance", type=float, default=LOSS_TOLERANCE,
                    help="converged: bound = median unmodified final loss of the scenario + this")
    ap.add_argument("--json", help="also write the table and every run's verdicts to this JSON file")
    ap.add_argument("--runs-dir", help="keep the run directories here (default: a temporary directory)")
    args = ap.parse_args(argv)
    chosen = [m.strip() for m in args.mutations.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MUTATIONS]
    if unknown:
        ap.error(f"unknown mutation(s) {unknown}; allowed: {', '.join(MUTATIONS)}")
    kinds = sorted({SCENARIO_OF[m] for m in chosen} | {"fault_free"})
    tmp = None if args.runs_dir else tempfile.TemporaryDirectory(prefix="sensitivity-")
    root = Path(args.runs_dir or tmp.name)  # type: ignore[union-attr]
    plan = [(NONE, k, s) for k in kinds for s in range(args.seeds)]
    plan += [(m, SCENARIO_OF[m], s) for m in chosen for s in range(args.seeds)]
    outcomes: list[RunOutcome] = []
    try:
        for i, (mutation, kind, seed) in enumerate(plan, 1):
            outcomes.append(run_one(mutation, kind, seed, args.steps, root))
            o = outcomes[-1]
            print(f"[{i}/{len(plan)}] {mutation} {kind} seed {seed}: {o.wall_s:.1f} s"
                  + (f", {o.error}" if o.error else ""), flush=True)
        bounds = {}
        for k in kinds:
            losses = [x for o in outcomes if o.mutation == NONE and o.scenario == k and o.run_dir is not None
                      and (x := final_loss(load_run(o.run_dir))) is not None]
            bounds[k] = (statistics.median(losses) if losses else 5.0) + args.loss_tolerance
        for o in outcomes:
            judge(o, bounds[o.scenario])
        rows = rows_of(outcomes)
        print_table(rows, bounds)
        for o in outcomes:
            if o.messages and o.mutation == NONE:
                print(f"false alarm, {o.scenario} seed {o.seed} ({o.run_dir}):\n  " + "\n  ".join(o.messages))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({
                "seeds": args.seeds, "steps": args.steps, "loss_tolerance": args.loss_tolerance,
                "converged_bounds": bounds, "scenarios": {k: scenario_table(k, 0, args.steps) for k in kinds},
                "rows": [asdict(r) for r in rows], "runs": [asdict(o) for o in outcomes]}, indent=1))
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
