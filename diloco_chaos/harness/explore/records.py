"""The typed data explore passes between its modules and writes: a `Trial` (one schedule to run), the `Base`
scenario it runs on, one `RunLine` of explore.jsonl per run, and the `Summary` printed at the end.

Why one module: generate, shrink, runner and the command all speak of the same trial and the same line, and a
line of explore.jsonl is read back by tests and tools, so its fields are declared once, as dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from diloco_chaos.chaos.schedule import FaultSpec
from diloco_chaos.harness.config import scenario as scenario_mod
from diloco_chaos.harness.config.sections import ScenarioError

Outcome = Literal["passed", "failed", "run_failed", "crashed"]
"""passed: every judged invariant held; failed: one or more were violated (a finding); run_failed: the run did not
complete (`diloco-chaos run` exit 1: a process failed past its recovery, a fault never fired, the deadline) or
crashed (no result at all): harness errors, recorded, never shrunk."""


@dataclass(frozen=True)
class Trial:
    """One schedule to run: faults on top of the scenario's own, at a step count and a learner count."""

    faults: tuple[FaultSpec, ...]
    steps: int
    """train.steps of the run (`--set train.steps`)."""
    learners: int
    """topology.learners of the run (`--set topology.learners` when it differs from the scenario's)."""

    def tables(self) -> list[dict[str, Any]]:
        """The faults as `[[faults]]` tables (an incident file's, explore.jsonl's)."""
        return [f.to_table() for f in self.faults]

    def key(self) -> str:
        """Equal for equal schedules (every fault parameter, steps and learners): what shrinking remembers."""
        return json.dumps([self.tables(), self.steps, self.learners], sort_keys=True, default=str)

    def describe(self) -> str:
        what = "; ".join(f"{f.describe()} at {f.at.describe()}" for f in self.faults) or "no faults"
        return f"{len(self.faults)} faults, {self.steps} steps, {self.learners} learners: {what}"


@dataclass(frozen=True)
class Base:
    """The scenario explore runs on, as `diloco-chaos run` is told it: a file or a built-in name, and the
    user's `--set` overrides."""

    path: str | None
    """A scenario file; None: the built-in scenario `builtin`."""
    builtin: str = "default"
    overrides: tuple[str, ...] = ()

    def load(self, extra: Sequence[str] = ()) -> scenario_mod.Scenario:
        """The scenario with the user's overrides and then `extra`, validated (ScenarioError otherwise)."""
        sets = [*self.overrides, *extra]
        return scenario_mod.load(self.path, sets) if self.path else scenario_mod.builtin(self.builtin, sets)

    def run_args(self, trial: Trial, default_learners: int) -> list[str]:
        """`diloco-chaos run` arguments for the scenario of `trial` (its incident file added by the caller)."""
        return [*([self.path] if self.path else ["--builtin", self.builtin]),
                *(a for s in self.trial_overrides(trial, default_learners) for a in ("--set", s))]

    def trial_overrides(self, trial: Trial, default_learners: int) -> list[str]:
        """The user's overrides and the trial's steps (and learners, when changed)."""
        out = [*self.overrides, f"train.steps={trial.steps}"]
        if trial.learners != default_learners:
            out.append(f"topology.learners={trial.learners}")
        return out

    def trial_scenario(self, trial: Trial, default_learners: int) -> scenario_mod.Scenario:
        """What `diloco-chaos run ... --incident` will run for `trial`, validated the same way (ScenarioError)."""
        sc = self.load(self.trial_overrides(trial, default_learners)[len(self.overrides):])
        return sc.replace(faults=[*sc.faults, *trial.tables()])

    def valid(self, trial: Trial, default_learners: int) -> bool:
        try:
            self.trial_scenario(trial, default_learners)
        except ScenarioError:
            return False
        return True


@dataclass(frozen=True)
class Verdict:
    """One judged invariant of a run: held or not, its figure and bound (report/results.py InvariantFigure)."""

    name: str
    ok: bool
    figure: float | int | None
    bound: float | int | None
    judged: bool = True
    """False: recorded only (an invariant the `[explore] invariants` list leaves out, e.g. faults_fired)."""


@dataclass(frozen=True)
class RunLine:
    """One line of explore.jsonl: one run of one schedule."""

    index: int
    """The schedule's number: schedule i of the seed (explore), or the shrink candidate's run number."""
    phase: Literal["explore", "shrink"]
    seed: int
    """The seed the schedule was drawn with."""
    outcome: Outcome
    failed: tuple[str, ...]
    """The judged invariants that were violated (empty unless outcome is failed)."""
    faults: tuple[dict[str, Any], ...]
    """The schedule, as `[[faults]]` tables."""
    steps: int
    learners: int
    verdicts: tuple[Verdict, ...] = ()
    run_dir: str | None = None
    wall_s: float = 0.0
    error: str = ""
    """run_failed / crashed: why (the last line `diloco-chaos run` printed on stderr)."""
    unexpected_errors: int = 0
    """Errors of the run's processes that no injected fault explains (report.json `errors`): recorded, not a
    finding by itself (`diloco-chaos replay` compares the same count)."""
    shrinking: str = ""
    """phase shrink: the invariant being shrunk and the candidate's change."""

    def json_line(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunLine:
        d = json.loads(text)
        d["verdicts"] = tuple(Verdict(**v) for v in d.get("verdicts", ()))
        for k in ("failed", "faults"):
            d[k] = tuple(d[k])
        return cls(**d)


def read_lines(path: str | Path) -> list[RunLine]:
    """Every line of an explore.jsonl."""
    return [RunLine.from_json(x) for x in Path(path).read_text().splitlines() if x.strip()]


@dataclass(frozen=True)
class Minimal:
    """The outcome of shrinking one failure."""

    invariant: str
    trial: Trial
    incident: str
    """The minimal-<invariant>.toml written."""
    run_dir: str | None
    """The run directory of a run of the minimal schedule that failed the invariant."""
    report: str | None
    """Its report.html."""
    command: str
    """The `diloco-chaos run ... --incident` command that reproduces it."""
    runs: int
    """Runs shrinking made, confirmations included."""
    repeat_fails: int = 0
    """Of the fresh runs that confirmed this schedule (repeat_runs), how many failed the invariant."""
    repeat_runs: int = 0
    """0: not confirmed (`[explore] confirm_runs = 0`, or no shrinking)."""
    confirmed: bool = False
    """Whether it repeated at the rate asked for (`confirm_must_fail` of `confirm_runs`)."""
    rejected: tuple[str, ...] = ()
    """Smaller schedules shrinking reached that did not repeat at that rate."""


@dataclass(frozen=True)
class Summary:
    """What explore found: printed at the end and written as explore-summary.json."""

    runs: int
    failures: int
    """Explored runs that violated a judged invariant."""
    harness_errors: int
    """Explored runs that did not complete (run_failed, crashed)."""
    failed_invariants: dict[str, int] = field(default_factory=dict)
    """Invariant -> explored runs that violated it."""
    minimal: tuple[Minimal, ...] = ()
    elapsed_s: float = 0.0
