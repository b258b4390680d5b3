"""The target registry: one frozen `Target` descriptor per system under test (docs/targets.md).

What: a scenario names what is trained through `target.system` (or, with "auto", through its algorithm's
descriptor, diloco_chaos/harness/algorithms/base.py `Algorithm.system`). A target says how a run of it is
carried out (`run`: start its coordinator and its learners' processes, watch them, stop them, then the common
post-run phase of diloco_chaos/harness/run/finish.py), which fault kinds it can carry and whether link proxies
apply. diloco_chaos/harness/run/supervisor.py `run_scenario` asks `get(system_of(sc)).run(...)`, and validation
(diloco_chaos/harness/config/target_check.py) asks the same descriptor; neither has a branch on a system's name.

Why: the harness had one system under test, its own Decoupled DiLoCo and baselines; a real fault-tolerant stack
(torchft) runs its own processes with its own coordinator, so the seam is the whole run of one scenario, with
the run directory (config.json, events.jsonl, report.json, invariants.json, logs/, processes.json, global.pt)
as the contract every target keeps.

Import weight: validation imports this module, so descriptor modules import nothing heavy at import time
(their `run` imports what it needs when called), and none needs its system installed to be listed.
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diloco_chaos.harness.algorithms import base as algorithms

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.run.supervisor import RunResult, Supervisor

OnEvents = Callable[[list[dict[str, Any]]], None]
"""What a run calls with each batch of new events (the CLI's table and progress)."""
RunFn = Callable[["Scenario", "str | os.PathLike[str]", "OnEvents | None"], "RunResult"]
"""(scenario, runs root, on_events) -> the finished run; raises RunFailed when it did not complete."""
MakeSupervisor = Callable[["Scenario", "str | os.PathLike[str]", "OnEvents | None"], "Supervisor"]
"""(scenario, runs root, on_events) -> the run's supervisor, its run directory made, not started yet."""


@dataclass(frozen=True)
class Target:
    """One system under test as the harness sees it."""

    name: str
    """Its `target.system` value."""
    summary: str
    """One line for the docs."""
    run: RunFn
    """Carry out one run of a validated scenario on real processes (its run directory under the root)."""
    fault_kinds: frozenset[str] | None
    """The `[[faults]]` actions it can carry (diloco_chaos/chaos/faults/), None: every one."""
    link_proxies: bool
    """Whether its learners' links can go through Toxiproxy proxies (`links.proxy`); False: it must be "off"."""
    needs_module: str = ""
    """A Python module it needs installed (its optional extra), "" for none: validation names it if absent."""
    fault_refusal: Callable[[str], str] | None = None
    """kind -> why this target refuses that fault kind (validation adds it to the error), None: no reason given."""
    supervisor: MakeSupervisor | None = None
    """Its run's supervisor (a Supervisor subclass), for callers that need the run directory before the run
    (the pytest plugin, `diloco_chaos.run`): `supervisor_for`; None: only `run` carries out its runs."""
    builtin_syncer: bool = True
    """Whether `kill_syncer` hits the built-in syncer, so its rules apply (a restorable algorithm,
    recovery.syncer_checkpoint); False: the target's coordinator, checked by the target's own rules
    (diloco_chaos/harness/config/target_check.py)."""


_REGISTRY: dict[str, Target] = {}
_loaded = False


def register(target: Target) -> Target:
    """Register `target` under its name (once)."""
    if target.name in _REGISTRY and _REGISTRY[target.name] is not target:
        raise ValueError(f"target {target.name!r} registered twice")
    _REGISTRY[target.name] = target
    return target


def _load() -> None:
    """Import every descriptor module of this package once (modules and sub-packages, not base)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    pkg = __name__.rsplit(".", 1)[0]
    for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{pkg}.{info.name}")


def names() -> tuple[str, ...]:
    """Every registered target's name, sorted."""
    _load()
    return tuple(sorted(_REGISTRY))


def get(name: str) -> Target:
    """The descriptor of `name`; ValueError naming the known ones otherwise."""
    _load()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        raise ValueError(f"unknown target system {name!r}: one of {', '.join(names())}"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    return _REGISTRY[name]


def system_of(sc: Scenario) -> str:
    """The system that runs `sc`: `target.system`, or with "auto" the one its algorithm's descriptor names."""
    return algorithms.get(sc.algorithm).system if sc.target.system == "auto" else sc.target.system


def supervisor_for(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None = None) -> Supervisor:
    """The supervisor of a run of `sc` on its system (its run directory made; `.run()` carries it out)."""
    target = get(system_of(sc))
    if target.supervisor is None:
        raise ValueError(f"target {target.name!r} gives no supervisor (Target.supervisor): run it with its `run`")
    return target.supervisor(sc, run_root, on_events)
