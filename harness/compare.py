"""One scenario and fault schedule under every algorithm, side by side (`diloco-chaos compare`).

Each algorithm runs the same scenario (same seed, data, topology and `[[faults]]`) on real processes; a
fault-free ddp run of the same seed is the quality reference. The table holds what the paper compares:
goodput and uptime (harness/metrics.py), tokens merged per second of training, the longest time the
global model stood still, and final eval loss, with its distance to fault-free ddp. Rows are
harness.results.RunRow records, which `--json` writes as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.results import Claim, RunRow, run_row
from harness.scenario import Scenario
from harness.supervisor import run_scenario

log = logging.getLogger(__name__)

ALGORITHMS = ("ddp", "elastic_ddp", "diloco", "decoupled")
"""Every algorithm compare runs, in this order, and the only list of them here: the verdict judges whichever
of them have rows."""

GOODPUT_ORDER = ("decoupled", "elastic_ddp", "ddp")
"""The paper's ranking of goodput under failures (its Table 1): each is above the next one that has a row."""

LOSS_TOLERANCE = 0.7
"""How far (nats per byte) decoupled's final eval loss with the faults may be above fault-free ddp's for the
claim to hold. ddp takes a full AdamW step on the global batch every step, so at equal tokens it is ahead of
both DiLoCo variants in these short runs (built-in chip-loss, 2026-12-03: +0.55 for diloco, +0.51 for
decoupled)."""

FAULT_FREE_DDP = "ddp, fault-free"
"""The label of the reference run."""


def row(label: str, res: Any, baseline_loss: float | None = None) -> RunRow:
    """The comparison figures of one finished run (a RunResult, or anything with `report` and `run_dir`, such
    as the pytest plugin's ChaosRun), with its invariants; `converged` against `baseline_loss` when given."""
    return run_row(label, res, baseline_loss, LOSS_TOLERANCE if baseline_loss is not None else None)


def compare(sc: Scenario, runs_dir: str | os.PathLike[str] | None = None,
            algorithms: tuple[str, ...] | None = None, baseline: bool = True,
            on_run: Callable[[RunRow], None] | None = None,
            runner: Callable[[Scenario], Any] | None = None) -> list[RunRow]:
    """Run `sc` under each algorithm (default: ALGORITHMS; with `baseline`, fault-free ddp first); returns one
    row per run, each with `vs_fault_free_ddp` (its final eval loss minus the reference's) when there is a
    reference.

    `runner(scenario)` makes each run and returns something with `report` and `run_dir` (default:
    harness.supervisor.run_scenario into `runs_dir`; a suite passes the pytest plugin's `run_scenario`
    fixture, so its runs get the plugin's deadlines and hygiene checks)."""
    if runner is None:
        if runs_dir is None:
            raise ValueError("compare needs runs_dir or a runner")
        runner = lambda s: run_scenario(s, runs_dir)  # noqa: E731
    rows: list[RunRow] = []
    ref: float | None = None
    if baseline:
        rows.append(row(FAULT_FREE_DDP, runner(sc.replace(algorithm="ddp", faults=()))))
        ref = rows[-1].final_eval_loss
        if on_run is not None:
            on_run(rows[-1])
    for alg in ALGORITHMS if algorithms is None else algorithms:
        rows.append(row(f"{alg}, with faults", runner(sc.replace(algorithm=alg)), ref))
        if on_run is not None:
            on_run(rows[-1])
    return [dataclasses.replace(r, vs_fault_free_ddp=round(r.final_eval_loss - ref, 4)
                                if ref is not None and r.final_eval_loss is not None else None) for r in rows]


def verdict(rows: list[RunRow], tolerance: float = LOSS_TOLERANCE) -> list[Claim]:
    """The paper's claim, checked on compare's rows (runs with faults, and the fault-free reference):
    decoupled's goodput above every other algorithm's and its uptime at least theirs; goodput in the paper's
    order (GOODPUT_ORDER: decoupled > elastic_ddp > ddp, a missing row skipped); decoupled's final eval loss
    within `tolerance` of fault-free ddp. Nothing to judge without a decoupled row."""
    by = {r.algorithm: r for r in rows if r.label.endswith("with faults")}
    dec = by.get("decoupled")
    if dec is None:
        return []
    out: list[Claim] = []

    def above(key: str, a: RunRow, b: RunRow, strict: bool = True) -> None:
        x, y = getattr(a, key), getattr(b, key)
        if x is not None and y is not None:
            out.append(Claim(f"{a.algorithm} {key} {'above' if strict else 'at least'} {b.algorithm}",
                             x > y if strict else x >= y, f"{x:.3f} vs {y:.3f}"))

    others = [by[a] for a in ALGORITHMS if a in by and a != "decoupled"]
    for r in others:
        above("goodput", dec, r)
    ranked = [by[a] for a in GOODPUT_ORDER if a in by]
    for a, b in zip(ranked, ranked[1:], strict=False):
        if a is not dec:  # decoupled's own comparisons are above
            above("goodput", a, b)
    for r in others:
        above("uptime", dec, r, strict=False)
    gap = dec.vs_fault_free_ddp
    if gap is not None:
        out.append(Claim(f"decoupled final eval within {tolerance} of fault-free ddp", gap <= tolerance,
                         f"{gap:+.3f}"))
    return out


COLUMNS = [("label", "run", "{}"), ("final_eval_loss", "final eval", "{:.3f}"),
           ("vs_fault_free_ddp", "vs ddp ff", "{:+.3f}"), ("goodput", "goodput", "{:.3f}"),
           ("uptime", "uptime", "{:.3f}"), ("tokens_merged_per_s", "tok/s merged", "{:.0f}"),
           ("longest_gap_s", "longest gap s", "{:.2f}"), ("wall_s", "wall s", "{:.1f}")]


def table(rows: list[RunRow]) -> str:
    """A plain-text table of the rows (what `compare` prints)."""
    cells = [[label for _, label, _ in COLUMNS]]
    for r in rows:
        cells.append(["-" if getattr(r, k) is None else fmt.format(getattr(r, k)) for k, _, fmt in COLUMNS])
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c[i].ljust(widths[i]) if i == 0 else c[i].rjust(widths[i])
                               for i in range(len(COLUMNS))) for c in cells)


def plot(rows: list[RunRow], path: str | os.PathLike[str]) -> Path | None:
    """Bar charts of goodput, uptime, tokens/s and final eval per run, as a PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no comparison plot")
        return None
    keys = [("goodput", "goodput"), ("uptime", "uptime"), ("tokens_merged_per_s", "tokens merged / s"),
            ("final_eval_loss", "final eval loss")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    labels = [r.label.replace(", ", "\n") for r in rows]
    colours = ["#888", "#c44", "#a6c", "#c84", "#48c"]
    for ax, (k, title) in zip(axes, keys, strict=True):
        ax.bar(labels, [getattr(r, k) or 0.0 for r in rows], color=colours[: len(rows)])
        ax.set_title(title)
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
