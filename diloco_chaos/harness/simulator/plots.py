"""The report's two goodput figures from simulated grids: goodput against chips per method, goodput against M.

Drawn with matplotlib's object API on an Agg canvas (as diloco_chaos/harness/report/html.py
does), simulated means as solid lines with the seeds' spread as a band, the
paper's values as dashed lines with open markers, so a reader sees both views
on one axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from diloco_chaos.harness.simulator.table1 import CHIPS, PAPER, ROWS, Grid

COLORS = ("#7f7f7f", "#d62728", "#ff7f0e", "#2ca02c", "#1f77b4", "#9467bd")
"""One per Table 1 row, in ROWS order."""


def goodput_vs_chips(grid: Grid, path: str | Path) -> Path:
    """Goodput % against chips (log axis), one line per method, the paper's dashed beside it."""
    fig = Figure(figsize=(7.5, 4.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for (label, _), color in zip(ROWS, COLORS, strict=True):
        cells = [c for c in grid.cells if c.method == label]
        xs = [c.chips for c in cells]
        ys = [c.goodput for c in cells]
        sd = [c.goodput_std for c in cells]
        ax.plot(xs, ys, marker="o", color=color, lw=1.8, label=f"{label} (simulated)")
        ax.fill_between(xs, [y - s for y, s in zip(ys, sd, strict=True)],
                        [y + s for y, s in zip(ys, sd, strict=True)], color=color, alpha=0.2, lw=0)
        ax.plot(list(CHIPS), list(PAPER[label]), ls="--", marker="o", mfc="none", color=color, lw=1, alpha=0.8)
    ax.set_xscale("log")
    return _finish(fig, ax, list(CHIPS), ["150k", "300k", "600k", "1.2M", "2.4M"], "chips (per-chip MTBI 1 year)",
                   "Goodput against chips: simulated (solid, ±std band) and paper Table 1 (dashed)", "lower left",
                   path)


def goodput_vs_m(grid: Grid, path: str | Path) -> Path:
    """Goodput % against M (M = 1 is elastic data-parallel), one line per chip count, the paper's dashed."""
    fig = Figure(figsize=(7.5, 4.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    rows = [(1, "Data-parallel, elastic")] + [(j.learners, label) for label, j in ROWS if j.method == "decoupled"]
    for chips, color in zip(CHIPS, COLORS[1:], strict=True):
        ms = [m for m, _ in rows]
        sim = [next(c.goodput for c in grid.cells if c.method == label and c.chips == chips) for _, label in rows]
        paper = [PAPER[label][CHIPS.index(chips)] for _, label in rows]
        ax.plot(ms, sim, marker="o", color=color, lw=1.8, label=f"{chips:,} chips (simulated)")
        ax.plot(ms, paper, ls="--", marker="o", mfc="none", color=color, lw=1, alpha=0.8)
    ax.set_xscale("log", base=2)
    return _finish(fig, ax, [1, 2, 4, 8, 16], ["1 (elastic DP)", "2", "4", "8", "16"], "learners M",
                   "Goodput against M: simulated (solid) and paper Table 1 (dashed)", "lower right", path)


def _finish(fig: Figure, ax: Any, ticks: list[int], labels: list[str], xlabel: str, title: str, legend_at: str,
            path: str | Path) -> Path:
    """The axes both figures share (a goodput % axis, labelled ticks, grid, legend), saved as a PNG."""
    ax.set_xticks(ticks)
    ax.set_xticks([], minor=True)
    ax.set_xticklabels(labels)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("goodput %")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc=legend_at)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out
