"""The paper's K table (Figure 6) in miniature, with enough seeds to say which differences are real.

Not a test: it prints a table. M = 4 learners x 1 chip, learners 2 and 3 held to `--speed` of their own pace (or, with
`--relative-to others`, of the fast ones' progress) with `--jitter` (the `slow` fault), the scenario of
bench/quorum_stragglers.py. Rows: K = M (wait for all), K = 1 without
grace, K = 1 with the adaptive grace window, each under every `--apply-wait` given (diloco.apply_wait) with
`--broadcast` (diloco.broadcast). For each row over `--seeds` seeds: mean +- sd of goodput, uptime, participants per
merge, final eval loss and tokens merged / trained; then, for each pair of rows with the same apply_wait, a
two-sided permutation test on the final eval loss and on goodput (the share of the 10 000 relabellings whose
difference of means is at least the measured one: a p-value that assumes no distribution).

    python bench/k_table.py [--seeds 10] [--steps 200] [--broadcast all] [--apply-wait on_arrival block]
                            [--speed 0.5] [--jitter 0.2] [--relative-to own] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import statistics
import tempfile
from typing import Any

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.supervisor import RunFailed, run_scenario

CONFIGS = {
    "K=M": {"min_quorum": 4, "grace_enabled": False},
    "K=1": {"min_quorum": 1, "grace_enabled": False},
    "K=1+grace": {"min_quorum": 1, "grace_enabled": True},
}
FIGURES = ("goodput", "uptime", "participants", "final", "merged_frac")
PERMUTATIONS = 10_000


def run(seed: int, steps: int, diloco: dict[str, Any], speed: float, jitter: float, relative_to: str,
        runs_dir: str) -> dict[str, float] | str:
    """One run's figures, or why it failed (its run directory is kept under `runs_dir`)."""
    sc = from_dict({
        "name": "k-table", "seed": seed, "algorithm": "decoupled",
        "topology": {"learners": 4, "chips_per_learner": 1},
        "train": {"steps": steps, "budget": "total"},
        "diloco": {"fragments": 8, "sync_every": 8, "overlap": 2, **diloco},
        "eval": {"every_s": 5.0},
        "faults": [{"action": "slow", "learner": m, "speed": speed, "jitter": jitter, "relative_to": relative_to}
                   for m in (2, 3)],
    })
    try:
        res = run_scenario(sc, runs_dir)
    except RunFailed as e:
        return f"failed: {e}"
    merges = [e for e in read_events(res.run_dir / EVENTS_FILE) if e["ev"] == "merge"]
    shutil.rmtree(res.run_dir)  # a failed run's directory stays, to be looked into
    rep = res.report
    return {"goodput": rep["goodput"]["goodput"], "uptime": rep["availability"]["uptime"],
            "participants": statistics.mean(len(e["participants"]) for e in merges) if merges else 0.0,
            "final": rep["final_eval_loss"],
            "merged_frac": rep["tokens_merged"] / rep["tokens_trained"] if rep["tokens_trained"] else 0.0}


def permutation_p(a: list[float], b: list[float], rng: random.Random) -> float:
    """Two-sided permutation test of the difference of means of `a` and `b`."""
    seen = abs(statistics.mean(a) - statistics.mean(b))
    pooled, n = a + b, len(a)
    hits = 0
    for _ in range(PERMUTATIONS):
        rng.shuffle(pooled)
        if abs(statistics.mean(pooled[:n]) - statistics.mean(pooled[n:])) >= seen - 1e-12:
            hits += 1
    return (hits + 1) / (PERMUTATIONS + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--broadcast", default="all")
    ap.add_argument("--apply-wait", nargs="+", default=["on_arrival", "block"])
    ap.add_argument("--speed", type=float, default=0.5)
    ap.add_argument("--jitter", type=float, default=0.2)
    ap.add_argument("--relative-to", default="own", choices=("own", "others"),
                    help="the stragglers' speed: of their own pace (a fixed duty cycle, default) or of the fast "
                         "learners' progress (they then stop whenever the fast ones wait)")
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    ap.add_argument("--runs-dir", default=None, help="where failed runs' directories are kept (default: a new "
                                                     "temporary directory, printed)")
    a = ap.parse_args()
    runs_dir = a.runs_dir or tempfile.mkdtemp(prefix="k-table-")
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    failed: list[str] = []
    for wait in a.apply_wait:
        for name, cfg in CONFIGS.items():
            diloco = {**cfg, "broadcast": a.broadcast, "apply_wait": wait}
            rows[(name, wait)] = []
            for seed in range(a.seeds):
                got = run(seed, a.steps, diloco, a.speed, a.jitter, a.relative_to, runs_dir)
                print(f"  {name} apply_wait={wait} seed {seed}: {got}", flush=True)
                if isinstance(got, str):
                    failed.append(f"{name} apply_wait={wait} seed {seed}: {got}")
                else:
                    rows[(name, wait)].append(got)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{n}|{w}": r for (n, w), r in rows.items()}, f, indent=1)
    print(f"\nM=4 x 1 chip, learners 2 and 3 at speed {a.speed} of the {a.relative_to} pace (jitter {a.jitter}), "
          f"{a.steps} steps a learner "
          f"(budget total), broadcast {a.broadcast}, {a.seeds} seeds a row; mean +- sd")
    print(f"{'row':28}" + "".join(f"{k:>18}" for k in FIGURES) + f"{'runs':>6}")
    for (name, wait), runs in rows.items():
        cells = [f"{statistics.mean(r[k] for r in runs):.3f} +- {statistics.stdev(r[k] for r in runs):.3f}"
                 if len(runs) > 1 else f"{runs[0][k]:.3f}" for k in FIGURES]
        print(f"{name + ', ' + wait:28}" + "".join(f"{c:>18}" for c in cells) + f"{len(runs):>6}")
    if failed:
        print(f"\n{len(failed)} run(s) failed (their directories are under {runs_dir}):")
        for why in failed:
            print(f"  {why}")
    rng = random.Random(0)
    print("\npermutation tests (two-sided p; same apply_wait):")
    for wait in a.apply_wait:
        for x, y in itertools.combinations(CONFIGS, 2):
            rx, ry = rows[(x, wait)], rows[(y, wait)]
            ps = {k: permutation_p([r[k] for r in rx], [r[k] for r in ry], rng) for k in ("final", "goodput")}
            print(f"  {wait:10} {x:9} vs {y:9}: final eval p = {ps['final']:.4f}, goodput p = {ps['goodput']:.4f}")


if __name__ == "__main__":
    main()
