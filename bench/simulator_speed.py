"""Speed of the goodput simulator: the whole Table 1 grid (30 cells), N seeds per cell.

Not a test: it prints a table. Each repeat simulates every cell of the paper's
Table 1 (diloco_chaos/harness/simulator/table1.py) and reports the wall time of the grid,
the failure, repair and syncer events it simulated, events per second, and the
largest distance from the paper's values (points). The simulator is vectorised
(one numpy pass per cell and seed; no per-event Python loop), so the figure is
the grid's wall time on this machine's cores as they are loaded.

    python bench/simulator_speed.py [--seeds 5] [--repeats 3] [--horizon-days 3]
"""

from __future__ import annotations

import argparse
import os

from diloco_chaos.harness.simulator.table1 import run_grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="seeds per cell (default 5)")
    ap.add_argument("--repeats", type=int, default=3, help="grids to time (default 3)")
    ap.add_argument("--horizon-days", type=float, default=3.0, help="simulated days per seed (default 3)")
    args = ap.parse_args()
    seeds = tuple(range(args.seeds))
    print(f"Table 1 grid: 30 cells x {args.seeds} seeds, horizon {args.horizon_days:g} days, "
          f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.2f})")
    print(f"{'repeat':>6} {'wall s':>8} {'events':>11} {'events/s':>12} {'max |diff| pts':>15} {'misses':>7}")
    walls = []
    for i in range(args.repeats):
        grid = run_grid(seeds, args.horizon_days * 86400.0)
        walls.append(grid.wall_s)
        worst = max(abs(c.diff) for c in grid.cells)
        misses = sum(c.miss for c in grid.cells)
        print(f"{i:>6} {grid.wall_s:>8.2f} {grid.events:>11,} {grid.events / grid.wall_s:>12,.0f} "
              f"{worst:>15.2f} {misses:>7}")
    print(f"best {min(walls):.2f} s, worst {max(walls):.2f} s (budget: 60 s on 2 cores)")


if __name__ == "__main__":
    main()
