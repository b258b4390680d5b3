"""Quorum and grace window with mixed-speed learners: K=M, K=1, and K=1 with the adaptive grace window.

Not a test: it prints a table. M=4 learners x 1 chip, two of them held to half the fast learners' progress
(SIGSTOP/SIGCONT, `slow` fault). The quorum counts learners that reached the fragment's sync point at their own
cadence (docs/algorithm.md, Syncer). For each configuration: final eval loss, wall time, merges, mean participants
per merge and how many of them were carried over from an earlier round (answers that came after their round
merged), and the fraction of trained tokens that reached the global model (tokens merged / tokens trained,
the token side of goodput), goodput and uptime (diloco_chaos/harness/report/metrics.py), steps/s over the whole run, and
the slow learners' achieved speed relative to the fast ones while all four trained (report.json speed_profiles).

    python bench/quorum_stragglers.py [--steps 200] [--seed 0] [--budget total|per_learner] [--runs-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.supervisor import run_scenario

CONFIGS = {
    "K=M (wait for all)": {"min_quorum": 4, "grace_enabled": False},
    "K=1, no grace": {"min_quorum": 1, "grace_enabled": False},
    "K=1, adaptive grace": {"min_quorum": 1, "grace_enabled": True},
}


def run(steps: int, seed: int, diloco: dict, budget: str, runs_dir: str | None = None) -> dict:
    sc = from_dict({
        "name": "quorum-stragglers", "seed": seed, "algorithm": "decoupled",
        "topology": {"learners": 4, "chips_per_learner": 1},
        "train": {"steps": steps, "budget": budget},
        "diloco": {"fragments": 8, "sync_every": 8, "overlap": 2, **diloco},
        "eval": {"every_s": 5.0},
        "faults": [{"action": "slow", "learner": m, "speed": 0.5} for m in (2, 3)],
    })
    with tempfile.TemporaryDirectory() as d:
        res = run_scenario(sc, runs_dir or d)  # --runs-dir keeps the run directories to look into
        merges = [e for e in read_events(res.run_dir / EVENTS_FILE) if e["ev"] == "merge"]
    rep = res.report
    return {"final": rep["final_eval_loss"], "wall": rep["wall_s"], "merges": rep["merge_count"],
            "participants": statistics.mean(len(e["participants"]) for e in merges) if merges else 0.0,
            "carried": statistics.mean(len(e.get("carried", [])) for e in merges) if merges else 0.0,
            "merged_frac": rep["tokens_merged"] / rep["tokens_trained"] if rep["tokens_trained"] else 0.0,
            "slow_steps_s": statistics.mean(rep["per_learner"][str(m)]["steps_per_s"] for m in (2, 3)),
            "fast_steps_s": statistics.mean(rep["per_learner"][str(m)]["steps_per_s"] for m in (0, 1)),
            "goodput": rep["goodput"]["goodput"], "uptime": rep["availability"]["uptime"],
            "achieved": statistics.mean(p["achieved"] for p in rep["speed_profiles"] if p["achieved"] is not None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", choices=("total", "per_learner"), default="total",
                    help="train.budget: total (default, the paper's fixed token budget: fast learners train on "
                         "while the slow ones lag, none idles) or per_learner (each learner its own steps)")
    ap.add_argument("--runs-dir", default=None, help="keep the run directories here (default: temporary)")
    a = ap.parse_args()
    rows = {name: run(a.steps, a.seed, cfg, a.budget, a.runs_dir) for name, cfg in CONFIGS.items()}
    print(f"M=4 x 1 chip, learners 2 and 3 at speed 0.5, {a.steps} steps, budget {a.budget}, seed {a.seed}")
    print(f"{'configuration':22} {'final eval':>10} {'wall s':>7} {'merges':>7} {'particip.':>9} "
          f"{'carried':>7} {'merged tok':>10} {'goodput':>8} {'uptime':>7} {'fast st/s':>9} {'slow st/s':>9} "
          f"{'achieved':>8}")
    for name, r in rows.items():
        print(f"{name:22} {r['final']:10.3f} {r['wall']:7.1f} {r['merges']:7d} {r['participants']:9.2f} "
              f"{r['carried']:7.2f} {r['merged_frac']:10.2f} {r['goodput']:8.2f} {r['uptime']:7.2f} "
              f"{r['fast_steps_s']:9.1f} {r['slow_steps_s']:9.1f} {r['achieved']:8.2f}")


if __name__ == "__main__":
    main()
