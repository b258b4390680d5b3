"""Replay: run a recorded run again with the same config, seed and fault schedule, and compare the timelines.

A run directory holds the resolved scenario (config.json) with its `[[faults]]`
schedule; replaying it runs the same algorithm, data order and seed, and the
same faults at the same triggers. Faults triggered by training progress land
at the same step or merge count by construction (the trigger is the step);
the progress actually seen when a fault fired can trail its trigger by one
supervisor poll (<= 50 ms of training), which the comparison reports.

An incident file is a TOML file of `[[faults]]` tables (the same schedule
format), e.g. a production incident written down by hand, applied on top of a
scenario with `diloco-chaos run --incident FILE`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chaos.schedule import ScheduleError, never_fires, parse_fault
from harness.record import RunLog
from harness.record.run import FaultStart
from harness.rundir import CONFIG_FILE, RunDirError, check_run_dir, read_json
from harness.scenario import Scenario, ScenarioError, from_dict, read_toml


def recorded_scenario(run_dir: str | os.PathLike[str]) -> Scenario:
    """The scenario a run directory was made with (validated again)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ScenarioError(f"{str(run_dir)!r} is not a run directory: no {CONFIG_FILE}")
    try:
        check_run_dir(run_dir, (CONFIG_FILE,), None)
    except RunDirError as e:
        raise ScenarioError(str(e)) from None
    return from_dict(read_json(path))


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


def fault_timeline(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What fired in a run, in firing order: index, description, trigger and the progress seen then (read from
    the run's fault_start records, RunLog.load: lenient, so a run written by an older version replays too)."""
    return [{"index": e.index, "describe": e.describe, "trigger": e.reason, "steps": e.progress["steps"],
             "merges": e.progress["merges"]} for e in RunLog.load(run_dir).of(FaultStart)]


def compare_timelines(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences in what fired and at which trigger (empty: the same timeline)."""
    diffs = []
    ka = [(x["index"], x["describe"], x["trigger"]) for x in sorted(a, key=lambda x: x["index"])]
    kb = [(x["index"], x["describe"], x["trigger"]) for x in sorted(b, key=lambda x: x["index"])]
    for x in sorted(set(ka) ^ set(kb)):
        diffs.append(f"faults[{x[0]}] {x[1]} at {x[2]!r} fired in only one of the runs")
    return diffs
