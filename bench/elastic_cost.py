"""What production-style elastic data-parallel pays for a failure, against Decoupled DiLoCo: a sweep.

Not a test: it prints a table. elastic_ddp with `[elastic] engine = "torchrun"` (one torchrun elastic job: a lost
chip stops every worker, torchrun rendezvouses again and restarts them all from the last checkpoint, written every
`checkpoint_every` steps) and decoupled run the same scenario: M learners x C chips, `--steps` steps, `failures`
chip kills spread evenly over the run (each repaired after `--repair-s`). For each checkpoint interval and number
of failures: goodput (docs/metrics.md), uptime, final eval loss, elastic_ddp's restarts, steps redone and the mean
of each restart phase (report.json `elastic_restarts`). Then, for each number of failures, the break-even
checkpoint interval: the largest interval at which elastic_ddp's goodput is still at least decoupled's (none:
decoupled ahead at every interval measured).

    python bench/elastic_cost.py [--intervals 10 25 50] [--failures 1 2] [--steps 150] [--learners 2] [--chips 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from typing import Any

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.run.supervisor import run_scenario


def scenario(algorithm: str, steps: int, learners: int, chips: int, failures: int, interval: int,
             repair_s: float, seed: int) -> Any:
    kills = [{"action": "kill_chip", "learner": 1 + i % (learners - 1), "chip": chips - 1,
              "at": {"step": steps * (i + 1) // (failures + 1), "learner": 0}} for i in range(failures)]
    table: dict[str, Any] = {
        "name": "elastic-cost", "seed": seed, "algorithm": algorithm,
        "topology": {"learners": learners, "chips_per_learner": chips},
        "train": {"steps": steps},
        "eval": {"every_s": 5.0, "batches": 2},
        "timeouts": {"run_s": 900.0},
        "recovery": {"policy": "elastic", "repair_s": repair_s, "max_restarts": failures},
        "faults": kills,
    }
    if algorithm == "elastic_ddp":
        table["elastic"] = {"engine": "torchrun", "checkpoint_every": interval, "max_restarts": failures + 1,
                            "rdzv_timeout_s": 60.0}
    return from_dict(table)


def figures(report: dict[str, Any]) -> dict[str, Any]:
    er = report.get("elastic_restarts") or {}
    phases: dict[str, list[float]] = {}
    for r in er.get("per_restart", []):
        for name, s in r["phases"].items():
            if s is not None:
                phases.setdefault(name, []).append(s)
    return {"goodput": report["goodput"]["goodput"], "uptime": report["availability"]["uptime"],
            "final": report["final_eval_loss"], "restarts": er.get("restarts", 0),
            "redone": er.get("steps_redone", 0), "phases": {k: statistics.mean(v) for k, v in phases.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--intervals", type=int, nargs="+", default=[10, 25, 50])
    ap.add_argument("--failures", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--chips", type=int, default=2)
    ap.add_argument("--repair-s", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows: list[tuple[int, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory() as d:
        for n in a.failures:
            dec = figures(run_scenario(scenario("decoupled", a.steps, a.learners, a.chips, n, 0, a.repair_s,
                                                a.seed), d).report)
            rows.append((n, "decoupled", dec))
            for interval in a.intervals:
                el = figures(run_scenario(scenario("elastic_ddp", a.steps, a.learners, a.chips, n, interval,
                                                   a.repair_s, a.seed), d).report)
                rows.append((n, f"elastic_ddp, checkpoint every {interval}", el))
                print(f"  {n} failure(s), checkpoint every {interval}: {el}", flush=True)
    print(f"\n{a.learners} learners x {a.chips} chips, {a.steps} steps, seed {a.seed}, repair {a.repair_s} s")
    print(f"{'failures':>8}  {'run':34} {'goodput':>8} {'uptime':>7} {'final':>7} {'restarts':>8} {'redone':>6}  "
          "mean restart phases (s)")
    for n, name, f in rows:
        ph = ", ".join(f"{k} {v:.2f}" for k, v in f["phases"].items())
        print(f"{n:>8}  {name:34} {f['goodput']:8.3f} {f['uptime']:7.3f} {f['final']:7.3f} {f['restarts']:8d} "
              f"{f['redone']:6d}  {ph}")
    print("\nbreak-even (largest checkpoint interval at which elastic_ddp's goodput >= decoupled's):")
    for n in a.failures:
        dec = next(f["goodput"] for k, name, f in rows if k == n and name == "decoupled")
        ok = [int(name.rsplit(" ", 1)[1]) for k, name, f in rows
              if k == n and name != "decoupled" and f["goodput"] >= dec]
        print(f"  {n} failure(s): " + (f"every {max(ok)} steps" if ok else
                                       f"none (decoupled {dec:.3f} ahead at every interval measured)"))


if __name__ == "__main__":
    main()
