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
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from diloco_chaos.harness.record.base import BASE_FIELDS, Event

EVENTS_FILE = "events.jsonl"
STRICT_ENV = "DILOCO_CHAOS_STRICT_EVENTS"
"""Set to 1: `EventLog.log` checks each event against its record (diloco_chaos/harness/record) and raises
EventSchemaError on a mismatch, before writing it."""


class EventLog:
    """Writer side: `log(kind, **fields)` appends one line. Safe across threads and processes."""

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
        self.log(rec.EV, **_body(rec))

    def write_line(self, rec: Event) -> str:
        """`write`, returning the line written (JSON, without its newline) as a reader of the file will read it: the
        post-run phase keeps what it wrote without reading the file again (diloco_chaos/harness/run/finish.py)."""
        return self._append(rec.EV, _body(rec))

    def log(self, kind: str, /, **fields: Any) -> None:
        self._append(kind, fields)

    def _append(self, kind: str, fields: dict[str, Any]) -> str:
        rec = {"t": time.monotonic(), "wall": time.time(), "pid": os.getpid(), "proc": self.proc, "ev": kind}
        rec.update(fields)
        text = json.dumps(rec, separators=(",", ":"), default=_jsonable)
        if self._check is not None:
            self._check(json.loads(text))
        line = (text + "\n").encode()
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line)
        return text

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _body(rec: Event) -> dict[str, Any]:
    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name not in BASE_FIELDS}


def _jsonable(obj: Any) -> Any:
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
