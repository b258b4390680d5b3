"""Scenario files: TOML in, one validated, frozen `Scenario` out.

Validation happens before any process starts: unknown keys, wrong types, values out of range and cross-field
rules (K <= M, the timeout hierarchy, a corpus that exists) each give a `ScenarioError` naming the key and what
is allowed. `build(table)` reads every section (diloco_chaos/harness/config/sections.py) and runs every rule
(diloco_chaos/harness/config/check.py), collecting every error of a document, and `from_dict` raises them
together. The resolved scenario is written into every run directory, so a run can be replayed from its
directory alone.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from diloco_chaos.chaos import faults as fault_kinds
from diloco_chaos.chaos.schedule import FaultSpec, ScheduleError, parse_fault
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.check import (
    MAX_LEARNERS,
    check_name,
    entry_value,
    read_section,
    rules,
    scenario_problems,
)
from diloco_chaos.harness.config.sections import (
    ElasticConfig,
    EvalConfig,
    ExploreConfig,
    Found,
    LaunchConfig,
    LinksConfig,
    RecoveryConfig,
    ScenarioError,
    SyncerConfig,
    TargetConfig,
    Timeouts,
    Topology,
    TorchftConfig,
    read_toml,
)
from diloco_chaos.trainers.config import DilocoConfig, TrainConfig, bounded, choice, did_you_mean
from diloco_chaos.trainers.data import DataConfig
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.task import TaskConfig


@dataclass(frozen=True)
class Scenario:
    """Everything a run needs. Written, resolved, into the run directory as config.json."""

    name: str = "default"
    """Free-form name, used in the run directory's name."""
    seed: int = bounded(0, 0, 2**31 - 1)
    """Seeds model init, data order and every random choice of the harness."""
    algorithm: str = choice("decoupled", algorithms.NAMES)
    """decoupled (Decoupled DiLoCo), diloco (synchronous DiLoCo), ddp (synchronous data parallel) or elastic_ddp
    (data parallel whose global group drops a lost learner and admits it again after its repair)."""
    topology: Topology = field(default_factory=Topology)
    task: TaskConfig = field(default_factory=TaskConfig)
    """`[task]`: the model, data and loss the learners train (diloco_chaos/trainers/task.py; default: the byte LM)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """`[model]`: the byte LM's shape (the built-in byte_lm task; other tasks take theirs from task.args)."""
    data: DataConfig = field(default_factory=DataConfig)
    """`[data]`: the byte LM's corpus and holdout; data.batch_size is every task's examples per chip per step."""
    train: TrainConfig = field(default_factory=TrainConfig)
    diloco: DilocoConfig = field(default_factory=DilocoConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    eval: EvalConfig = field(default_factory=EvalConfig)
    links: LinksConfig = field(default_factory=LinksConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    syncer: SyncerConfig = field(default_factory=SyncerConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    """`[elastic]`: elastic_ddp's restart engine (in-place regroup, or a torchrun elastic job)."""
    target: TargetConfig = field(default_factory=TargetConfig)
    """`[target]`: the system under test (docs/targets.md)."""
    torchft: TorchftConfig = field(default_factory=TorchftConfig)
    """`[torchft]`: the torchft target's Lighthouse flags and timeouts (docs/targets/torchft.md)."""
    explore: ExploreConfig = field(default_factory=ExploreConfig)
    """`[explore]`: the fault vocabulary `diloco-chaos explore` draws schedules from (docs/explore.md)."""
    faults: tuple[FaultSpec, ...] = ()
    """Scheduled faults, `[[faults]]` tables (diloco_chaos/chaos/schedule.py): action, learner, at, until,
    parameters."""
    random_faults_source: str = ""
    """Record only: the `[random_faults]` table (JSON) whose draws were appended to `faults` before the run
    (diloco_chaos/chaos/fault_generator.py). The draws are already explicit entries, so a replay does not draw again."""
    overrides: tuple[str, ...] = ()
    """Record only: the `--set KEY=VALUE` overrides (`apply_overrides`) applied, in order, to the scenario's
    tables before validation. The values above are already the effective ones, so a replay applies nothing
    again; this says which of them came from the command line rather than the file."""

    @property
    def links_in_effect(self) -> LinksConfig:
        """`links` as this run uses them, `auto` resolved for its hosts and faults (`LinksConfig.in_effect`)."""
        link_faults = any(fault_kinds.get(f.action).target == "link" for f in self.faults)
        return self.links.in_effect(self.launch.hosts, link_faults)

    def replace(self, **changes: Any) -> Scenario:
        """A copy with top-level fields changed, validated again. `faults` may be given as tables."""
        if "faults" in changes:
            learners = changes.get("topology", self.topology).learners
            try:
                changes["faults"] = tuple(parse_fault(f, f"faults[{i}]", learners)
                                          for i, f in enumerate(changes["faults"]))
            except ScheduleError as e:
                raise ScenarioError(str(e)) from None
        out = dataclasses.replace(self, **changes)
        validate(out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The scenario as tables, each fault in its flat `[[faults]]` form (from_dict reads it back)."""
        out = dataclasses.asdict(self)
        out["faults"] = [f.to_table() for f in self.faults]
        return out


def validate(sc: Scenario) -> None:
    """Check ranges and the rules that tie fields together. Raises ScenarioError holding every error found."""
    errors = scenario_problems(sc)
    if errors:
        raise ScenarioError.of(errors)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`KEY=VALUE` -> (the key's path, the value). KEY is a dotted path (`train.steps`, `seed`); VALUE is read
    as a TOML value (`500`, `0.5`, `true`, `"x"`, `[1, 2]`, `{ step = 3 }`), and taken as a plain string when
    it is not one (`fp32`), so an unquoted word needs no shell quoting. Raises ScenarioError naming the text."""
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ScenarioError(f"--set {text!r}: must be KEY=VALUE, e.g. train.steps=500")
    path = key.split(".")
    if not all(_OVERRIDE_PART.fullmatch(p) for p in path):
        raise ScenarioError(f"--set {text!r}: the key {key!r} must be a dotted path of names, e.g. train.steps")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return path, value


_OVERRIDE_PART = re.compile(r"[A-Za-z0-9_-]+")


def apply_overrides(table: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of a scenario document with each `KEY=VALUE` override set (`parse_override`), in order, and the
    overrides appended to its `overrides` record. A missing table on the path is created; what is set is not
    checked here: `check` validates the result exactly like a file (an unknown key or a bad value gives the
    same error, naming the key). Raises ScenarioError for a malformed override or a path through a value."""
    out = copy.deepcopy(table)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, part in enumerate(path[:-1]):
            nxt = node.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ScenarioError(f"--set {text!r}: {'.'.join(path[:i + 1])} is a value, not a table "
                                    f"(it holds {nxt!r})")
            node = nxt
        node[path[-1]] = value
    if overrides:
        recorded = out.get("overrides", [])
        out["overrides"] = [*(recorded if isinstance(recorded, (list, tuple)) else [recorded]), *overrides]
    return out


def from_dict(table: dict[str, Any], overrides: Sequence[str] = ()) -> Scenario:
    """Build and validate a Scenario from a parsed TOML table (a `[random_faults]` table is drawn first, once
    what its size depends on is valid), with `overrides` (`KEY=VALUE`, `apply_overrides`) set on it first.
    Raises ScenarioError holding every error of the document (diloco_chaos/harness/config/check.py)."""
    sc, errors = build(apply_overrides(table, overrides) if overrides else table)
    if sc is None:
        raise ScenarioError.of(errors)
    return sc


def load(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Scenario:
    """Read a TOML scenario file, with `overrides` (`KEY=VALUE`) set on its tables before validation. Raises
    ScenarioError with the key for any bad value."""
    return from_dict(read_toml(path, "scenario file"), overrides)


def builtin(name: str = "default", overrides: Sequence[str] = ()) -> Scenario:
    """One of the scenarios shipped inside the package (diloco_chaos/harness/config/scenarios/NAME.toml), with
    `overrides`."""
    names = builtin_names()
    if name not in names:
        raise ScenarioError(f"no built-in scenario {name!r}; the built-in ones: {', '.join(names)}")
    text = resources.files(__package__).joinpath("scenarios", f"{name}.toml").read_text(encoding="utf-8")
    return from_dict(tomllib.loads(text), overrides)


def builtin_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files(__package__).joinpath("scenarios").iterdir()
                  if p.name.endswith(".toml"))


def build(table: Any) -> tuple[Scenario | None, list[ScenarioError]]:
    """The Scenario a parsed document describes and every error in it: (scenario, []) or (None, errors)."""
    found = Found()
    if not isinstance(table, dict):
        found.add("scenario", "scenario: must be a table")
        return None, found.capped()
    fields = {f.name: f for f in dataclasses.fields(Scenario)}
    allowed = [*fields, "random_faults"]
    for name in sorted(set(table) - set(allowed), key=str):
        found.add(name, f"unknown key {name}{did_you_mean(name, allowed)} in the top level; "
                        f"allowed: {', '.join(allowed)}")
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        f = fields.get(name)
        if f is None or name == "faults":
            continue
        if f.default_factory is not dataclasses.MISSING:  # a nested table
            kwargs[name] = read_section(type(f.default_factory()), value, name, found)  # type: ignore[misc]
            continue
        try:
            kwargs[name] = entry_value(name, f, value, {})
        except ScenarioError as e:
            found.add(name, str(e))
    if found.ok("name"):
        check_name(kwargs.get("name", Scenario.name), found)
    raw_faults = table.get("faults", [])
    if not isinstance(raw_faults, (list, tuple)):
        found.add("faults", f"faults = {raw_faults!r}: must be an array of tables ([[faults]])")
        raw_faults = []
    raw_faults = list(raw_faults)
    written = len(raw_faults)
    if "random_faults" in table:
        drawn = _draw(table, kwargs, found)
        if drawn is not None:
            raw_faults += drawn
            rf = table["random_faults"]
            kwargs["random_faults_source"] = json.dumps(rf if isinstance(rf, dict) else str(rf), sort_keys=True,
                                                        default=str)
    topology = kwargs.get("topology", Topology())
    learners = topology.learners if found.ok("topology.learners") else MAX_LEARNERS
    specs: list[tuple[str, FaultSpec]] = []
    for i, raw in enumerate(raw_faults):
        try:
            specs.append((f"faults[{i}]", parse_fault(raw, f"faults[{i}]", learners)))
        except ScheduleError as e:
            found.add(f"faults[{i}]", str(e))
    sc = Scenario(**kwargs, faults=tuple(s for _, s in specs))
    rules(sc, [k for k, _ in specs], found)
    found.fold_drawn(written)
    return (None, found.capped()) if found.errors else (sc, [])


def _draw(table: dict[str, Any], kwargs: dict[str, Any], found: Found) -> list[dict[str, Any]] | None:
    """The `[[faults]]` entries a `[random_faults]` table draws, or None when it is refused or cannot be drawn
    yet (what the draw's size depends on, topology and train.steps, was refused: it is not expanded)."""
    from diloco_chaos.chaos.fault_generator import expand
    from diloco_chaos.chaos.fault_generator import validate as validate_random

    if not found.ok("topology.learners", "topology.chips_per_learner", "train.steps"):
        return None
    topology, train = kwargs.get("topology", Topology()), kwargs.get("train", TrainConfig())
    learners, chips, steps = topology.learners, topology.chips_per_learner, train.steps
    seed = kwargs.get("seed", 0) if found.ok("seed") else 0
    try:
        cfg = validate_random(table["random_faults"], "random_faults", learners, chips, steps)
    except ValueError as e:
        found.add("random_faults", str(e))
        return None
    drawn = expand(cfg, learners=learners, chips_per_learner=chips, steps=steps, seed=seed)
    if not found.ok("recovery.max_restarts"):
        return drawn
    restarts = kwargs.get("recovery", RecoveryConfig()).max_restarts
    kills: dict[int, int] = {}
    for f in drawn:
        if f["action"] in ("kill_chip", "kill_learner", "crash_host"):
            kills[f["learner"]] = kills.get(f["learner"], 0) + 1
    worst = max(kills.items(), key=lambda kv: kv[1], default=None)
    if worst is not None and worst[1] > restarts:
        found.add("random_faults", f"random_faults: the draw kills learner {worst[0]} {worst[1]} times, but "
                                   f"recovery.max_restarts = {restarts}; raise it to at least {worst[1]}, "
                                   "or raise random_faults.mtbf_steps")
        return None
    return drawn


