"""Typed event records: the run directory's events.jsonl as one frozen dataclass per event kind.

Every process of a run appends JSON lines through diloco_chaos/harness/record/events.py `EventLog.write(record)`
(the chaos layer, which cannot import this package, through `EventLog.named(kind, **fields)`); this package is the
schema of those lines. `parse(dict)` turns one decoded line into its record (checking that every
required field is present and typed, rejecting unknown kinds and fields with `EventSchemaError`), `read_records(path)`
reads a whole log strictly, in file order. `RunLog.load(run_dir)`
(run_record) is what the run's readers use: the log read and parsed once, records sorted by time. It is lenient
by default so that run directories written by older versions still load: a missing nullable field is filled
with null, a missing optional one with its default, an unknown field is dropped, and a line that still cannot
make its record (unknown kind, missing required field, mistyped value) is left out; each is listed in
`RunLog.problems`. `RunLog.load(run_dir, strict=True)` raises EventSchemaError instead. docs/events.md, generated from
these classes by `python -m diloco_chaos.harness.record.doc`, is the stable contract for users' own tools;
SCHEMA_VERSION (carried by `run_start`) says which version of it a run directory was written with.

Modules: base (the common fields, registry, parse), run (supervisor and fault events), learner (chip and link
process events), syncer (syncer events), elastic (elastic_ddp's torchrun engine), torchft (the torchft target's
events), run_record (RunLog, parse_lenient).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from diloco_chaos.harness.record import elastic, learner, run, syncer, torchft
from diloco_chaos.harness.record.base import REGISTRY, SCHEMA_VERSION, Event, EventSchemaError, iter_lines, parse
from diloco_chaos.harness.record.run_record import Problem, RunLog, parse_lenient

__all__ = ["REGISTRY", "SCHEMA_VERSION", "Event", "EventSchemaError", "Problem", "RunLog", "elastic", "learner",
           "parse", "parse_lenient", "read_records", "run", "syncer", "torchft"]


def iter_records(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Each complete line of an events.jsonl, parsed, in file order. A torn last line (a killed writer) is
    skipped; any other line that is not JSON or not a valid event raises EventSchemaError naming its line."""
    for n, obj in iter_lines(path):
        if isinstance(obj, str):
            raise EventSchemaError(obj, line=n)
        yield parse(obj, line=n)


def read_records(path: str | os.PathLike[str]) -> list[Event]:
    """All events of a log as records, in file order (see iter_records); `RunLog.load` sorts them by time."""
    return list(iter_records(path))
