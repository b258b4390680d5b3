"""What a fault kind is, and the registry of kinds by name.

Like a Toxiproxy toxic (one file plus a `Register` call), a fault kind is one
module under diloco_chaos/chaos/faults/ that defines a `FaultKind` subclass and decorates
it with `@register`. The class says everything the rest of the harness needs:

  * `name`: the scenario's `action = "<name>"`;
  * `target`: what it hits, "link" (one learner's proxy), "process" (one
    learner's processes) or "syncer" (the synchronizer; no `learner`);
  * `params`: a frozen dataclass of its parameters (the flat keys of a
    `[[faults]]` table), each field defaulting to None (unset) with its range
    (`bounded`) or choices (`choice`) in the field's metadata, checked here;
  * `validate(spec, key)`: rules between fields (e.g. flap needs period_s and
    duty; freeze needs `until`);
  * `backends`: the link backends that can carry it ("embedded", "toxiproxy",
    "kernel") or {"local"} for signals to local processes, and
    `backend_params`: for a backend that carries only some of its parameters,
    which ones (the capability table, `capabilities()`, docs/multi-host.md);
  * `apply(ctx, spec)`: start it, returning a handle whose `clear()` ends it;
  * `label(spec)` and `colour`: how reports show it.

This module imports nothing from diloco_chaos.chaos.schedule at run time (the schedule
derives its tables from this registry), so the error type lives here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, TypeVar

from diloco_chaos.trainers.config import bounded, did_you_mean

if TYPE_CHECKING:
    from diloco_chaos.chaos.links import LinkChaos
    from diloco_chaos.chaos.processes import ProcessChaos
    from diloco_chaos.chaos.schedule import FaultSpec

Target = Literal["link", "process", "syncer"]
LINK_BACKENDS = frozenset({"embedded", "toxiproxy"})
"""Link kinds every Toxiproxy server implements: the embedded one and a real (upstream) one."""
KERNEL = frozenset({"kernel"})
"""tc and nftables on a learner host's veth (diloco_chaos/chaos/kernel_links.py; `[launch] hosts = "netns"`)."""
ALL_LINK_BACKENDS = ("embedded", "toxiproxy", "kernel")
"""Every link backend, in the capability table's column order."""
LOCAL = frozenset({"local"})
"""Process kinds: signals to this machine's processes."""


class ScheduleError(ValueError):
    """A fault entry is invalid; the message names the key (faults[i].key) and what is allowed."""


class FaultHandle(Protocol):
    """A started fault; `clear()` (idempotent) ends what can be ended."""

    def clear(self) -> None: ...


@dataclass
class FaultContext:
    """What a kind's `apply` may act through: the run's link chaos and process chaos (either may be absent)."""

    links: LinkChaos | None = None
    """Toxics on learner proxies (diloco_chaos/chaos/links.py); None when the run has no proxies."""
    processes: ProcessChaos | None = None
    """Signals to the run's processes (diloco_chaos/chaos/processes.py)."""

    def link(self) -> LinkChaos:
        if self.links is None:
            raise RuntimeError("link faults need proxies (validated before the run)")
        return self.links

    def process(self) -> ProcessChaos:
        if self.processes is None:
            raise RuntimeError("process faults need the run's process registry")
        return self.processes


@dataclass(frozen=True)
class NoParams:
    """A kind without parameters."""


class FaultKind:
    """One kind of fault. Subclasses set the class attributes and override `apply` (and `validate`, `label`)."""

    name: ClassVar[str]
    target: ClassVar[Target]
    params: ClassVar[type] = NoParams
    backends: ClassVar[frozenset[str]] = LOCAL
    backend_params: ClassVar[dict[str, frozenset[str]]] = {}
    """backend -> the only parameters it can carry, for a backend in `backends` that cannot carry them all."""
    colour: ClassVar[str] = "#7f7f7f"
    summary: ClassVar[str] = ""
    """One line for docs and error messages."""
    required: ClassVar[tuple[str, ...]] = ()
    """Parameters a fault of this kind must set (checked before `validate`)."""

    def param_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.params))

    def check_required(self, spec: FaultSpec, key: str) -> None:
        """ScheduleError naming `key` when a `required` parameter is unset."""
        if any(getattr(spec.options, name) is None for name in self.required):
            raise ScheduleError(f"{key}: {self.name} needs {' and '.join(self.required)}")

    def backend_problem(self, backend: str, spec: FaultSpec) -> str | None:
        """Why `backend` cannot carry this fault (None: it can): the kind, or one of the set parameters."""
        if backend not in self.backends:
            return f"{backend} cannot carry {self.name} (it runs on: {', '.join(sorted(self.backends))})"
        allowed = self.backend_params.get(backend)
        unsupported = sorted(set(spec.params()) - allowed) if allowed is not None else []
        if unsupported:
            return (f"{backend} cannot carry {self.name}'s {', '.join(unsupported)} "
                    f"(it carries only {', '.join(sorted(allowed or ()))})")
        return None

    def validate(self, spec: FaultSpec, key: str) -> None:
        """Rules between fields, after each value passed its range and `required` is set; raise ScheduleError
        naming `key`."""

    def apply(self, ctx: FaultContext, spec: FaultSpec) -> FaultHandle:
        raise NotImplementedError

    def label(self, spec: FaultSpec) -> str:
        """How reports name one fault: `action(who, set params)`."""
        ps = ", ".join(f"{k}={v}" for k, v in spec.params().items())
        who = "syncer" if spec.learner is None else f"learner {spec.learner}"
        return f"{spec.action}({who}{', ' + ps if ps else ''})"

    def parse_params(self, raw: dict[str, Any], key: str) -> Any:
        """The params dataclass from a table's parameter entries (every key already known to be one of ours):
        each value checked against its field's range or choices; errors name `key`.<field>."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(self.params):
            if f.name in raw:
                values[f.name] = check_param(f, raw[f.name], f"{key}.{f.name}")
        return self.params(**values)


def check_param(f: dataclasses.Field, v: Any, key: str) -> Any:
    """One parameter value against its field's `choices` or `range` (integral when the range's ends are ints)."""
    choices = f.metadata.get("choices")
    if choices is not None:
        if v not in choices:
            raise ScheduleError(f"{key} = {v!r}: must be one of {', '.join(choices)}")
        return v
    lo, hi = f.metadata["range"]
    integral = isinstance(lo, int) and isinstance(hi, int)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integral and not isinstance(v, int)):
        raise ScheduleError(f"{key} = {v!r}: must be {'an integer' if integral else 'a number'}")
    if not math.isfinite(v) or not (lo <= v <= hi):
        raise ScheduleError(f"{key} = {v!r}: must be in [{lo}, {hi}]")
    return v if integral else float(v)


_REGISTRY: dict[str, FaultKind] = {}
_K = TypeVar("_K", bound=type[FaultKind])


def register(cls: _K) -> _K:
    """Class decorator: register one instance of the kind under its `name` (once)."""
    kind = cls()
    if kind.name in _REGISTRY:
        raise ValueError(f"fault kind {kind.name!r} registered twice ({_REGISTRY[kind.name].__module__}, "
                         f"{cls.__module__})")
    for f in dataclasses.fields(kind.params):
        if f.default is not None or not ({"range", "choices"} & set(f.metadata)):
            raise TypeError(f"{cls.__name__}.params.{f.name}: needs default None and a range or choices")
    _REGISTRY[kind.name] = kind
    return cls


def kinds() -> dict[str, FaultKind]:
    """Every registered kind by name, in registration order."""
    _load()
    return dict(_REGISTRY)


def find(name: Any) -> FaultKind | None:
    _load()
    return _REGISTRY.get(name) if isinstance(name, str) else None


def get(name: Any, key: str = "action") -> FaultKind:
    """The kind called `name`; ScheduleError naming `key`, the allowed names and the closest one otherwise."""
    kind = find(name)
    if kind is None:
        names = list(_REGISTRY)
        raise ScheduleError(f"{key} = {name!r}: must be one of {', '.join(names)}"
                            f"{did_you_mean(name, names) if isinstance(name, str) else ''}")
    return kind


def names(where: Callable[[FaultKind], bool] = lambda k: True) -> tuple[str, ...]:
    """Names of the registered kinds `where` holds for, in registration order."""
    return tuple(n for n, k in kinds().items() if where(k))


def _load() -> None:
    """Importing the package registers every kind module (diloco_chaos/chaos/faults/__init__.py lists them)."""
    import diloco_chaos.chaos.faults  # noqa: F401


@dataclass(frozen=True)
class RepairParams:
    """Parameters of the one-shot kills (kill_chip, kill_learner, crash_host, kill_syncer)."""

    repair_s: float | None = bounded(None, 0.0, 3600.0)
    """Seconds until the supervisor restarts what was killed (unset: recovery.repair_s, or
    recovery.syncer_repair_s for the syncer)."""


def remember_repair(ctx: FaultContext, spec: FaultSpec) -> None:
    """A learner kill's own repair delay, for the supervisor to pop when it restarts the learner (kill_syncer
    hands its own to `ProcessChaos.kill_syncer`, per shard)."""
    if spec.repair_s is not None and spec.learner is not None:
        ctx.process().repair_s[spec.learner] = spec.repair_s


def capabilities() -> list[tuple[str, dict[str, str]]]:
    """The capability table: for each link kind, what each link backend (ALL_LINK_BACKENDS) carries: "yes",
    "no" or "only <params>"."""
    rows = []
    for name, kind in kinds().items():
        if kind.target != "link":
            continue
        cells = {}
        for b in ALL_LINK_BACKENDS:
            only = kind.backend_params.get(b)
            cells[b] = "no" if b not in kind.backends else f"only {', '.join(sorted(only))}" if only else "yes"
        rows.append((name, cells))
    return rows
