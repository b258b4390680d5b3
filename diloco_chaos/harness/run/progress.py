"""Live progress for a person watching a run: per-learner step, syncer version, eval loss, and each fault.

Fed with the events the supervisor tails from the run's log; it keeps a tiny state and writes at most one
status line per `every_s` to its stream. A fault's start and end are written at once, on a line of their
own, with what it did, to whom and what triggered it, so that a person sees the fault beside its effect.
Times are seconds since the run's `run_start`, and a fault's lines carry the times of its `fault_start` and
`fault_end` (a kill's end is its recovery, `ended_t`: diloco_chaos/harness/run/fault_runner.py), the same the final
table, report.json and the HTML report give.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, TextIO

from diloco_chaos.harness.record import parse_lenient
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.run import FaultEnd, FaultStart, RunStart
from diloco_chaos.harness.record.syncer import Eval, Merge
from diloco_chaos.harness.record.torchft import TorchftSync
from diloco_chaos.harness.report.timeline import fault_end_t
from diloco_chaos.harness.run.rundir import stderr_file


def fault_line(e: FaultStart | FaultEnd) -> str:
    """One line for a fault_start or fault_end record: F<index>, what, the trigger, and a miss if any."""
    what = e.describe or e.action or "?"
    if isinstance(e, FaultStart):
        missed = f" (hit nothing: {e.missed})" if e.missed else ""
        return f"fault F{e.index} fired: {what}; trigger: {e.reason}{missed}"
    return f"fault F{e.index} ended: {what}; {e.reason}"


class Progress:
    """The live status (steps, the global model's merges or torchft's committed steps, eval loss): fed the
    decoded events the supervisor tails (or the pytest plugin's on_events), each parsed into its record as it
    arrives (leniently: a line the schema cannot read is skipped, not fatal to a person's view of the run; strict
    mode has already checked it when written)."""

    def __init__(self, learners: int, stream: TextIO | None = None, every_s: float = 1.0) -> None:
        self.steps = [0] * learners
        self.merges = 0
        self.loss: float | None = None
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._t0 = time.monotonic()
        """The origin of the times shown: the run's run_start once seen (CLOCK_MONOTONIC, as events' `t`)."""
        self._last = -math.inf  # the first call writes a status line

    def __call__(self, events: list[dict[str, Any]]) -> None:
        for raw in events:
            e, _ = parse_lenient(raw)
            if e is None:
                continue
            if isinstance(e, RunStart):
                self._t0 = e.t
            elif isinstance(e, Step):
                self.steps[e.learner] = e.step
            elif isinstance(e, Merge):
                self.merges = e.merges
            elif isinstance(e, TorchftSync) and e.committed:  # torchft: the global step every participant agrees on
                self.merges = max(self.merges, e.step)
            elif isinstance(e, Eval):
                self.loss = e.loss
            elif isinstance(e, FaultStart | FaultEnd):
                at = e.t if isinstance(e, FaultStart) else fault_end_t(e)
                self.stream.write(f"[{round(at - self._t0, 3):6.1f}s] {fault_line(e)}\n")
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            steps = " ".join(f"L{i}:{s:>4}" for i, s in enumerate(self.steps))
            loss = f"{self.loss:.3f}" if self.loss is not None else "  -  "
            self.stream.write(f"[{now - self._t0:6.1f}s] steps {steps} | syncer merges {self.merges:>5} | "
                              f"eval loss {loss}\n")
        self.stream.flush()


def summary_table(reports: list[dict[str, Any]]) -> str:
    """A fixed-width table comparing runs (one row per report)."""
    head = ["algorithm", "learners", "final eval", "initial eval", "tokens merged", "tokens trained",
            "merged/trained", "merges", "longest gap s", "goodput", "wall s"]
    rows = [[r["algorithm"], f'{r["learners"]}x{r["chips_per_learner"]}', _f(r["final_eval_loss"]),
             _f(r["initial_eval_loss"]), f'{r["tokens_merged"]:.0f}', str(r["tokens_trained"]),
             _f(r["tokens_merged"] / r["tokens_trained"] if r["tokens_trained"] else None), str(r["merge_count"]),
             _f(r["longest_gap_s"]), _f((r.get("goodput") or {}).get("goodput")),
             _f(r["wall_s"], 1)] for r in reports]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=False)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=False))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def faults_table(bands: list[dict[str, Any]]) -> str:
    """The faults that fired, one line each: F<index>, what, the trigger, start and end (seconds since run
    start) and why it ended there (diloco_chaos.harness.report.timeline.fault_bands)."""
    if not bands:
        return "faults: none fired"
    lines = [f"faults fired: {len(bands)}"]
    for b in bands:
        missed = f"; hit nothing: {b['missed']}" if b.get("missed") else ""
        lines.append(f"  F{b['index']} {b.get('describe') or b.get('action')} | trigger: {b.get('trigger')} | "
                     f"{b['start_s']:.1f}-{b['end_s']:.1f} s ({b.get('until')}){missed}")
    return "\n".join(lines)


def verdict_lines(figures: list[Any]) -> str:
    """Each invariant's verdict (diloco_chaos.harness.report.results.InvariantFigure), then one line: held, or which did
    not."""
    lines = [f"  {'ok  ' if f.ok else 'FAIL'} {f.name}: {f.detail}" for f in figures]
    failed = [f.name for f in figures if not f.ok]
    head = (f"invariants: all {len(figures)} held" if not failed
            else f"invariants: {len(failed)} of {len(figures)} violated: {', '.join(failed)}")
    return "\n".join([head, *lines])


def error_lines(errors: list[dict[str, Any]], shown: int = 3,
                run_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """The run's errors (report.json's `errors`): unexpected ones first and marked, then those an injected fault
    explains, each with its fault (entries written before errors were labelled count as unexpected). Empty
    when the run logged none. With `run_dir`, an unexpected error's process's stderr file (logs/<proc>.stderr,
    with its traceback) is named under it; the expected ones' stay in the run directory, off the terminal."""
    unexpected = [e for e in errors if not e.get("expected")]
    expected = [e for e in errors if e.get("expected")]
    lines = []
    if unexpected:
        lines.append(f"UNEXPECTED errors ({len(unexpected)}):")
        for e in unexpected[:shown]:
            lines.append(f"  {e.get('proc')} {e.get('ev')}: {e.get('error')}")
            log = stderr_file(run_dir, str(e.get("proc"))) if run_dir is not None else None
            if log is not None and log.is_file() and "Traceback" in log.read_text(errors="replace"):
                lines.append(f"    its stderr: {log}")
    if expected:
        lines.append(f"expected errors ({len(expected)}, caused by injected faults):")
        lines += [f"  {e.get('proc')} {e.get('ev')}: {e.get('error')}  [expected: {e.get('cause')}]"
                  for e in expected[:shown]]
    return lines
