"""The paper's Table 1 (goodput %, per-chip MTBI one year) and the simulated grid beside it.

Six methods (data-parallel without elasticity, elastic data-parallel, Decoupled
DiLoCo with M = 2, 4, 8, 16) at five chip counts. The paper's values are the
reference notes' §4.1; the parameters that produce the simulated grid are the
defaults of model.FaultProcess and model.TimeParams (docs/simulator.md says
where each comes from).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from diloco_chaos.harness.simulator.model import FaultProcess, Job, SimResult, TimeParams, simulate

CHIPS: tuple[int, ...] = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)

ROWS: tuple[tuple[str, Job], ...] = (
    ("Data-parallel, no elasticity", Job("dp", 1)),
    ("Data-parallel, elastic", Job("elastic_dp", 1)),
    ("Decoupled DiLoCo M=2", Job("decoupled", 1, 2)),
    ("Decoupled DiLoCo M=4", Job("decoupled", 1, 4)),
    ("Decoupled DiLoCo M=8", Job("decoupled", 1, 8)),
    ("Decoupled DiLoCo M=16", Job("decoupled", 1, 16)),
)
"""Row label and job (its `chips` is replaced per column)."""

PAPER: dict[str, tuple[float, ...]] = {
    "Data-parallel, no elasticity": (72, 57, 38, 27, 18),
    "Data-parallel, elastic": (88, 80, 69, 58, 40),
    "Decoupled DiLoCo M=2": (94, 88, 80, 70, 54),
    "Decoupled DiLoCo M=4": (96, 93, 89, 82, 73),
    "Decoupled DiLoCo M=8": (98, 96, 94, 88, 80),
    "Decoupled DiLoCo M=16": (99, 98, 96, 93, 86),
}
"""Paper Table 1, goodput %, per row, in CHIPS order."""

DEFAULT_FAULTS = FaultProcess()
DEFAULT_TIMES = TimeParams()

TOLERANCE_POINTS = 3.0
"""A cell is a miss when the simulated mean is further than this from the paper's value."""


@dataclass(frozen=True)
class Cell:
    """One simulated cell beside the paper's."""

    method: str
    chips: int
    learners: int
    paper: float
    goodput: float
    """Mean over seeds, %."""
    goodput_std: float
    """Standard deviation over seeds, points."""
    uptime: float
    """Mean over seeds, %."""
    diff: float
    """goodput - paper, points."""
    miss: bool
    events: int


@dataclass(frozen=True)
class Grid:
    """The whole Table 1 grid."""

    cells: tuple[Cell, ...]
    seeds: tuple[int, ...]
    horizon_s: float
    wall_s: float
    events: int
    faults: FaultProcess
    times: TimeParams

    def to_json(self) -> dict[str, object]:
        return {"schema": "diloco-chaos.simulate.table1/1", "seeds": list(self.seeds), "horizon_s": self.horizon_s,
                "wall_s": round(self.wall_s, 3), "events": self.events, "tolerance_points": TOLERANCE_POINTS,
                "misses": sum(c.miss for c in self.cells), "faults": asdict(self.faults), "times": asdict(self.times),
                "cells": [asdict(c) for c in self.cells]}


def run_grid(seeds: tuple[int, ...] = (0, 1, 2, 3, 4), horizon_s: float = 3 * 86400.0,
             faults: FaultProcess = DEFAULT_FAULTS, times: TimeParams = DEFAULT_TIMES) -> Grid:
    """Simulate all 30 cells."""
    t0 = time.perf_counter()
    cells = []
    events = 0
    for label, job in ROWS:
        for chips, paper in zip(CHIPS, PAPER[label], strict=True):
            j = Job(job.method, chips, job.learners, job.min_quorum, job.learner_policy)
            r: SimResult = simulate(j, faults, times, horizon_s, seeds)
            g = 100 * r.goodput_mean
            cells.append(Cell(label, chips, j.learners, paper, round(g, 2), round(100 * r.goodput_std, 2),
                              round(100 * r.uptime_mean, 2), round(g - paper, 2), abs(g - paper) > TOLERANCE_POINTS,
                              r.events))
            events += r.events
    return Grid(tuple(cells), seeds, horizon_s, time.perf_counter() - t0, events, faults, times)


def format_table(grid: Grid) -> str:
    """Simulated (± std over seeds) / paper / difference, one row per method; misses marked with '!'."""
    head = ["method"] + [f"{c // 1000}k" if c < 1_000_000 else f"{c / 1e6:g}M" for c in CHIPS]
    lines = ["goodput %: simulated ±std / paper (difference); '!' = more than "
             f"{TOLERANCE_POINTS:g} points off", " | ".join(head)]
    for label, _ in ROWS:
        row = [c for c in grid.cells if c.method == label]
        lines.append(" | ".join([label] + [f"{c.goodput:5.1f}±{c.goodput_std:.1f} / {c.paper:g} ({c.diff:+.1f})"
                                           + ("!" if c.miss else "") for c in row]))
    up = ["uptime % (at least K=1 learner training, syncer up)", " | ".join(head)]
    for label, _ in ROWS:
        up.append(" | ".join([label] + [f"{c.uptime:6.2f}" for c in grid.cells if c.method == label]))
    misses = [c for c in grid.cells if c.miss]
    tail = [f"{len(misses)} of {len(grid.cells)} cells more than {TOLERANCE_POINTS:g} points off"
            + (": " + ", ".join(f"{c.method} at {c.chips:,} ({c.diff:+.1f})" for c in misses) if misses else ""),
            f"{len(grid.seeds)} seeds per cell, horizon {grid.horizon_s / 86400:g} days, {grid.events:,} events, "
            f"{grid.wall_s:.2f} s"]
    return "\n".join(lines + [""] + up + [""] + tail)
