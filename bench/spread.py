"""Run-to-run spread of the final eval loss: where it comes from and how large it is.

Not a test: it prints a table. A scenario (the built-in fault-free one unless --scenario) is run over seeds
0..N-1 (--seeds) and N times with one seed (--repeats): the first spread holds everything a seed changes
(initial weights, data order, timing); the second only what differs between two runs of the same seed
(merge order and the timing of pushes: what asynchrony makes, and the deterministic mode removes). For each
set: mean, sample standard deviation, range, and the final evaluation's own noise (the standard error of the
mean over the held-out sequences: a different held-out sample of the same size would move the figure by
about this much).

    python bench/spread.py [--scenario FILE] [--seeds 10] [--repeats 0] [--set KEY=VALUE ...] [--json OUT]
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from table import Column, emit, parser  # bench/ is the script's directory: on sys.path when run

from diloco_chaos.harness.config.scenario import Scenario, builtin, from_dict, load
from diloco_chaos.harness.report.run_report import final_model
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.trainers.data import eval_batches, make_splits


def holdout_stderr(run_dir: Path, sc: Scenario) -> float:
    """Standard error of the final eval loss: the per-sequence losses' deviation over sqrt(sequences)."""
    loaded = final_model(run_dir, sc)
    assert loaded is not None, f"{run_dir}: no final checkpoint"
    model = loaded[0]
    losses: list[float] = []
    with torch.no_grad():
        for x, y in eval_batches(make_splits(sc.data, sc.topology.learners).holdout, sc.model.seq_len, 1, 10**9):
            losses.append(float(model.loss(x, y)))
    return statistics.stdev(losses) / math.sqrt(len(losses))


def parse_set(items: list[str]) -> dict[str, Any]:
    """`section.key=value` overrides (value parsed as JSON, else kept as a string) as a nested dict."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


def one(table: dict[str, Any], seed: int) -> tuple[float, float, float]:
    """(final eval loss, its held-out standard error, wall seconds) of one run."""
    sc = from_dict({**table, "seed": seed})
    with tempfile.TemporaryDirectory() as d:
        res = run_scenario(sc, d)
        return float(res.report["final_eval_loss"]), holdout_stderr(res.run_dir, sc), float(res.report["wall_s"])


def stats(finals: list[float]) -> dict[str, Any]:
    """Mean, sample standard deviation (0 for one run), range and the rounded figures of some final evals:
    the columns every bench/ spread table shares."""
    return {"runs": len(finals), "mean": statistics.mean(finals),
            "std": statistics.stdev(finals) if len(finals) > 1 else 0.0, "min": min(finals), "max": max(finals),
            "finals": [round(f, 4) for f in finals]}


def summary(label: str, runs: list[tuple[float, float, float]]) -> dict[str, Any]:
    return {"set": label, **stats([r[0] for r in runs]), "eval_stderr": statistics.mean(r[1] for r in runs),
            "wall_s": statistics.mean(r[2] for r in runs)}


COLUMNS = (Column("set", "set", 16, left=True), Column("runs", "runs", 5), Column("mean", "mean", 9, ".4f"),
           Column("std", "std", 9, ".4f"), Column("min", "min", 9, ".4f"), Column("max", "max", 9, ".4f"),
           Column("eval_stderr", "eval se", 9, ".4f"), Column("wall_s", "wall s", 8, ".1f"))


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--scenario", help="scenario file (default: the built-in fault-free scenario)")
    ap.add_argument("--seeds", type=int, default=10, help="run seeds 0..N-1")
    ap.add_argument("--repeats", type=int, default=0, help="also run the scenario's own seed N times")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a scenario key, e.g. diloco.deterministic=true or train.steps=200")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sc = load(args.scenario) if args.scenario else builtin("fault-free")
    table = sc.to_dict()
    table.pop("random_faults_source", None)
    table = merged(table, parse_set(args.set))
    rows = []
    if args.seeds:
        rows.append(summary(f"seeds 0-{args.seeds - 1}", [one(table, s) for s in range(args.seeds)]))
    if args.repeats:
        rows.append(summary(f"seed {sc.seed} x{args.repeats}", [one(table, sc.seed) for _ in range(args.repeats)]))
    print(f"scenario {sc.name} ({table['algorithm']}) overrides {parse_set(args.set) or '-'}")
    emit(COLUMNS, rows, args.json, detail="finals")

if __name__ == "__main__":
    main()
