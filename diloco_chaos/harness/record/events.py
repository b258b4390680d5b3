"""The run's append-only JSONL event log, shared by every process of a run.

Each process opens the same file with O_APPEND and writes each event as one
line with a single write() call, so lines from concurrent processes never
interleave. Every event carries `t` (CLOCK_MONOTONIC, comparable across the
processes of one machine), `wall` (epoch seconds), `pid`, `proc` (who wrote
it, e.g. "learner2.chip0") and `ev` (the kind). The metrics and the report are
computed from this file alone, so any recorded run can be re-analysed.

Its schema is diloco_chaos/harness/record (docs/events.md). With DILOCO_CHAOS_STRICT_EVENTS=1 (set by the tests) every
event is also parsed into its record as it is written, so an emitter that drifts from the schema fails where it writes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from diloco_chaos.harness.record.base import BASE_FIELDS, Event, EventSchemaError, required

EVENTS_FILE = "events.jsonl"
STRICT_ENV = "DILOCO_CHAOS_STRICT_EVENTS"
"""Set to 1: `EventLog` checks each event against its record (diloco_chaos/harness/record) and raises
EventSchemaError on a mismatch, before writing it."""


class EventLog:
    """Writer side: `write(record)` appends one line. Safe across threads and processes.

    The public ways to write are `write` (a typed record: a misspelled field is a type error at the call site) and
    `named` (the chaos layer's `on_event` callback, which cannot import the records: the kind's record is built
    here, so an unknown field still fails where it is written). Both end in `_append`, the one place a line is
    encoded and written."""

    def __init__(self, path: str | os.PathLike[str], proc: str, strict: bool | None = None) -> None:
        """`strict`: check each event against its record before writing it (None: when STRICT_ENV is 1)."""
        self.path = str(path)
        self.proc = proc
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._check: Callable[[dict[str, Any]], object] | None = None
        if strict if strict is not None else os.environ.get(STRICT_ENV) == "1":
            from diloco_chaos.harness.record import parse  # only here: the schema imports the trainers' enums

            self._check = parse

    def write(self, rec: Event) -> None:
        """Append one typed record; the header (`t`, `wall`, `pid`, `proc`, `ev`) is this writer's, whatever `rec`
        holds in it. The way every event is written: a field the record lacks is a type error at the call site."""
        self._append(rec.EV, _body(rec))

    def write_all(self, recs: list[Event]) -> None:
        """Append several typed records with one os.write: a process killed while writing them leaves all of them
        or none, never a record without the one that completes it (a push and the reason it was superseded)."""
        self._append_many([(rec.EV, _body(rec)) for rec in recs])

    def write_line(self, rec: Event) -> str:
        """`write`, returning the line written (JSON, without its newline) as a reader of the file will read it: the
        post-run phase keeps what it wrote without reading the file again (diloco_chaos/harness/run/finish.py)."""
        return self._append(rec.EV, _body(rec))

    def named(self, kind: str, /, **fields: Any) -> None:
        """Write the event `kind` from keyword fields: the `on_event` callback of the chaos layer
        (diloco_chaos/chaos/links.py LinkChaos, diloco_chaos/chaos/processes.py ProcessChaos), which cannot import
        the records (dependencies point one way). The kind's registered record is built from `fields`, so an
        unknown kind, an unknown field or a missing required one raises EventSchemaError naming it, in strict mode
        or not."""
        self.write(record_of(kind, fields))

    def _append(self, kind: str, fields: dict[str, Any]) -> str:
        """Encode one event and write it with a single os.write on the O_APPEND descriptor (lines from concurrent
        processes never interleave); in strict mode parse it into its record first."""
        return self._append_many([(kind, fields)])[0]

    def _append_many(self, events: list[tuple[str, dict[str, Any]]]) -> list[str]:
        """Encode the events in order and write them with a single os.write (see `_append`); their lines."""
        texts = []
        for kind, fields in events:
            rec = {"t": time.monotonic(), "wall": time.time(), "pid": os.getpid(), "proc": self.proc, "ev": kind}
            rec.update(fields)
            text = json.dumps(rec, separators=(",", ":"), default=_jsonable)
            if self._check is not None:
                self._check(json.loads(text))
            texts.append(text)
        data = "".join(text + "\n" for text in texts).encode()
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, data)
        return texts

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def record_of(kind: str, fields: Mapping[str, Any]) -> Event:
    """The registered record of `kind` holding `fields` (no header: the writer fills it). Raises EventSchemaError
    naming the kind and the field for an unknown kind, a field the record lacks (or a header field) or a missing
    required one; values are checked against their types only in strict mode, where the written line is parsed."""
    from diloco_chaos.harness.record import REGISTRY  # only here: the record modules fill it (they import trainers)

    cls = REGISTRY.get(kind)
    if cls is None:
        raise EventSchemaError("unknown event kind (not in diloco_chaos/harness/record; see docs/events.md)", kind)
    names = {f.name for f in dataclasses.fields(cls)} - set(BASE_FIELDS)
    for name in fields:
        if name not in names:
            raise EventSchemaError("unknown field (not in the record; see docs/events.md)", kind, name)
    for name in sorted(required(cls) - set(BASE_FIELDS)):
        if name not in fields:
            raise EventSchemaError("required field missing", kind, name)
    return cls(**fields)


def _body(rec: Event) -> dict[str, Any]:
    """The record's fields as written: an optional field left at its default None is left out (a reader fills it
    in again), so a line holds what its writer said and keeps the form raw readers of events.jsonl know."""
    return {f.name: v for f in dataclasses.fields(rec) if f.name not in BASE_FIELDS
            and not ((v := getattr(rec, f.name)) is None and f.default is None)}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, enum.Enum):
        return obj.value
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    return str(obj)


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """All complete events of a log, in file order. A torn last line (a killed writer) is skipped."""
    return list(iter_events(path))


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                return
            try:
                yield json.loads(raw)
            except json.JSONDecodeError:
                continue


class EventTail:
    """Reader that returns only the events appended since the last call (for live progress)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out = []
        for raw in lines:
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                continue
        return out
