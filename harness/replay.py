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

from harness.events import EVENTS_FILE, read_events
from harness.rundir import CONFIG_FILE, read_json
from harness.scenario import Scenario, ScenarioError, from_dict, read_toml


def recorded_scenario(run_dir: str | os.PathLike[str]) -> Scenario:
    """The scenario a run directory was made with (validated again)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise ScenarioError(f"{str(run_dir)!r} is not a run directory: no {CONFIG_FILE}")
    return from_dict(read_json(path))


def load_incident(path: str | os.PathLike[str], sc: Scenario) -> Scenario:
    """The scenario with the incident file's faults appended. Errors name faults[i].key as in a scenario."""
    table = read_toml(path, "incident file")
    unknown = sorted(set(table) - {"faults", "description"})
    if unknown:
        raise ScenarioError(f"unknown key {unknown[0]} in incident file; allowed: faults, description")
    faults = table.get("faults", [])
    if not isinstance(faults, list) or not faults:
        raise ScenarioError("incident file: needs at least one [[faults]] table")
    return sc.replace(faults=[*sc.faults, *faults])


def fault_timeline(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """What fired in a run, in firing order: index, description, trigger and the progress seen then."""
    out = []
    for e in read_events(Path(run_dir) / EVENTS_FILE):
        if e["ev"] == "fault_start":
            out.append({"index": e["index"], "describe": e["describe"], "trigger": e["reason"],
                        "steps": e["progress"]["steps"], "merges": e["progress"]["merges"]})
    return out


def compare_timelines(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Differences in what fired and at which trigger (empty: the same timeline)."""
    diffs = []
    ka = [(x["index"], x["describe"], x["trigger"]) for x in sorted(a, key=lambda x: x["index"])]
    kb = [(x["index"], x["describe"], x["trigger"]) for x in sorted(b, key=lambda x: x["index"])]
    for x in sorted(set(ka) ^ set(kb)):
        diffs.append(f"faults[{x[0]}] {x[1]} at {x[2]!r} fired in only one of the runs")
    return diffs
