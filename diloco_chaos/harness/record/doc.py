"""Generate docs/events.md from the record classes: ``python -m diloco_chaos.harness.record.doc [--check]``.

Why: the event schema is the run directory's stable contract for users' own tools, so its documentation is read
from the dataclasses themselves (field names, types, defaults and the docstring under each field) and cannot drift
from the code; tests/invariants/test_event_records.py asserts the committed file equals this output.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import logging
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from diloco_chaos.chaos import faults
from diloco_chaos.harness.record import REGISTRY, SCHEMA_VERSION
from diloco_chaos.harness.record.base import Event, hints, required, type_name

DOC = Path(__file__).resolve().parents[3] / "docs" / "events.md"
log = logging.getLogger(__name__)


KIND_LISTS: dict[str, Callable[[], tuple[str, ...]]] = {
    "{fault_kinds}": faults.names,
    "{link_fault_kinds}": lambda: faults.names(lambda k: k.target == "link"),
    "{process_fault_kinds}": lambda: faults.names(lambda k: k.target != "link"),
}
"""Placeholders a field's docstring may hold for a list of fault kinds, filled from the fault registry
(diloco_chaos/chaos/faults/) so the documentation lists every registered kind and never a stale hand-written
subset."""


def _fill(text: str) -> str:
    for token, kinds in KIND_LISTS.items():
        if token in text:
            text = text.replace(token, ", ".join(kinds()))
    return text


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of `cls` and its bases (the nearest class wins), with any
    `KIND_LISTS` placeholder filled."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in zip(body, body[1:], strict=False):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                out[a.target.id] = _fill(" ".join(b.value.value.split()))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render() -> str:
    """The whole of docs/events.md."""
    base = field_docs(Event)
    lines = [
        "# Events (events.jsonl schema)",
        "",
        "Generated from the record classes (`diloco_chaos/harness/record/`) by "
        "`python -m diloco_chaos.harness.record.doc`; do not edit by",
        f"hand. Schema version: **{SCHEMA_VERSION}** (the supervisor's `run_start` event carries it as",
        "`schema_version`).",
        "",
        "This is the stable contract of a run directory for your own tools. Every process of a run appends one",
        "JSON object per line to `events.jsonl`; each has the common fields below plus the fields of its kind.",
        "A field marked *optional* may be absent (its value is then `null` in the record). Readers in Python",
        "use `diloco_chaos.harness.record.read_records(path)`, which returns one frozen dataclass per line and raises",
        "`EventSchemaError` (naming the line, kind and field) on a missing, mistyped or unknown field: fields",
        "not listed here are rejected, so a writer cannot drift from this document unnoticed. The version is",
        "bumped when a field is removed, renamed or retyped, or its meaning changes; adding a kind or an",
        "optional field keeps it.",
        "",
        "Reading older run directories: `diloco_chaos.harness.record.RunLog.load(run_dir)`, "
        "which the harness's own readers",
        "(metrics, reports, invariants, replay) use, parses leniently so that a run written before a field or",
        "kind entered this schema still loads: a missing field whose type admits `null` is filled with `null`, a",
        "missing *optional* field with its default, a field not listed here is dropped, and a line that still",
        "cannot make its record (an unknown kind, a missing required field that cannot be `null`, a mistyped",
        "value) is left out. Each of these is listed in `RunLog.problems` (line, kind, field, what). Pass",
        "`strict=True` (or use `read_records`) to reject such lines instead.",
        "",
        "## Common fields",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    bh = hints(Event)
    for name in ("t", "wall", "pid", "proc", "ev"):
        lines.append(f"| `{name}` | {_cell(type_name(bh[name]))} | {_cell(base[name])} |")
    lines += ["", "## Kinds", "", ", ".join(f"[`{k}`](#{k})" for k in sorted(REGISTRY)), ""]
    for kind in sorted(REGISTRY):
        cls = REGISTRY[kind]
        docs, h, req = field_docs(cls), hints(cls), required(cls)
        lines += [f"### {kind}", "", " ".join((cls.__doc__ or "").split()), "",
                  f"Written by: {cls.EMITTER}. Record: `{cls.__module__}.{cls.__name__}`.", ""]
        own = [f for f in dataclasses.fields(cls) if f.name not in bh]
        if not own:
            lines += ["No fields besides the common ones.", ""]
            continue
        lines += ["| field | type | meaning |", "|---|---|---|"]
        for f in own:
            opt = "" if f.name in req else " *optional*"
            lines.append(f"| `{f.name}` | {_cell(type_name(h[f.name]))}{opt} | {_cell(docs.get(f.name, ''))} |")
        lines.append("")
    return "\n".join(lines)


def write_or_check(doc: Path, text: str, regenerate: str, description: str, argv: list[str] | None) -> int:
    """The command line of a generated doc (this one, docs/scenario.md's): write `text` to `doc`, or with
    --check exit 1 naming `regenerate` when the committed doc differs, writing nothing."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed doc differs, write nothing")
    args = ap.parse_args(argv)
    if args.check:
        same = doc.exists() and doc.read_text() == text
        if not same:
            log.error("%s is out of date: run %s", doc, regenerate)
        return 0 if same else 1
    doc.write_text(text)
    log.info("wrote %s", doc)
    return 0


def main(argv: list[str] | None = None) -> int:
    return write_or_check(DOC, render(), "python -m diloco_chaos.harness.record.doc", __doc__ or "", argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
