"""Wire precision (diloco.wire_dtype): bytes on the links and final eval loss of each dtype, over seeds.

Not a test: it prints a table. The built-in fault-free scenario (decoupled, 4 learners x 2 chips) is run for each
wire dtype and seeds 0..N-1 (--seeds), optionally with fewer steps (--steps; the figures in
docs/wire-precision.md say which). Per dtype: the frame bytes every link carried up and down (report.json's
wire_bytes_up / wire_bytes_down, all frames: tensors, metadata, PINGs), per merge, and as a fraction of fp32's
(seed by seed, then the median); the median final eval loss, its spread (max - min) and its difference from
fp32's median.

    python bench/wire_dtype.py [--seeds 3] [--steps N] [--dtypes fp32,bf16,int8,int4] [--json OUT]
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
    Column("dtype", "dtype", 6, left=True),
    Column("runs", "runs", 5),
    Column("bytes_per_merge", "B/merge", 10, ".0f"),
    Column("up_MB", "up MB", 8, ".2f"),
    Column("down_MB", "down MB", 9, ".2f"),
    Column("vs_fp32", "vs fp32", 9, ".3f"),
    Column("loss", "median loss", 12, ".4f"),
    Column("spread", "spread", 8, ".4f"),
    Column("dloss", "vs fp32", 9, "+.4f"),
]


def one(table: dict[str, Any], dtype: str, seed: int) -> dict[str, Any]:
    sc = from_dict({**table, "seed": seed, "diloco": {**table["diloco"], "wire_dtype": dtype}})
    with tempfile.TemporaryDirectory() as d:
        rep = run_scenario(sc, d).report
    return {"up": rep["wire_bytes_up"], "down": rep["wire_bytes_down"], "merges": rep["merge_count"],
            "loss": float(rep["final_eval_loss"])}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", type=int, default=3, help="run seeds 0..N-1")
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the scenario's)")
    ap.add_argument("--dtypes", default="fp32,bf16,int8,int4", help="comma-separated; fp32 first for ratios")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    table = builtin("fault-free").to_dict()
    table.pop("random_faults_source", None)
    if args.steps is not None:
        table["train"] = {**table["train"], "steps": args.steps}
    runs = {dt: [one(table, dt, s) for s in range(args.seeds)] for dt in args.dtypes.split(",")}
    base = runs.get("fp32")
    rows = []
    for dt, rs in runs.items():
        total = [r["up"] + r["down"] for r in rs]
        losses = [r["loss"] for r in rs]
        row: dict[str, Any] = {
            "dtype": dt, "runs": len(rs), "bytes_per_merge": statistics.median(t / max(1, r["merges"])
                                                                          for t, r in zip(total, rs, strict=True)),
            "up_MB": statistics.median(r["up"] for r in rs) / 1e6,
            "down_MB": statistics.median(r["down"] for r in rs) / 1e6,
            "loss": statistics.median(losses), "spread": max(losses) - min(losses), "finals": losses,
            "vs_fp32": None, "dloss": None}
        if base is not None:
            row["vs_fp32"] = statistics.median(t / (b["up"] + b["down"]) for t, b in zip(total, base, strict=True))
            row["dloss"] = row["loss"] - statistics.median(b["loss"] for b in base)
        rows.append(row)
    print(f"fault-free scenario, train.steps = {table['train']['steps']}, seeds 0-{args.seeds - 1}")
    emit(COLUMNS, rows, args.json, detail="finals")


if __name__ == "__main__":
    main()
