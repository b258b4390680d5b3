"""`ChaosRun`, the handle a chaos test gets for one run made through the pytest plugin, and the plugin's errors.

What: the run's scenario and directory, lazy access to its report and event log, and the invariants of
diloco_chaos.harness.invariants by name (`check`, `measure`, `check_all`) printing their figure into the test's output;
`summary` gives the lines of the plugin's failure report. `INVARIANTS` lists the names `check` accepts, read
from the invariant registry.

Why a module of its own: diloco_chaos/harness/testing/pytest_plugin.py keeps the fixtures and hooks; this is the part a
suite reads and calls, and it needs no pytest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.invariants.registry import discover
from diloco_chaos.harness.run.progress import error_lines
from diloco_chaos.harness.run.rundir import REPORT_FILE, FinishedRun, read_json

_NEGATE = {"<=": ">", ">=": "<", "==": "!="}
INVARIANTS: tuple[str, ...] = tuple(discover())
"""Names `ChaosRun.check` / `ChaosRun.measure` accept: every registered invariant, in check_all's order."""


class ChaosRunFailed(AssertionError):
    """A run did not complete (the harness raised). `.run` is the ChaosRun (its run_dir, partial report),
    `.cause` the original exception (a diloco_chaos.harness.run.supervisor.RunFailed for a failed process or bound)."""

    def __init__(self, message: str, run: ChaosRun, cause: BaseException) -> None:
        super().__init__(message)
        self.run = run
        self.cause = cause


class HygieneError(AssertionError):
    """A run left a process alive or a port listening."""


# -- one run ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class ChaosRun:
    """One run made through the plugin: the scenario, its directory and what it left there.

    Behaves like diloco_chaos.harness.run.supervisor.RunResult (`run_dir`, `report`, `pids`), so
    diloco_chaos.harness.testing.hygiene.leftovers
    and diloco_chaos.harness.invariants accept it, plus lazy access to the event log and invariant helpers that print
    their figure into the test's output."""

    scenario: Scenario
    run_dir: Path
    pids: list[int] = field(default_factory=list)
    error: BaseException | None = None
    """The exception that ended the run, None for a run that completed."""
    bounded_from_s: float | None = None
    """The scenario's own timeouts.run_s when the plugin lowered it to fit the test's timeout."""
    ended_at: float = 0.0
    """time.time() when the run returned: a process created later is not the run's (pid reuse)."""
    printed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.scenario.name

    @cached_property
    def finished(self) -> FinishedRun:
        """The run directory read once (its events.jsonl, with the decoded lines kept for `events`): what `report`
        (of a failed run), `events`, `record` and the hygiene check read."""
        return FinishedRun.load(self.run_dir, keep_lines=True)

    @cached_property
    def report(self) -> dict[str, Any]:
        """report.json; for a run that failed before writing it, the report built from its event log
        (best effort, {} if even that fails)."""
        path = self.run_dir / REPORT_FILE
        if path.exists():
            return read_json(path)
        try:
            from diloco_chaos.harness.report.run_report import build_report

            return build_report(self.finished)
        except Exception:  # noqa: BLE001 - a partial run's log may not support every figure
            return {}

    @cached_property
    def events(self) -> list[dict[str, Any]]:
        """Every event of the run as decoded, in file order (the lines of `finished`'s one read)."""
        return self.finished.log.lines

    @cached_property
    def record(self) -> Any:
        """The run for the invariants (diloco_chaos.harness.invariants.load_run of `finished`: events in time
        order)."""
        from diloco_chaos.harness.invariants import load_run

        return load_run(self.finished)

    def of(self, *kinds: str) -> list[dict[str, Any]]:
        """Events of the given kinds as decoded dicts, in time order (a stable sort of the file order)."""
        return sorted((e for e in self.events if e.get("ev") in kinds), key=lambda e: float(e.get("t", 0.0)))

    def leftovers(self) -> dict[str, list[int]]:
        """diloco_chaos.harness.testing.hygiene.leftovers: processes of the run still alive and its ports still
        listening."""
        from diloco_chaos.harness.testing.hygiene import leftovers

        return leftovers(self, self.events)

    def measure(self, name: str, /, **bounds: Any) -> Any:
        """Evaluate the registered invariant `name` (INVARIANTS lists them) with `bounds` (names or their
        check_all aliases; a misspelled one raises UnknownBound), print its result line, return the
        diloco_chaos.harness.invariants.InvariantResult without raising. A ChaosRun given as a bound (baseline_loss=) is
        read as that run."""
        from diloco_chaos.harness.invariants import spec

        args = {k: (v.record if isinstance(v, ChaosRun) else v) for k, v in bounds.items()}
        result = spec(name)(self.record, **args)
        print(f"[{self.name}] {result}")
        return result

    def check(self, name: str, /, **bounds: Any) -> Any:
        """`measure`, then raise diloco_chaos.harness.invariants.InvariantViolation (an AssertionError naming the figure
        and the bound) unless it holds. Returns the InvariantResult."""
        return self.measure(name, **bounds).check()

    def check_all(self, **bounds: Any) -> list[Any]:
        """diloco_chaos.harness.invariants.check_all with these bounds; prints every result, raises one AssertionError
        listing every violated invariant. Returns the results."""
        from diloco_chaos.harness.invariants import check_all

        args = {k: (v.record if isinstance(v, ChaosRun) else v) for k, v in bounds.items()}
        results = check_all(self.record, **args)
        for r in results:
            print(f"[{self.name}] {r}")
        bad = [r.message() for r in results if not r.ok]
        if bad:
            raise AssertionError(f"run {self.name!r} ({self.run_dir}): " + "; ".join(bad))
        return results

    def figures(self, figures: Mapping[str, Any] | None = None, /, **more: Any) -> dict[str, Any]:
        """Print one `figures` line (a test's measured values, so they are in its output whether it passes or
        fails) and keep it for the failure report. Returns the figures."""
        out = {**(figures or {}), **more}
        self.printed.append(out)
        print(f"[{self.name}] figures: {json.dumps(out, default=str)}")
        return out

    def _violated(self) -> list[str]:
        """The invariants the run recorded as violated (invariants.json), one line each; [] when all held or
        none were recorded (a run that did not finish)."""
        from diloco_chaos.harness.report.results import recorded_invariants

        try:
            recorded = recorded_invariants(self.run_dir) or ()
        except (OSError, ValueError):  # a damaged file must not hide the rest of the failure report
            return []
        bad = [f for f in recorded if not f.ok]
        return [f"invariants: {len(bad)} of {len(recorded)} violated (invariants.json)"] + [
            f"  {f.name} violated: {f.measure or 'figure'} {f.figure} {_NEGATE.get(f.relation, '!' + f.relation)} "
            f"bound {f.bound} ({f.detail})"
            for f in bad] if bad else []

    def summary(self) -> str:
        """Run directory and key figures, the lines of the failure report."""
        sc, rep = self.scenario, self.report
        head = (f"{sc.name} ({sc.algorithm}, {sc.topology.learners}x{sc.topology.chips_per_learner}, "
                f"seed {sc.seed})  run_dir: {self.run_dir}")
        fired = len([f for f in rep.get("faults", []) if f.get("start_s") is not None])
        key = {
            "final_eval_loss": rep.get("final_eval_loss"),
            "merge_count": rep.get("merge_count"),
            "longest_gap_s": rep.get("longest_gap_s"),
            "goodput": (rep.get("goodput") or {}).get("goodput"),
            "uptime": (rep.get("availability") or {}).get("uptime"),
            "faults_fired": f"{fired}/{len(sc.faults)}",
            "wall_s": rep.get("wall_s"),
        }
        lines = [head, "    " + " | ".join(f"{k} {v}" for k, v in key.items())]
        lines += ["    " + ln for ln in self._violated()]
        lines += ["    " + ln for ln in error_lines(rep.get("errors", []))]
        for f in self.printed:
            lines.append(f"    figures: {json.dumps(f, default=str)}")
        if self.error is not None:
            lines.append(f"    failed: {type(self.error).__name__}: {self.error}")
        return "\n".join(lines)

