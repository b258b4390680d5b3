"""Benchmark: how long a torchft replica group takes to commit again after a kernel partition, by partition length.

What: real torchft runs on netns hosts (`[launch] hosts = "netns"`, `links.backend = "kernel"`): 3 replica groups
x 1 rank, torchft_ddp, min_replicas = 2, the short timeouts of suites/test_torchft_netns.py (join and heartbeat
1 s, Gloo 3 s) but a quorum timeout of 60 s, so the victim's quorum request outlives the partition. One
`partition` (blackhole: nftables drops every TCP packet of the group's veth, both ways) of group 2 from learner
0's step 10 for each `--lengths` seconds, `--runs` times each. Each row: the partition's length as it happened,
the survivors' longest stall and when they first committed without the victim (excluded), the time from the
partition's end to the victim's first commit (recovery), the step it healed to, whether that commit followed a
heal, its participants, and the replicas_agree verdict. The training is long enough (`--steps-per-s` x the
partition) that the survivors are still training when the victim comes back.

Why: the torchft notes (docs/targets/torchft.md "Partitions on netns hosts") measured that after a long
partition gRPC waits out TCP's retransmission backoff before the victim's heartbeats reach the Lighthouse
again, so recovery grows with partition length; this puts figures on it for the lengths a suite can afford.

Usage (root, `ip`, `tc`, `nft`, torchft): ``python bench/torchft_partition.py [--lengths 2 5 10] [--runs 3]
[--json out.json] [--runs-dir DIR]``
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import Column, emit, parser  # noqa: E402
from diloco_chaos.harness.config.scenario import from_dict  # noqa: E402
from diloco_chaos.harness.hosts.netns import availability  # noqa: E402
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events  # noqa: E402
from diloco_chaos.harness.run.supervisor import run_scenario  # noqa: E402

VICTIM = 2
AT_STEP = 10
COLUMNS = (Column("set_s", "set s", 6, ".0f"), Column("run", "run", 4, "d"),
           Column("partition_s", "partition s", 12, ".2f"), Column("stall_s", "survivor stall s", 17, ".2f"),
           Column("excluded_s", "excluded after s", 17, ".2f"), Column("recovery_s", "end->victim commit s", 21, ".2f"),
           Column("healed_to", "healed to", 10, "d"), Column("healed", "healed", 7, left=True),
           Column("participants", "participants", 13, "d"), Column("agree", "agree", 6, left=True),
           Column("steps", "steps", 6, "d"))


def scenario(length_s: float, steps: int, seed: int) -> Any:
    return from_dict({
        "name": "torchft-partition", "seed": seed, "algorithm": "torchft_ddp",
        "topology": {"learners": 3, "chips_per_learner": 1},
        "train": {"steps": steps, "warmup_steps": 10, "lr": 3e-3},
        "eval": {"batches": 2},
        "timeouts": {"run_s": 240.0},
        "torchft": {"min_replicas": 2, "join_timeout_s": 1.0, "heartbeat_timeout_s": 1.0, "timeout_s": 3.0,
                    "connect_timeout_s": 3.0, "quorum_timeout_s": 60.0, "quorum_tick_ms": 100},
        "launch": {"hosts": "netns"},
        "links": {"backend": "kernel", "proxy": "off"},
        "faults": [{"action": "partition", "learner": VICTIM, "at": {"step": AT_STEP, "learner": 0},
                    "until": {"after_s": length_s}}],
    })


def measure(length_s: float, run: int, steps: int, runs_dir: str) -> dict[str, Any]:
    res = run_scenario(scenario(length_s, steps, seed=run), runs_dir)
    evs = read_events(res.run_dir / EVENTS_FILE)
    start = next(e["t"] for e in evs if e["ev"] == "fault_start")
    end = next(e["t"] for e in evs if e["ev"] == "fault_end")
    commits = [e for e in evs if e["ev"] == "torchft_sync" and e["committed"]]
    survivors = [e for e in commits if e["learner"] != VICTIM]
    excluded = next((e["t"] for e in survivors if e["t"] > start and e["participants"] == 2), None)
    stall = 0.0
    for m in (0, 1):
        ts = [e["t"] for e in evs if e["ev"] == "step" and e["learner"] == m]
        stall = max([stall, *[b - a for a, b in zip(ts, ts[1:], strict=False) if b >= start and a <= end]])
    back = [e for e in commits if e["learner"] == VICTIM and e["t"] > end]
    invariants = json.loads((res.run_dir / "invariants.json").read_text())["invariants"]
    agree = next(r for r in invariants if r["name"] == "replicas_agree")
    first = back[0] if back else {}
    return {"set_s": length_s, "run": run, "partition_s": end - start, "stall_s": stall,
            "excluded_s": None if excluded is None else excluded - start,
            "recovery_s": first["t"] - end if back else None, "healed_to": first.get("step"),
            "healed": str(first.get("healed", "-")), "participants": first.get("participants"),
            "agree": "ok" if agree["ok"] else "FAIL", "steps": steps}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--lengths", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps-per-s", type=float, default=80.0,
                    help="training steps per second of partition, beyond 150 (the survivors must outlast the "
                         "victim's recovery: about 30 steps/s here)")
    ap.add_argument("--runs-dir", default=None, help="keep the run directories here (default: temporary)")
    args = ap.parse_args()
    why = availability()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for length_s in args.lengths:
            steps = 150 + round(args.steps_per_s * length_s)
            for run in range(args.runs):
                rows.append(measure(length_s, run, steps, args.runs_dir or tmp))
                print(rows[-1], file=sys.stderr, flush=True)
    emit(COLUMNS, rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
