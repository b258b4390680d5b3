"""The base of the typed event records: the fields every event carries, the registry kind -> record class, and
`parse`, which turns one decoded events.jsonl line into its record or raises `EventSchemaError`.

Why: events are written as keyword arguments by many processes and read back by the metrics, the invariants,
both reports, replay and progress. A record class per kind is the one place that says what each kind holds, so
a reader gets typed attributes instead of guessing dict keys, and an emitter that drifts (a renamed, missing or
retyped field) fails loudly at parse time instead of silently yielding None downstream.

Unknown fields are rejected, not kept in an `extra` mapping: a field the schema does not name is either emitter
drift (a rename, a new field nobody documented) or a typo, and catching exactly that is the point of a schema.
A new field is added to its record class (and so to docs/events.md) in the same change that starts writing it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

SCHEMA_VERSION = 1
"""Version of the run-directory event schema (docs/events.md). Bumped when a field is removed, renamed or
retyped, or its meaning changes; adding a kind or an optional field keeps it. The supervisor's `run_start`
event carries it as `schema_version`."""

BASE_FIELDS = ("t", "wall", "pid", "proc", "ev")


class EventSchemaError(ValueError):
    """An event that does not match its record: names the kind, the field and (when read from a file) the line."""

    def __init__(self, message: str, kind: str | None = None, field: str | None = None,
                 line: int | None = None) -> None:
        where = f"line {line}: " if line is not None else ""
        what = [f"event {kind!r}"] if kind is not None else []
        what += [f"field {field!r}"] if field is not None else []
        super().__init__(where + (", ".join(what) + ": " if what else "") + message)
        self.kind, self.field, self.line = kind, field, line


@dataclass(frozen=True, kw_only=True)
class Event:
    """Fields every event carries, filled in by the writer (diloco_chaos/harness/record/events.py `EventLog.write`):
    a write site constructs the record of its kind without them (`events.write(ChipStart(learner=m, ...))`), so a
    misspelled or missing field is a type error there. On reading, every one of them is required."""

    EV: ClassVar[str] = ""
    """The kind this class records (the `ev` field); set by `@event`."""
    EMITTER: ClassVar[str] = ""
    """Which process (and module) writes it; set by `@event`."""

    t: float = 0.0
    """CLOCK_MONOTONIC seconds when written: comparable across the processes of one machine (one run)."""
    wall: float = 0.0
    """Epoch seconds when written."""
    pid: int = 0
    """Process id of the writer."""
    proc: str = ""
    """Who wrote it: `supervisor`, `syncer` (`syncer.s<k>`: shard k of a sharded synchronizer, syncer.shards > 1),
    `learner<m>.chip<r>` or `learner<m>.link`."""
    ev: str = ""
    """The event's kind: the registry key of its record class."""


E = TypeVar("E", bound=type[Event])
REGISTRY: dict[str, type[Event]] = {}
"""kind -> record class, filled by `@event` as the record modules are imported."""


def event(kind: str, emitter: str) -> Callable[[E], E]:
    """Class decorator: register a record class for `kind`, written by `emitter`."""

    def register(cls: E) -> E:
        if kind in REGISTRY:
            raise ValueError(f"event kind {kind!r} registered twice ({REGISTRY[kind].__name__}, {cls.__name__})")
        cls.EV, cls.EMITTER = kind, emitter
        REGISTRY[kind] = cls
        return cls

    return register


# -- type checking ------------------------------------------------------------------------------------------
_HINTS: dict[type[Event], dict[str, Any]] = {}
_REQUIRED: dict[type[Event], frozenset[str]] = {}


def hints(cls: type[Event]) -> dict[str, Any]:
    """The resolved field types of a record class (cached)."""
    h = _HINTS.get(cls)
    if h is None:
        names = {f.name for f in dataclasses.fields(cls)}
        h = {k: v for k, v in typing.get_type_hints(cls).items() if k in names}
        _HINTS[cls] = h
        _REQUIRED[cls] = frozenset(f.name for f in dataclasses.fields(cls) if f.name in BASE_FIELDS or (
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING))
    return h


def required(cls: type[Event]) -> frozenset[str]:
    hints(cls)
    return _REQUIRED[cls]


class _Mismatch(Exception):
    pass


Checker = Callable[[Any], Any]
_CHECKERS: dict[type[Event], dict[str, Checker]] = {}


def checkers(cls: type[Event]) -> dict[str, Checker]:
    """Field name -> its compiled checker, per record class (cached: parse is on the strict write path)."""
    c = _CHECKERS.get(cls)
    if c is None:
        c = _CHECKERS[cls] = {name: compile_type(tp) for name, tp in hints(cls).items()}
    return c


def compile_type(tp: Any) -> Checker:
    """A function that checks a decoded JSON value against `tp` and returns it (enums as members), or raises
    _Mismatch."""
    if tp is Any:
        return lambda v: v
    origin = typing.get_origin(tp)
    name = type_name(tp)

    def fail(v: Any) -> typing.NoReturn:
        raise _Mismatch(f"expected {name}, got {_got(v)}")

    if origin in (typing.Union, types.UnionType):
        arms = [compile_type(a) for a in typing.get_args(tp)]

        def union(v: Any) -> Any:
            for arm in arms:
                try:
                    return arm(v)
                except _Mismatch:
                    continue
            fail(v)
        return union
    if origin is Literal:
        allowed = typing.get_args(tp)

        def literal(v: Any) -> Any:
            if isinstance(v, str | int) and v in allowed:
                return v
            raise _Mismatch(f"expected one of {list(allowed)}, got {v!r}")
        return literal
    if origin is list:
        item = compile_type(typing.get_args(tp)[0])

        def list_(v: Any) -> Any:
            return [item(x) for x in v] if isinstance(v, list) else fail(v)
        return list_
    if origin is dict:
        val = compile_type(typing.get_args(tp)[1])

        def dict_(v: Any) -> Any:
            return {k: val(x) for k, x in v.items()} if isinstance(v, dict) else fail(v)
        return dict_
    if tp is type(None):
        return lambda v: None if v is None else fail(v)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = {m.value: m for m in tp}

        def enum_(v: Any) -> Any:
            try:
                return members[v]
            except (KeyError, TypeError):
                raise _Mismatch(f"expected one of {list(members)}, got {v!r}") from None
        return enum_
    if tp is float:
        return lambda v: v if (type(v) is float or type(v) is int) else fail(v)
    if tp is int:
        return lambda v: v if type(v) is int else fail(v)
    if tp is str:
        return lambda v: v if type(v) is str else fail(v)
    if tp is bool:
        return lambda v: v if type(v) is bool else fail(v)
    raise TypeError(f"no checker for field type {tp!r}")


def _got(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def type_name(tp: Any) -> str:
    """A type as docs/events.md writes it."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is Literal:
        return " | ".join(repr(a).replace("'", '"') for a in typing.get_args(tp))
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"map[{type_name(k)}, {type_name(v)}]"
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in tp)
    return {float: "number", int: "int", str: "string", bool: "bool"}.get(tp, getattr(tp, "__name__", str(tp)))


def parse(raw: Mapping[str, Any], line: int | None = None) -> Event:
    """One decoded event -> its record. Every required field must be present and every field typed as its
    record says; an unknown kind or an unknown field raises `EventSchemaError` naming it (and `line`)."""
    kind = raw.get("ev")
    if not isinstance(kind, str):
        raise EventSchemaError("no 'ev' field naming its kind", field="ev", line=line)
    cls = REGISTRY.get(kind)
    if cls is None:
        raise EventSchemaError("unknown event kind (not in diloco_chaos/harness/record; see docs/events.md)", kind,
                               line=line)
    check = checkers(cls)
    for name in required(cls):
        if name not in raw:
            raise EventSchemaError("required field missing", kind, name, line)
    values: dict[str, Any] = {}
    for name, value in raw.items():
        f = check.get(name)
        if f is None:
            raise EventSchemaError("unknown field (not in the record; see docs/events.md)", kind, name, line)
        try:
            values[name] = f(value)
        except _Mismatch as e:
            raise EventSchemaError(str(e), kind, name, line) from None
    return cls(**values)


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """Each complete line of an events.jsonl: (line number, the decoded object) or (line number, why it is not
    one: not JSON, not a JSON object). A torn last line (a killed writer) ends the iteration."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if not raw.endswith(b"\n"):
                return
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                yield n, f"not JSON: {e}"
                continue
            yield n, obj if isinstance(obj, dict) else f"not a JSON object: {type(obj).__name__}"
