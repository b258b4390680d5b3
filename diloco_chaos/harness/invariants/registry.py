"""The invariant registry: one typed `InvariantSpec` per invariant, filled by the modules of
diloco_chaos/harness/invariants/checks.

What: each module of `diloco_chaos.harness.invariants.checks` defines one invariant function and decorates it with
`register(...)`, which records its name, its bounds (parameter name, default, one-line meaning, the range a
value must be in, and the older `check_all` keyword it replaced), the algorithms it applies to (every one, or
those whose descriptor in diloco_chaos/harness/algorithms/ has the trait it `requires` and runs on one of the
`systems` it names: the targets of diloco_chaos/harness/targets/) and
whether `check_all` runs it on its defaults ("always") or only when the caller gives one of its triggering
bounds ("when_bound"). `discover()` imports every module of that package, so adding an invariant is adding one
module: `check_all`, the pytest plugin's `ChaosRun.check` / `measure` and `diloco-chaos invariants` all list the
registry.

Why: the names of the invariants and of their bounds used to be kept by hand in four places (check_all's
signature, the plugin's name table, two docstrings), and the same bound had two names (`bound_s` in the
function, `downtime_bound_s` in check_all). Here a bound has one name everywhere; its former name is refused
with an error giving the new one, a misspelled keyword is reported with the allowed ones and a close match, and
an impossible value (a negative bound, an uptime outside [0, 1]) is a ValueError naming the invariant, before
anything is measured.
"""

from __future__ import annotations

import difflib
import importlib
import math
import pkgutil
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.invariants.base import InvariantResult

Mode = Literal["always", "when_bound"]
"""always: check_all runs it with its defaults; when_bound: only when one of its triggering bounds is given."""

REQUIRED: Any = object()
"""`Bound.default` of a bound the caller must give."""


class UnknownBound(TypeError):
    """A keyword that is no bound of the invariant (or of check_all): the message names the invariant, the bad
    keyword, the allowed ones and the closest match."""


@dataclass(frozen=True)
class Bound:
    """One keyword parameter of an invariant."""

    name: str
    """The parameter's name, the same in the function, `ChaosRun.check` and `check_all`."""
    meaning: str
    """One line: what the bound limits."""
    default: Any = None
    """Its value when not given; `REQUIRED` when the caller must give it."""
    low: float | None = None
    """Smallest allowed value (inclusive), None for no lower limit."""
    high: float | None = None
    """Largest allowed value (inclusive), None for no upper limit."""
    renamed_from: str | None = None
    """The `check_all` keyword this bound had before it got one name everywhere: refused (UnknownBound) with a
    message that gives the new name."""
    triggers: bool = False
    """For a "when_bound" invariant: giving this bound to check_all makes it run."""

    def validate(self, invariant: str, value: Any) -> None:
        """ValueError naming the invariant and the bound when `value` is outside [low, high] or nan."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        if math.isnan(value) or (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high):
            lo = "-inf" if self.low is None else f"{self.low:g}"
            hi = "inf" if self.high is None else f"{self.high:g}"
            raise ValueError(f"invariant {invariant}: bound {self.name}={value!r} is impossible; it must be in "
                             f"[{lo}, {hi}] ({self.meaning})")


@dataclass(frozen=True)
class InvariantSpec:
    """One registered invariant."""

    name: str
    """The invariant's name, as in `InvariantResult.name`."""
    fn: Callable[..., InvariantResult]
    """fn(run, **bounds) -> InvariantResult; run is a run directory or a RunRecord."""
    bounds: tuple[Bound, ...]
    """Its keyword parameters, in signature order."""
    requires: algorithms.Trait | None
    """The trait an algorithm must have for the invariant to apply to its runs; None: every algorithm."""
    systems: tuple[str, ...] | None
    """The systems under test (`Algorithm.system`) whose algorithms' runs it applies to; None: every system."""
    mode: Mode
    """How check_all runs it."""
    order: int
    """Position in check_all's results (smaller first)."""
    summary: str
    """One line: what it checks."""

    @property
    def algorithms(self) -> tuple[str, ...]:
        """The algorithms whose runs it applies to (the registry's, now); check_all skips it for the others."""
        return tuple(a.name for a in algorithms.every() if (self.requires is None or a.has(self.requires))
                     and (self.systems is None or a.system in self.systems))

    def bound(self, keyword: str) -> Bound | None:
        """The bound named `keyword`, None if none."""
        return next((b for b in self.bounds if keyword == b.name), None)

    def resolve(self, bounds: Mapping[str, Any]) -> dict[str, Any]:
        """`bounds` with every value validated. Raises UnknownBound for a keyword that is not one of its bounds
        (naming the new name of a former one), ValueError for an impossible value."""
        out: dict[str, Any] = {}
        for key, value in bounds.items():
            b = self.bound(key)
            if b is None:
                raise unknown_bound(f"invariant {self.name}", key, [x.name for x in self.bounds],
                                    {x.renamed_from: x.name for x in self.bounds if x.renamed_from})
            b.validate(self.name, value)
            out[b.name] = value
        return out

    def __call__(self, run: Any, /, **bounds: Any) -> InvariantResult:
        """Evaluate on `run` with `bounds`, validated first."""
        return self.fn(run, **self.resolve(bounds))


def unknown_bound(where: str, key: str, allowed: Iterable[str],
                  renamed: Mapping[str, str] | None = None) -> UnknownBound:
    """The error for `key`: the allowed names, and the new name of a former one or else the closest match."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    if renamed and key in renamed:
        hint = f"; {key!r} was renamed {renamed[key]!r}, its one name everywhere"
    return UnknownBound(f"{where} has no bound {key!r}; allowed: {', '.join(allowed) or '(none)'}{hint}")


_REGISTRY: dict[str, InvariantSpec] = {}


def register(*, bounds: tuple[Bound, ...] = (), requires: algorithms.Trait | None = None,
             systems: tuple[str, ...] | None = None, mode: Mode = "always",
             order: int) -> Callable[[Callable[..., InvariantResult]], Callable[..., InvariantResult]]:
    """Decorator: register the function as the invariant of its own name, for the algorithms with the trait it
    `requires` (every algorithm when None) that run on one of `systems` (every system when None: a target added
    later, diloco_chaos/harness/targets/, gets it too). Its module docstring's first paragraph (after "Invariant
    `name`:") is the summary. The function is returned unchanged."""

    def deco(fn: Callable[..., InvariantResult]) -> Callable[..., InvariantResult]:
        name = fn.__name__
        if name in _REGISTRY and _REGISTRY[name].fn.__module__ != fn.__module__:
            raise ValueError(f"invariant {name!r} registered twice ({_REGISTRY[name].fn.__module__}, {fn.__module__})")
        summary = _summary(fn)
        _REGISTRY[name] = InvariantSpec(name, fn, bounds, requires, systems, mode, order, summary)
        return fn

    return deco


def _summary(fn: Callable[..., Any]) -> str:
    """One line: the first paragraph of the function's module docstring, else of its own."""
    mod = sys.modules.get(fn.__module__)
    doc = (mod.__doc__ if mod is not None and mod.__doc__ else None) or fn.__doc__ or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    prefix = f"Invariant `{fn.__name__}`: "
    return first[len(prefix):] if first.startswith(prefix) else first


def discover() -> dict[str, InvariantSpec]:
    """Import every module of diloco_chaos.harness.invariants.checks and of its sub-packages (each registers its
    invariant); the registry, in order."""
    from diloco_chaos.harness.invariants import checks

    for info in pkgutil.walk_packages(checks.__path__, f"{checks.__name__}."):
        if not info.name.rpartition(".")[2].startswith("_"):
            importlib.import_module(info.name)
    return specs()


def specs() -> dict[str, InvariantSpec]:
    """Name -> spec, in check_all's order."""
    return {s.name: s for s in sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))}


def spec(name: str) -> InvariantSpec:
    """The spec of invariant `name`; ValueError naming the known ones (and a close match) otherwise."""
    specs = discover()
    if name not in specs:
        close = difflib.get_close_matches(name, list(specs), n=1)
        raise ValueError(f"unknown invariant {name!r}: one of {', '.join(specs)}"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    return specs[name]
