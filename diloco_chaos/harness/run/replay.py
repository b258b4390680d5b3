"""Replay: run a recorded run again with the same config, seed and fault schedule, and compare the timelines.

A run directory holds the resolved scenario (config.json) with its `[[faults]]`
schedule; replaying it runs the same algorithm, data order and seed, and the
same faults at the same triggers. Faults triggered by training progress land
at the same step or merge count by construction (the trigger is the step);
the progress actually seen when a fault fired can trail its trigger by one
supervisor poll (<= 50 ms of training), which the comparison reports.

A replay is also judged: `RunVerdicts` reads each run's key figures (report.json) and its invariants' verdicts
(invariants.json, recorded as the run ended), `side_by_side` prints the original's and the replay's next to each
other and lists each verdict that differs (an invariant that holds in one and not the other, or unexpected errors
in only one), which makes `diloco-chaos replay` exit non-zero. The asynchronous learners make the figures
themselves differ a little from run to run with the same seed (docs/metrics.md); a verdict should not.

An incident file is a TOML file of `[[faults]]` tables (the same schedule
format), e.g. a production incident written down by hand, applied on top of a
scenario with `diloco-chaos run --incident FILE`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diloco_chaos.chaos.schedule import ScheduleError, never_fires, parse_fault
from diloco_chaos.harness.config.scenario import Scenario, from_dict
from diloco_chaos.harness.config.sections import ScenarioError, read_toml
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.report.results import InvariantFigure, invariant_figures
from diloco_chaos.harness.report.timeline import fault_timeline
from diloco_chaos.harness.run.rundir import (
    CONFIG_FILE,
    REPORT_FILE,
    FinishedRun,
    RunDirError,
    check_run_dir,
    read_json,
    scenario_table,
)


def recorded_scenario(run_dir: str | os.PathLike[str]) -> Scenario:
    """The scenario a run directory was made with (validated again)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ScenarioError(f"{str(run_dir)!r} is not a run directory: no {CONFIG_FILE}")
    try:
        check_run_dir(run_dir, (CONFIG_FILE,), None)
    except RunDirError as e:
        raise ScenarioError(str(e)) from None
    return from_dict(scenario_table(read_json(path)))


def load_incident(path: str | os.PathLike[str], sc: Scenario) -> Scenario:
    """The scenario with the incident file's faults appended. An error names the incident file and its own
    faults[i] (an incident's first fault is its faults[0], whatever the scenario holds)."""
    table = read_toml(path, "incident file")
    where = f"incident file {str(path)!r}"
    unknown = sorted(set(table) - {"faults", "description"})
    if unknown:
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r}; allowed: faults, description")
    faults = table.get("faults", [])
    if not isinstance(faults, list) or not faults:
        raise ScenarioError(f"{where}: needs at least one [[faults]] table")
    if not isinstance(table.get("description", ""), str):
        raise ScenarioError(f"{where}: description must be a string")
    for i, f in enumerate(faults):
        try:
            spec = parse_fault(f, f"faults[{i}]", sc.topology.learners)
        except ScheduleError as e:
            raise ScenarioError(f"{where}: {e}") from None
        why = never_fires(spec, sc.train.steps, sc.timeouts.run_s)
        if why is not None:
            raise ScenarioError(f"{where}: faults[{i}].{why} (the fault could never fire)")
    try:
        return sc.replace(faults=[*sc.faults, *faults])
    except ScenarioError as e:  # a rule across the whole scenario (a chip index, restarts): say where it came from
        raise ScenarioError(f"{where} on top of scenario {sc.name!r}: {e}") from None


def fired_faults(run: FinishedRun) -> list[dict[str, Any]]:
    """What fired in a run, in firing order: index, description, trigger and the progress seen then
    (diloco_chaos.harness.report.timeline.fault_timeline of the run's log, read leniently, so a run written by an
    older version replays too)."""
    return [s.replay_row() for s in fault_timeline(run.log.records)]


def compare_timelines(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences in what fired and at which trigger (empty: the same timeline)."""
    diffs = []
    ka = [(x["index"], x["describe"], x["trigger"]) for x in sorted(a, key=lambda x: x["index"])]
    kb = [(x["index"], x["describe"], x["trigger"]) for x in sorted(b, key=lambda x: x["index"])]
    for x in sorted(set(ka) ^ set(kb)):
        diffs.append(f"faults[{x[0]}] {x[1]} at {x[2]!r} fired in only one of the runs")
    return diffs


@dataclass(frozen=True)
class RunVerdicts:
    """What replay compares of one finished run: key figures (report.json) and verdicts (invariants.json)."""

    run_dir: str
    final_eval_loss: float | None
    goodput: float | None
    merges: int | None
    uptime: float | None
    unexpected_errors: int
    """Errors of the run's processes that no injected fault explains (report.json `errors`)."""
    invariants: tuple[InvariantFigure, ...]

    @classmethod
    def read(cls, run: FinishedRun) -> RunVerdicts:
        """From a finished run (its report; its recorded invariants.json, else checked now on its log)."""
        r = run.report
        return cls(str(run.run_dir), r.get("final_eval_loss"), (r.get("goodput") or {}).get("goodput"),
                   r.get("merge_count"), (r.get("availability") or {}).get("uptime"),
                   sum(not e.get("expected") for e in r.get("errors", [])), invariant_figures(run))


def finished_run(run_dir: str | os.PathLike[str]) -> FinishedRun:
    """A finished run directory read once for replay (report.json and events.jsonl required): ScenarioError,
    naming the file, when one is missing or damaged."""
    try:
        check_run_dir(run_dir, (REPORT_FILE,), EVENTS_FILE)
    except RunDirError as e:
        raise ScenarioError(str(e)) from None
    return FinishedRun.load(run_dir)


def _num(x: Any, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _verdict(f: InvariantFigure | None) -> str:
    if f is None:
        return "not checked"
    unit = f" {f.unit}" if f.unit else ""
    def g(x: Any) -> str:
        return "n/a" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)

    return f"{'holds' if f.ok else 'VIOLATED'} {g(f.figure)}{unit} ({f.relation} {g(f.bound)})"


def side_by_side(a: RunVerdicts, b: RunVerdicts, names: tuple[str, str] = ("original", "replay")
                 ) -> tuple[list[str], list[str]]:
    """The two runs' figures and verdicts as table lines, and every verdict that differs (empty: the same)."""
    ia, ib = {f.name: f for f in a.invariants}, {f.name: f for f in b.invariants}
    rows = [("final eval loss", _num(a.final_eval_loss, 4), _num(b.final_eval_loss, 4)),
            ("goodput", _num(a.goodput, 4), _num(b.goodput, 4)), ("merges", _num(a.merges, 0), _num(b.merges, 0)),
            ("uptime", _num(a.uptime, 4), _num(b.uptime, 4)),
            ("unexpected errors", str(a.unexpected_errors), str(b.unexpected_errors))]
    differs: set[str] = set()
    if (a.unexpected_errors > 0) != (b.unexpected_errors > 0):
        differs.add("unexpected errors")
    for name in [*ia, *(n for n in ib if n not in ia)]:
        fa, fb = ia.get(name), ib.get(name)
        rows.append((f"invariant {name}", _verdict(fa), _verdict(fb)))
        if fa is None or fb is None or fa.ok != fb.ok:
            differs.add(f"invariant {name}")
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(names[0]), *(len(r[1]) for r in rows))
    lines = [f"{'':<{w0}}  {names[0]:<{w1}}  {names[1]}"]
    lines += [f"{k:<{w0}}  {x:<{w1}}  {y}{'   <- verdict differs' if k in differs else ''}" for k, x, y in rows]
    diffs = [f"{k}: {x} in the {names[0]}, {y} in the {names[1]}" for k, x, y in rows if k in differs]
    return lines, diffs
