"""The toxic interface of the embedded Toxiproxy server and its registry.

Why: like Toxiproxy's ``toxics`` package, each toxic is one small module under ``toxics/``
that declares its attributes and implements how a chunk passes through it, then registers
itself by name; the API validates attributes from the declaration and the link calls the
hooks, so adding a toxic touches one file (modules are discovered with ``pkgutil``).

A toxic class holds no per-connection state: the link passes it the ``_ToxicState`` of the
toxic on that link (counters, timer) and the link itself (to sleep, forward or close).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from .common import ApiError, _get_int, _type_error

if TYPE_CHECKING:
    from .link import _Link, _ToxicState

#: Go type of an attribute; it fixes JSON decoding and the error texts clients see.
GoType = Literal["int64", "int", "float64"]


@dataclass(frozen=True)
class Attr:
    """One toxic attribute as the toxic's Go struct would declare it."""

    #: JSON key (matched case-insensitively, as Go does).
    name: str
    #: Go type: ``int``/``int64`` accept JSON integers in the 64-bit range, ``float64`` numbers.
    gotype: GoType
    #: What the attribute means, with its unit.
    doc: str
    #: Inclusive range beyond the Go type's own; ``None`` means unbounded (upstream toxics).
    low: float | None = None
    high: float | None = None

    def parse(self, folded: dict[str, Any], current: float, where: str) -> float:
        """Decode this attribute from a key-folded JSON object, or raise a 400 ``ApiError``."""
        if self.gotype == "float64":
            value = folded.get(self.name)
            if value is None:
                return current
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _type_error(value, f"{where}.{self.name}", "float64")
            parsed: float = float(value)
        else:
            parsed = _get_int(folded, self.name, int(current), where, self.gotype)
        if (self.low is not None and parsed < self.low) or (self.high is not None and parsed > self.high):
            raise ApiError(f"attribute {self.name} must be in [{self.low}, {self.high}], got {parsed}", 400)
        return parsed


class Toxic:
    """Base of every toxic: the declaration plus the per-chunk and end-of-stream hooks."""

    #: Name of the Go struct, used in JSON type-error messages.
    struct: ClassVar[str] = ""
    #: Attributes in the Go struct's order.
    attrs: ClassVar[tuple[Attr, ...]] = ()

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        """Take one chunk (read at loop time ``stamp``) and hand what results to ``link.emit``."""
        await link.emit(data, stamp, state.toxic.seq)

    async def close(self, link: _Link, state: _ToxicState) -> bool:
        """The source reached EOF (or a toxic closed it); return ``False`` to stop propagating."""
        return True

    def attached(self, link: _Link, state: _ToxicState) -> None:
        """The toxic joined the link or was updated on it (toxicity already rolled)."""

    def detached(self, link: _Link, state: _ToxicState) -> None:
        """The toxic left the link."""


#: Registered toxics by API type name.
TOXICS: dict[str, Toxic] = {}


def register(name: str) -> Callable[[type[Toxic]], type[Toxic]]:
    """Class decorator that registers a toxic under its API type name."""

    def wrap(cls: type[Toxic]) -> type[Toxic]:
        if name in TOXICS:
            raise ValueError(f"toxic {name!r} registered twice")
        TOXICS[name] = cls()
        return cls

    return wrap


def load_toxics() -> dict[str, Toxic]:
    """Import every module of the ``toxics`` package (each registers itself) once."""
    from . import toxics

    for info in pkgutil.iter_modules(toxics.__path__):
        importlib.import_module(f"{toxics.__name__}.{info.name}")
    return TOXICS


def parse_attributes(toxic_type: str, raw: dict[str, Any] | None, current: dict[str, float]) -> dict[str, float]:
    """Validate given attributes against the declaration (unknown keys ignored, as in Go)."""
    if raw is None:
        return {}
    folded = {key.lower(): value for key, value in raw.items()}
    toxic = TOXICS[toxic_type]
    where = f"{toxic.struct}.attributes"
    return {
        attr.name: attr.parse(folded, current.get(attr.name, 0), where) for attr in toxic.attrs if attr.name in folded
    }


def default_attributes(toxic_type: str) -> dict[str, float]:
    """Every declared attribute at Go's zero value (``0`` for ints, ``0.0`` for floats)."""
    return {attr.name: (0.0 if attr.gotype == "float64" else 0) for attr in TOXICS[toxic_type].attrs}


__all__ = ["TOXICS", "Attr", "Toxic", "default_attributes", "load_toxics", "parse_attributes", "register"]
