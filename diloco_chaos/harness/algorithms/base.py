"""The algorithm registry: one frozen `Algorithm` descriptor per training algorithm, from which every list of
algorithms and every per-algorithm branch of the harness is derived.

What: each module of diloco_chaos/harness/algorithms (decoupled, diloco, ddp, elastic_ddp) builds one
`Algorithm` and passes it to `register`; `names()`, `get(name)` and `every()` import those modules on first use
(as diloco_chaos/harness/invariants/registry.py imports checks/), then the plugin modules named in the
environment variable `DILOCO_CHAOS_PLUGINS` (comma-separated module names: an algorithm outside the package,
docs/api.md "Adding an algorithm"). The scenario's `algorithm` choices, the CLI's `--algorithm`, compare's
rows, the invariant table, the learner's loop, the syncer's handler, the wire precision, the report's
accounting and the simulator's method all ask the descriptor: a new algorithm is one module.

Why: the four names used to be listed, or tested one by one, in about twelve files, so adding an algorithm
meant finding every one of them. The descriptor's traits say what the branches used to say by name
(`fragmented`: decoupled's per-fragment protocol; `elastic`: the shrink policy; ...).

Import weight: the scenario module imports this one to validate `algorithm`, so nothing here (nor in the
descriptor modules at import time) imports the learner, syncer or config packages: the loop, the resume, the
gloo-timeout rule and the handler are small functions of the descriptor modules that import what they use
when called. Child processes (chips, syncer shards) learn of plugins through `plugin_refs()`, which their
specs carry: a forkserver started before a plugin was registered imports it from there (`load_plugins`).
"""

from __future__ import annotations

import difflib
import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.learner.chip import LearnerContext
    from diloco_chaos.harness.record.events import EventLog
    from diloco_chaos.harness.simulator.model import Method
    from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
    from diloco_chaos.harness.syncer.transport import Transport

PLUGINS_ENV = "DILOCO_CHAOS_PLUGINS"
"""Comma-separated module names imported after the built-in algorithms; each registers its own."""

MergeUnit = Literal["fragment", "round", "step"]
"""What one `merge` event merges: a fragment (decoupled), a round of H steps (diloco), one step's gradients
(ddp, elastic_ddp); it is also the unit the report and the invariants account work in."""

Trait = Literal["fragmented", "data_parallel", "elastic", "outer_step", "shardable_syncer", "restorable_syncer",
                "torchrun_engine", "replicated_ranks"]
"""The boolean traits by name: what an invariant may require (`register(requires=...)`) and a check may name."""

System = str
"""The system under test that runs an algorithm (docs/targets.md): a registered target's name (`builtin`: this
package's learners and syncer; `torchft`; or a plugin's, diloco_chaos/harness/targets/base.py)."""

HandlerFactory = Callable[["Scenario", str, "EventLog", "Transport", int], "AlgorithmHandler"]
"""(scenario, run_dir, events, transport, shard) -> the syncer shard's handler (shard: 0 unless syncer.shards > 1)."""


@dataclass(frozen=True)
class Algorithm:
    """One training algorithm as the harness sees it."""

    name: str
    """The scenario's `algorithm` value."""
    summary: str
    """One line for the docs and the CLI."""
    order: int
    """Position in every listing of the algorithms (scenario choices, CLI, invariant table); smaller first."""
    merge_unit: MergeUnit
    """What one merge merges; `fragmented` and `data_parallel` follow from it."""
    elastic: bool
    """Elastic inside a learner: a learner whose non-host chip dies can go on with fewer chips
    (recovery.policy = 'shrink'; 'elastic' resolves to shrink)."""
    outer_step: bool
    """Has an outer step on the global model, so `diloco.wire_dtype` applies to its traffic (else fp32)."""
    shardable_syncer: bool
    """Its syncer may be split into syncer.shards processes (by fragment)."""
    restorable_syncer: bool
    """Its syncer keeps a checkpoint a restarted syncer restores, so syncer faults are supported."""
    gloo_timeout_s: Callable[[Scenario], float]
    """The bound of every collective inside a learner's Gloo group."""
    run_learner: Callable[[LearnerContext], None]
    """Train: the learner loop a chip runs (diloco_chaos/trainers/learner/loops.py) with its hooks."""
    resume_learner: Callable[[LearnerContext], None]
    """A restarted learner, before it trains again: take the global model from the syncer."""
    syncer_handler: HandlerFactory
    """The syncer service's `AlgorithmHandler` (diloco_chaos/harness/syncer/dispatch.py), built with its core."""
    compare_order: int
    """Position in `diloco-chaos compare`'s table (smaller first)."""
    goodput_rank: int | None = None
    """Its place in the paper's ranking of goodput under failures (Table 1; larger is better), None if it has
    none there: compare's verdict checks each ranked row is above the next lower one."""
    claim_subject: bool = False
    """compare's verdict is about this algorithm: its goodput above, its uptime at least every other's, and its
    loss near the quality reference's."""
    quality_reference: bool = False
    """compare's fault-free reference run is of this algorithm."""
    sim_method: Method | None = None
    """The failure simulator's method for it (diloco_chaos/harness/simulator/model.py), None if it has none."""
    system: System = "builtin"
    """The system under test that runs it (`target.system`, diloco_chaos/harness/targets/): builtin, or another
    target (torchft, a plugin's) whose trainer runs it; `run_learner`, `resume_learner` and `syncer_handler` are
    then never called. Invariants select the systems they apply to by this name (`register(systems=...)`)."""
    torchrun_engine: bool = False
    """Its learners can run as one torchrun elastic job (`[elastic] engine = "torchrun"`: a loss stops every
    worker, which restarts from the last checkpoint); every other algorithm runs with engine "regroup"."""
    replicated_ranks: bool = False
    """Its trainer keeps a full copy of the model at every rank of a learner (data parallel inside the group), so
    the ranks of one group must agree (invariant `ranks_agree`); False for the built-in algorithms (their chips'
    agreement is the learner's own, not checked by digest) and for torchft_diloco (one rank per group)."""
    adapt: Callable[[Scenario], tuple[dict[str, object], str | None]] | None = None
    """The smallest change a scenario written for another algorithm needs before this one can run it: the
    sections to replace (`Scenario.replace` keywords) and what was changed (None: nothing); None: every
    scenario runs as written. `switch` applies it."""

    @property
    def fragmented(self) -> bool:
        """Merges fragments: the per-fragment protocol (pushes, versions, apply schedule, initial pull)."""
        return self.merge_unit == "fragment"

    @property
    def data_parallel(self) -> bool:
        """Every step is one merge of the participants' gradients (`merge` events carry `step`)."""
        return self.merge_unit == "step"

    def has(self, trait: Trait) -> bool:
        """Whether it has the boolean trait `trait`."""
        return bool(getattr(self, trait))


@dataclass(frozen=True)
class PluginRef:
    """A plugin module and the sys.path entry it was imported from, so a child process imports the same one."""

    module: str
    root: str


_REGISTRY: dict[str, Algorithm] = {}
_MODULE: dict[str, str] = {}
_loaded_builtins = False
_loaded_env: str | None = None
_env_modules: tuple[str, ...] = ()


def register(alg: Algorithm) -> Algorithm:
    """Register `alg` under its name (once per module: a second module using the name is a ValueError)."""
    module = sys._getframe(1).f_globals.get("__name__", "")
    if alg.name in _REGISTRY and _MODULE[alg.name] != module:
        raise ValueError(f"algorithm {alg.name!r} registered twice ({_MODULE[alg.name]}, {module})")
    _REGISTRY[alg.name], _MODULE[alg.name] = alg, module
    return alg


def _load() -> None:
    """Import the built-in descriptor modules once; then, whenever DILOCO_CHAOS_PLUGINS changed, the plugins it
    names now. A plugin it no longer names is dropped (its algorithms unregistered, its module forgotten, so
    naming it again imports it again): the variable says which plugins are in force."""
    global _loaded_builtins, _loaded_env, _env_modules
    if not _loaded_builtins:
        _loaded_builtins = True
        pkg = __name__.rsplit(".", 1)[0]
        for info in pkgutil.iter_modules(importlib.import_module(pkg).__path__):
            if info.name != "base" and not info.name.startswith("_"):
                importlib.import_module(f"{pkg}.{info.name}")
    env = os.environ.get(PLUGINS_ENV, "")
    if env == _loaded_env:
        return
    _loaded_env = env
    wanted = tuple(m for m in (x.strip() for x in env.split(",")) if m)
    for mod in set(_env_modules) - set(wanted):
        for name in [n for n, m in _MODULE.items() if m == mod]:
            del _REGISTRY[name], _MODULE[name]
        sys.modules.pop(mod, None)
    _env_modules = wanted
    for mod in wanted:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            raise ImportError(f"{PLUGINS_ENV}: cannot import plugin module {mod!r}: {e}") from e


def switch(sc: Scenario, name: str) -> tuple[Scenario, str | None]:
    """`sc` under algorithm `name` with the smallest change it needs (`--algorithm`, compare's rows), and what was
    changed (None: nothing): `target.system` back to "auto" when it named another system, then the descriptor's
    `adapt`. The result is validated as any scenario (ScenarioError when it still cannot run)."""
    import dataclasses

    alg = get(name)
    changes: dict[str, object] = {"algorithm": name}
    if sc.target.system not in ("auto", alg.system):
        changes["target"] = dataclasses.replace(sc.target, system="auto")
    note = None
    if sc.elastic.engine == "torchrun" and not alg.torchrun_engine:  # check.py refuses it for the others
        changes["elastic"] = dataclasses.replace(sc.elastic, engine="regroup")
        note = (f"elastic.engine = 'regroup' (torchrun is the engine of {', '.join(with_trait('torchrun_engine'))} "
                "only)")
    if alg.adapt is not None:
        more, adapted = alg.adapt(sc)
        changes.update(more)
        note = "; ".join(n for n in (note, adapted) if n) or None
    return sc.replace(**changes), note


def load() -> None:
    """Import the built-in descriptors and the plugins DILOCO_CHAOS_PLUGINS names now (the target registry calls
    it: a plugin module may register a target too)."""
    _load()


def every() -> list[Algorithm]:
    """Every registered algorithm, in listing order."""
    _load()
    return sorted(_REGISTRY.values(), key=lambda a: (a.order, a.name))


def names() -> tuple[str, ...]:
    """Every registered algorithm's name, in listing order."""
    return tuple(a.name for a in every())


def with_trait(trait: Trait) -> tuple[str, ...]:
    """The names of the algorithms that have `trait`, in listing order."""
    return tuple(a.name for a in every() if a.has(trait))


def get(name: str) -> Algorithm:
    """The descriptor of `name`; ValueError naming the known ones (and a close match) otherwise."""
    _load()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        raise ValueError(f"unknown algorithm {name!r}: one of {', '.join(names())}"
                         + (f"; did you mean {close[0]!r}?" if close else "")
                         + f" (an algorithm outside the package is loaded through {PLUGINS_ENV})")
    return _REGISTRY[name]


def plugin_refs() -> tuple[PluginRef, ...]:
    """The modules outside this package that registered algorithms, for a child process's `load_plugins`."""
    _load()
    pkg = __name__.rsplit(".", 1)[0] + "."
    out: list[PluginRef] = []
    for mod in sorted(set(_MODULE.values())):
        if mod.startswith(pkg) or mod not in sys.modules:
            continue
        file = getattr(sys.modules[mod], "__file__", None) or ""
        root = os.path.dirname(os.path.abspath(file))
        for _ in range(mod.count(".")):
            root = os.path.dirname(root)
        out.append(PluginRef(mod, root))
    return tuple(out)


def load_plugins(refs: Sequence[PluginRef]) -> None:
    """In a child process: import the plugin modules the parent had registered (their roots put on sys.path)."""
    for ref in refs:
        if ref.module not in sys.modules:
            if ref.root and ref.root not in sys.path:
                sys.path.append(ref.root)
            importlib.import_module(ref.module)


class Names(Sequence[str]):
    """A live view of `source()` (default `names()`): the scenario's `algorithm` choices (and `target.system`'s),
    which a plugin registered later extends."""

    def __init__(self, source: Callable[[], tuple[str, ...]] | None = None) -> None:
        self.source = source or names

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self.source()[i]

    def __len__(self) -> int:
        return len(self.source())

    def __iter__(self) -> Iterator[str]:
        return iter(self.source())

    def __contains__(self, x: object) -> bool:
        return x in self.source()

    def __repr__(self) -> str:
        return repr(self.source())


NAMES = Names()
"""Every registered algorithm's name, looked up each time it is read."""
