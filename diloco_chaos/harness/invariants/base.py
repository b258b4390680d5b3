"""What every invariant shares: `InvariantResult` (a measured figure against a bound), `InvariantViolation`, and
`RunRecord` / `load_run` (a run directory read once).

A chaos run passes when the system kept its promises, not merely when it did not crash. Each invariant
(one module of diloco_chaos/harness/invariants/checks) takes a run (a run directory, or a `RunRecord` loaded once with
`load_run`) and the bounds it needs, and returns an `InvariantResult` holding the measured figure, the bound
and a human-readable detail; `result.check()` raises `InvariantViolation` (an AssertionError) whose message
names the invariant and prints both, e.g. ``invariant no_global_downtime violated: longest gap with >= 1
learners alive 4.19 s > bound 1 s (interval 12.3-16.5 s since run start)``. Everything is computed from the
run directory alone (events.jsonl, config.json, report.json, global.pt), so any recorded run can be checked
again. A result with nothing to measure where there should be something (no training span, no final eval,
no checkpoint) is a failure, never a pass: an invariant must not hold vacuously.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record import Event, RunLog
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.run import RunStart
from diloco_chaos.harness.record.syncer import SyncerStart
from diloco_chaos.harness.run.rundir import FinishedRun

R = TypeVar("R", bound=Event)
_NEGATE = {"<=": ">", ">=": "<", "==": "!="}


class InvariantViolation(AssertionError):
    """An invariant did not hold; `.result` is the `InvariantResult` with the figure and the bound."""

    def __init__(self, result: InvariantResult) -> None:
        super().__init__(result.message())
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes (its args hold only the message)
        return (type(self), (self.result,))


def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


@dataclass(frozen=True)
class InvariantResult:
    """One invariant's verdict on one run: `figure` (the measured value) `relation` `bound` must hold."""

    name: str
    ok: bool
    figure: Any
    bound: Any
    detail: str = ""
    measure: str = ""
    """What the figure is, in words (e.g. "longest gap with >= 1 learners alive")."""
    unit: str = ""
    relation: str = "<="
    """How the figure must compare to the bound: <=, >= or ==."""

    def message(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        verdict = "holds" if self.ok else "violated"
        rel = self.relation if self.ok else _NEGATE.get(self.relation, f"not {self.relation}")
        what = f"{self.measure} " if self.measure else ""
        text = f"invariant {self.name} {verdict}: {what}{_fmt(self.figure)}{unit} {rel} bound {_fmt(self.bound)}{unit}"
        return f"{text} ({self.detail})" if self.detail else text

    def check(self) -> InvariantResult:
        """Raise `InvariantViolation` unless the invariant holds; returns self so calls can be chained."""
        if not self.ok:
            raise InvariantViolation(self)
        return self

    def __str__(self) -> str:
        return (f"{self.name}: {'ok' if self.ok else 'VIOLATED'} ({self.measure or 'figure'} {_fmt(self.figure)}"
                f"{' ' + self.unit if self.unit else ''}, bound {self.relation} {_fmt(self.bound)})")


@dataclass(frozen=True)
class RunRecord:
    """A run directory read once: its event log as typed records sorted by `t` (several processes append to one
    file, so file order is not time order; the sort is stable), report.json and config.json ({} when absent).

    `log` is diloco_chaos.harness.record.RunLog, loaded leniently so older runs still load; the checks read it through
    `records(Kind)` and `all_records`."""

    log: RunLog
    """The events as typed records, in time order."""
    report: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    run_dir: Path | None = None

    @property
    def all_records(self) -> list[Event]:
        """Every record, in time order."""
        return self.log.records

    def records(self, kind: type[R]) -> list[R]:
        """The records of one kind, in time order (typed: `run.records(Step)` is a list[Step])."""
        return self.log.of(kind)

    @property
    def algorithm(self) -> str:
        if "algorithm" in self.config:
            return str(self.config["algorithm"])
        start = self.log.first(RunStart)
        return start.algorithm if start is not None else "decoupled"

    @property
    def descriptor(self) -> algorithms.Algorithm:
        """The run's algorithm's descriptor (diloco_chaos/harness/algorithms/): its traits."""
        return algorithms.get(self.algorithm)

    @property
    def min_quorum(self) -> int:
        return int(self.config.get("diloco", {}).get("min_quorum", 1))

    @property
    def fragments(self) -> int:
        """P, the fragments a decoupled merge spreads a push's tokens over; 1 where the algorithm merges the model
        in one piece (the synchronous baselines)."""
        if not self.descriptor.fragmented:
            return 1
        p = self.config.get("diloco", {}).get("fragments")
        if p is None:
            p = next((e.fragments for e in self.log.of(SyncerStart) if e.fragments), 1)
        return int(p)

    @property
    def start(self) -> float:
        """run_start (the supervisor's clock), else the first event."""
        return self.log.start

    def train_span(self) -> tuple[float, float] | None:
        """(first inner step, last inner step) of any learner; None if no step was logged."""
        ts = [e.t for e in self.log.of(Step)]
        return (min(ts), max(ts)) if ts else None


Run = RunRecord | FinishedRun | str | os.PathLike[str]


def load_run(run: FinishedRun | str | os.PathLike[str]) -> RunRecord:
    """The invariants' view of a finished run (diloco_chaos.harness.run.rundir.FinishedRun: its log, report.json and
    config.json), or of a run directory, read once here (events.jsonl required, the two JSON files optional)."""
    fr = FinishedRun.of(run)
    return RunRecord(fr.log, fr.report, fr.config, fr.run_dir)


def _run(run: Run) -> RunRecord:
    return run if isinstance(run, RunRecord) else load_run(run)

