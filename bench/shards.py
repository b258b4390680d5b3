"""Sharded synchronizer (syncer.shards): a chip loss plus one synchronizer crash, with S = 2 shards against S = 1.

Not a test: it prints a table. The built-in chip-loss scenario (the default scenario, decoupled, 4 learners x 2
chips, with learner 1 losing chip 1) gets a second fault: `kill_syncer` on shard 0 (with S = 1, the syncer)
when learner 0 reaches a third of its steps, restored after recovery.syncer_repair_s (2 s here). Per S, over
seeds 0..N-1 (medians): merges logged while shard 0 was out (from its loss to its first merge after its
restore; report.json's shards["0"]), that outage's length, the run's uptime (report.json's
availability.uptime: the training span minus merge gaps beyond the downtime window, over every shard's merges)
and shard 0's own uptime (over its merges alone), merges in all, and the final eval loss.

    python bench/shards.py [--seeds 3] [--steps 120] [--json OUT]
"""

from __future__ import annotations

import logging
import statistics
import tempfile
from typing import Any

from table import Column, emit, parser  # bench/ is the script's directory: on sys.path when run

from diloco_chaos.harness.config.scenario import builtin, from_dict
from diloco_chaos.harness.run.supervisor import run_scenario

COLUMNS = [
    Column("shards", "S", 3, left=True),
    Column("runs", "runs", 5),
    Column("in_outage", "merges in outage", 17, ".0f"),
    Column("outage_s", "outage s", 9, ".2f"),
    Column("uptime", "uptime", 7, ".3f"),
    Column("shard0_uptime", "shard 0 uptime", 15, ".3f"),
    Column("merges", "merges", 7, ".0f"),
    Column("loss", "final loss", 11, ".4f"),
]
REPAIR_S = 2.0


def one(table: dict[str, Any], shards: int, seed: int, steps: int) -> dict[str, Any]:
    kill = {"action": "kill_syncer", "shard": 0, "at": {"step": steps // 3, "learner": 0}}
    faults = [{**f, "at": {"step": steps // 4, "learner": 0}} for f in table["faults"]] + [kill]
    sc = from_dict({**table, "seed": seed, "syncer": {"shards": shards}, "faults": faults,
                    "recovery": {**table["recovery"], "syncer_policy": "restart", "syncer_repair_s": REPAIR_S}})
    with tempfile.TemporaryDirectory() as d:
        rep = run_scenario(sc, d).report
    s0 = rep["shards"]["0"]
    return {"in_outage": s0["merges_in_outage"], "outage_s": s0["outage_s"],
            "uptime": rep["availability"]["uptime"], "shard0_uptime": s0["uptime"], "merges": rep["merge_count"],
            "loss": float(rep["final_eval_loss"])}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1")
    ap.add_argument("--steps", type=int, default=120, help="train.steps (the scenario's own: 300)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    table = builtin("chip-loss").to_dict()
    table.pop("random_faults_source", None)
    table["train"] = {**table["train"], "steps": args.steps}
    rows = []
    for s in (1, 2):
        rs = [one(table, s, seed, args.steps) for seed in range(args.seeds)]
        row: dict[str, Any] = {"shards": s, "runs": len(rs), "per_seed": rs}
        for key in ("in_outage", "outage_s", "uptime", "shard0_uptime", "merges", "loss"):
            row[key] = statistics.median(r[key] for r in rs)
        rows.append(row)
    print(f"chip-loss scenario + kill_syncer(shard 0) at step {args.steps // 3}, repair {REPAIR_S:g} s, "
          f"train.steps = {args.steps}, seeds 0-{args.seeds - 1} (medians)")
    emit(COLUMNS, rows, args.json, detail="per_seed")


if __name__ == "__main__":
    main()
