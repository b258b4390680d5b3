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

Plugins: a module outside the package that calls `register(Target(...))` (and registers its algorithms, with
`system` its target's name) is loaded by naming it in DILOCO_CHAOS_PLUGINS, as an algorithm plugin is
(diloco_chaos/harness/algorithms/base.py `load`); while the variable no longer names it, its target is dropped
with its algorithms. docs/targets.md "Adding a target"; tests/targets/toy_target.py is a worked example.

Import weight: validation imports this module, so descriptor modules import nothing heavy at import time
(their `run` imports what it needs when called), and none needs its system installed to be listed.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from diloco_chaos.harness.algorithms import base as algorithms

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found
    from diloco_chaos.harness.run.supervisor import RunResult, Supervisor

OnEvents = Callable[[list[dict[str, Any]]], None]
"""What a run calls with each batch of new events (the CLI's table and progress)."""
RunFn = Callable[["Scenario", "str | os.PathLike[str]", "OnEvents | None"], "RunResult"]
"""(scenario, runs root, on_events) -> the finished run; raises RunFailed when it did not complete."""
MakeSupervisor = Callable[["Scenario", "str | os.PathLike[str]", "OnEvents | None"], "Supervisor"]
"""(scenario, runs root, on_events) -> the run's supervisor, its run directory made, not started yet."""
Rules = Callable[["Scenario", list[str], "Found"], None]
"""(scenario, fault keys, found) -> adds each error of the target's own settings to `found`, naming its key
(`keys[i]` names `scenario.faults[i]`); called by validation once the scenario runs on this target."""


Verdict = Literal["defect", "permitted by configuration", "limit of the harness"]
"""What a finding about a system under test is: its own defect, a behaviour its configuration permits, or a limit
of how the harness drives it (ours to fix, never an excuse for a failed invariant)."""


@dataclass(frozen=True)
class Finding:
    """One classified finding about a target's system (its doc's "Findings", each with versions, a standalone
    reproduction and the promise it was checked against): the invariant failures it explains, in which
    scenarios. compare names it beside a row whose invariant it explains."""

    key: str
    """Its short name, as its entry in the target's doc gives it."""
    title: str
    """One line."""
    verdict: Verdict
    invariants: tuple[str, ...]
    """The invariants whose failure it explains."""
    applies: Callable[[Scenario], bool]
    """Whether a scenario has what the finding needs to show (e.g. a kill_syncer fault, min_replicas 1)."""


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
    reactions: frozenset[str] | None = None
    """The trigger reactions (diloco_chaos/chaos/schedule.py REACTIONS: "rejoin", "syncer_restored") its runs
    write the records of, None: every one. A trigger on another would never fire: validation refuses it, and
    explore (diloco_chaos/harness/explore/generate.py) draws none."""
    reaction_refusal: Callable[[str], str] | None = None
    """reaction -> why its runs never show it (validation adds it to the error), None: no reason given."""
    rules: Rules | None = None
    """Its own validation rules (its launch modes, its settings' hierarchy), None: none beyond the common ones
    (the algorithm's system, needs_module, fault_kinds)."""

    findings: tuple[Finding, ...] = ()
    """Its classified findings (`explain`)."""

    def explain(self, sc: Scenario, invariant: str) -> Finding | None:
        """The finding that explains `invariant` failing on a run of `sc`: one of its own, of verdict "defect" or
        "permitted by configuration", that names the invariant and applies to `sc`; None: the failure is
        unexplained (a limit of the harness explains nothing: it is ours to fix)."""
        return next((f for f in self.findings if f.verdict != "limit of the harness" and invariant in f.invariants
                     and f.applies(sc)), None)

    def installed(self) -> bool:
        """Whether what it needs is importable here (`needs_module`; a target that needs nothing always is)."""
        return not self.needs_module or importlib.util.find_spec(self.needs_module) is not None


_REGISTRY: dict[str, Target] = {}
_MODULE: dict[str, str] = {}
_loaded = False


def register(target: Target) -> Target:
    """Register `target` under its name (once per module: a second module using the name is a ValueError; the
    same module imported again, a plugin named anew, replaces it)."""
    module = sys._getframe(1).f_globals.get("__name__", "")
    if target.name in _REGISTRY and _MODULE[target.name] != module:
        raise ValueError(f"target {target.name!r} registered twice ({_MODULE[target.name]}, {module})")
    _REGISTRY[target.name], _MODULE[target.name] = target, module
    return target


def _load() -> None:
    """Import every descriptor module of this package once (modules and sub-packages, not base), then the plugins
    DILOCO_CHAOS_PLUGINS names now (through the algorithm registry, which owns that variable); a target whose
    plugin module is no longer imported (the variable stopped naming it) is dropped."""
    global _loaded
    pkg = __name__.rsplit(".", 1)[0]
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
            if info.name != "base" and not info.name.startswith("_"):
                importlib.import_module(f"{pkg}.{info.name}")
    algorithms.load()
    for name in [n for n, mod in _MODULE.items() if not mod.startswith(pkg + ".") and mod not in sys.modules]:
        del _REGISTRY[name], _MODULE[name]


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
