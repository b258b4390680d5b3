"""Quality parity at miniature: each algorithm's final eval loss against fault-free ddp's at equal tokens.

Not a test: it prints a table. For every step count in --steps, the scenario (the built-in fault-free one unless
--scenario names a file or --suite a suite's scenario function, such as test_compare:compare_scenario) is run
fault-free (its [[faults]] dropped) with each algorithm in --algorithms over seeds 0..N-1, with the --set overrides
for all of them and --set-for ALGORITHM:KEY=VALUE for one of them (e.g. a DiLoCo outer learning rate). With
train.budget per_learner every algorithm trains steps x learners x chips batches, so the tokens are equal by
construction. Each row gives the mean final eval, its standard deviation over the seeds, and the gap to
ddp's mean at the same steps: the parity curve (how the gap shrinks with training) that docs/metrics.md
records and diloco_chaos/harness/report/compare.py's verdict uses.

    python bench/parity.py [--steps 300,600,1200] [--seeds 2] [--algorithms ddp,diloco,decoupled]
                           [--scenario FILE | --suite MODULE:FUNCTION]
                           [--set KEY=VALUE ...] [--set-for ALGORITHM:KEY=VALUE ...] [--json OUT]
"""

from __future__ import annotations

import logging
import statistics
from typing import Any

from spread import merged, one, parse_set, stats  # bench/ is the script's directory: on sys.path when run
from table import Column, emit, parser
from tolerances import suite

from diloco_chaos.harness.config.scenario import builtin, load

COLUMNS = (Column("steps", "steps", 6), Column("algorithm", "algorithm", 12, left=True),
           Column("runs", "runs", 5), Column("mean", "mean", 9, ".4f"), Column("std", "std", 9, ".4f"),
           Column("gap_to_ddp", "gap", 9, "+.4f"), Column("eval_stderr", "eval se", 9, ".4f"),
           Column("wall_s", "wall s", 8, ".1f"))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--scenario", help="scenario file (default: the built-in fault-free scenario)")
    ap.add_argument("--suite", metavar="MODULE:FUNCTION",
                    help="a suite's scenario function, e.g. test_compare:compare_scenario (instead of --scenario)")
    ap.add_argument("--steps", default="300", help="comma-separated train.steps values")
    ap.add_argument("--seeds", type=int, default=2, help="run seeds 0..N-1 for each cell")
    ap.add_argument("--algorithms", default="ddp,diloco,decoupled")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every run")
    ap.add_argument("--set-for", action="append", default=[], metavar="ALGORITHM:KEY=VALUE",
                    help="override for one algorithm's runs, e.g. decoupled:diloco.outer_lr=0.35")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.suite:
        module, _, function = args.suite.partition(":")
        sc = getattr(suite(module), function)()
    else:
        sc = load(args.scenario) if args.scenario else builtin("fault-free")
    base = sc.to_dict()
    base.pop("random_faults_source", None)
    base["faults"] = []
    base = merged(base, parse_set(args.set))
    per_algo: dict[str, list[str]] = {}
    for item in args.set_for:
        algo, _, kv = item.partition(":")
        per_algo.setdefault(algo, []).append(kv)
    algorithms = args.algorithms.split(",")
    rows: list[dict[str, Any]] = []
    for steps in (int(s) for s in args.steps.split(",")):
        ddp_mean: float | None = None
        for algo in algorithms:
            table = merged(base, {"algorithm": algo, "train": {"steps": steps}})
            table = merged(table, parse_set(per_algo.get(algo, [])))
            runs = [one(table, seed) for seed in range(args.seeds)]
            cell = stats([r[0] for r in runs])
            if algo == "ddp":
                ddp_mean = cell["mean"]
            rows.append({"steps": steps, "algorithm": algo, "overrides": per_algo.get(algo, []), **cell,
                         "gap_to_ddp": None if ddp_mean is None else cell["mean"] - ddp_mean,
                         "eval_stderr": statistics.mean(r[1] for r in runs),
                         "wall_s": statistics.mean(r[2] for r in runs)})
    print(f"scenario {sc.name}, overrides {parse_set(args.set) or '-'}, per algorithm {per_algo or '-'}")
    emit(COLUMNS, rows, args.json)

if __name__ == "__main__":
    main()
