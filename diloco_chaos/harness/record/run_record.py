"""A run directory's events, read and parsed once: records in time order with typed look-ups, for every reader.

Why: the metrics, the invariants, both reports, replay and progress all read the same log. Parsing it once into
records (`RunLog.load`) means each reader gets typed attributes and no reader re-reads or re-guesses dict keys.

Reading old runs: a run directory written before a field or kind entered the schema (no `schema_version` on its
`run_start`, fields missing, fields since renamed) must still load where it did before, so loading is lenient
by default (`parse_lenient`): a missing field whose type admits null is filled with null, an optional field with
its default; a field the record does not name is dropped; a line that still cannot make its record (an unknown
kind, a missing required field that cannot be null, a mistyped value, a line that is not a JSON object) is left
out. Each of these is listed in `RunLog.problems` (line, kind, field, what), so a reader can say what it could
not read instead of failing on a run it used to summarise. `RunLog.load(dir, strict=True)` parses with
`parse` instead and raises `EventSchemaError` on the first such line: the tests' and new runs' mode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from diloco_chaos.harness.record.base import (
    REGISTRY,
    Event,
    EventSchemaError,
    _Mismatch,
    checkers,
    iter_lines,
    parse,
    required,
)
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.record.run import RunStart

R = TypeVar("R", bound=Event)


@dataclass(frozen=True)
class Problem:
    """Something a lenient parse could not read as the schema says: filled in, dropped, or a line left out."""

    line: int | None
    """Line number in events.jsonl (1-based), None for an event not read from a file."""
    kind: str | None
    """The event's kind (`ev`), None when it had none."""
    field: str | None
    """The field concerned, None when the whole line is concerned."""
    what: str
    """What happened: 'filled with null', 'filled with default', 'unknown field dropped', or why the line was
    left out."""
    skipped: bool
    """True when the whole line was left out (no record made)."""


def _nullable(cls: type[Event], name: str) -> bool:
    try:
        checkers(cls)[name](None)
    except _Mismatch:
        return False
    return True


def parse_lenient(raw: Mapping[str, Any], line: int | None = None) -> tuple[Event | None, list[Problem]]:
    """One decoded event of a possibly older run -> its record (or None) and what could not be read strictly
    (see the module docstring). A line that `parse` accepts yields the same record and no problems."""
    kind = raw.get("ev")
    if not isinstance(kind, str):
        return None, [Problem(line, None, "ev", "no 'ev' field naming its kind", True)]
    cls = REGISTRY.get(kind)
    if cls is None:
        return None, [Problem(line, kind, None, "unknown event kind", True)]
    check = checkers(cls)
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for name, value in raw.items():
        f = check.get(name)
        if f is None:
            problems.append(Problem(line, kind, name, "unknown field dropped", False))
            continue
        try:
            values[name] = f(value)
        except _Mismatch as e:
            return None, [*problems, Problem(line, kind, name, str(e), True)]
    req = required(cls)
    for fl in fields(cls):
        if fl.name in values:
            continue
        if fl.name not in req:
            problems.append(Problem(line, kind, fl.name, "filled with default", False))
            values[fl.name] = fl.default if fl.default is not MISSING else fl.default_factory()  # type: ignore[misc,operator]
        elif _nullable(cls, fl.name):
            problems.append(Problem(line, kind, fl.name, "filled with null", False))
            values[fl.name] = None
        else:
            return None, [*problems, Problem(line, kind, fl.name, "required field missing", True)]
    # a filled-in default is what a strict parse gives too: report only what differs from strict parsing
    return cls(**values), [p for p in problems if p.what != "filled with default"]


@dataclass(frozen=True)
class RunLog:
    """A run's events as records, sorted by time (`t`; a stable sort keeps each process's own order), with typed
    look-ups by record class and what a lenient load could not read."""

    records: list[Event]
    """Every record, in time order."""
    problems: list[Problem] = field(default_factory=list)
    """What a lenient load filled in, dropped or left out (empty for a strict load, or a current run)."""
    lines: list[dict[str, Any]] = field(default_factory=list)
    """The decoded lines, in file order, as written: only when loaded with `keep_lines` (a suite's raw view)."""

    @classmethod
    def from_records(cls, records: Iterable[Event], problems: Iterable[Problem] = (),
                     lines: Iterable[dict[str, Any]] = ()) -> RunLog:
        return cls(sorted(records, key=lambda r: r.t), list(problems), list(lines))

    def extended(self, written: Iterable[str]) -> RunLog:
        """This log with the lines appended to its file since it was loaded (the supervisor's post-run events, as
        `EventLog.write` returned them): what loading the file again would give, without reading it again."""
        new = [json.loads(text) for text in written]
        more = RunLog.from_dicts(new)
        lines = [*self.lines, *new] if self.lines else []
        return RunLog.from_records([*self.records, *more.records], [*self.problems, *more.problems], lines)

    @classmethod
    def from_dicts(cls, evs: Iterable[Mapping[str, Any]], strict: bool = False) -> RunLog:
        """Records of decoded events (a live tail, a test's events), parsed as `load` parses lines."""
        records: list[Event] = []
        problems: list[Problem] = []
        for e in evs:
            if strict:
                records.append(parse(e))
                continue
            rec, probs = parse_lenient(e)
            problems += probs
            if rec is not None:
                records.append(rec)
        return cls.from_records(records, problems)

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str], strict: bool = False, keep_lines: bool = False) -> RunLog:
        """A run directory's events.jsonl (or the file itself), parsed once. A torn last line (a killed writer)
        is skipped; other unreadable lines are problems (lenient) or raise EventSchemaError (strict).
        `keep_lines`: keep the decoded JSON objects too (`lines`)."""
        path = Path(run_dir)
        if path.is_dir():
            path = path / EVENTS_FILE
        records: list[Event] = []
        problems: list[Problem] = []
        lines: list[dict[str, Any]] = []
        for n, obj in iter_lines(path):
            if keep_lines and not isinstance(obj, str):
                lines.append(obj)
            if isinstance(obj, str):
                if strict:
                    raise EventSchemaError(obj, line=n)
                problems.append(Problem(n, None, None, obj, True))
                continue
            if strict:
                records.append(parse(obj, line=n))
                continue
            rec, probs = parse_lenient(obj, line=n)
            problems += probs
            if rec is not None:
                records.append(rec)
        return cls.from_records(records, problems, lines)

    def of(self, kind: type[R]) -> list[R]:
        """Every record of one kind, in time order (typed: `log.of(Step)` is a list[Step])."""
        return [r for r in self.records if type(r) is kind]  # type: ignore[misc]

    def of_any(self, *kinds: type[Event]) -> list[Event]:
        """Every record of any of these kinds, in time order."""
        return [r for r in self.records if type(r) in kinds]

    def first(self, kind: type[R]) -> R | None:
        """The earliest record of one kind, or None."""
        return next((r for r in self.records if type(r) is kind), None)  # type: ignore[misc]

    def last(self, kind: type[R]) -> R | None:
        """The latest record of one kind, or None."""
        return next((r for r in reversed(self.records) if type(r) is kind), None)  # type: ignore[misc]

    def count(self, kind: type[Event]) -> int:
        return sum(1 for r in self.records if type(r) is kind)

    @property
    def start(self) -> float:
        """`t` of run_start, else of the earliest record, else 0."""
        rs = self.first(RunStart)
        return rs.t if rs is not None else (self.records[0].t if self.records else 0.0)
