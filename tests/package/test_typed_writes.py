"""Every event of a run is written through its typed record (diloco_chaos/harness/record/events.py `EventLog.write`),
so a misspelled field is a type error at the call site; the chaos layer, which cannot import the records, writes
through `EventLog.named`, which builds the kind's record and refuses a field it lacks, strict mode or not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco_chaos.harness.record import EventSchemaError, read_records
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.run import LinkFlap, ProcessFault

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path("diloco_chaos/harness/record/events.py")
FREE_FORM = re.compile(r"\.(_?log)\(\s*[\"']")
"""A free-form write by kind name: `events.log("kind", ...)` or the writer's internals `events._log("kind", ...)`
(one by a kind held in a variable is mypy's to refuse: EventLog has no `log`)."""


def free_form_writes(root: Path) -> list[str]:
    """file:line of every free-form event write in the package outside the writer itself."""
    found = []
    for path in sorted((root / "diloco_chaos").rglob("*.py")):
        rel = path.relative_to(root)
        if rel == WRITER:
            continue
        text = path.read_text()
        for m in FREE_FORM.finditer(text):  # the kind may be on the next line: `events.log(\n    "merge", ...)`
            n = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel}:{n}: {text.splitlines()[n - 1].strip()}")
    return found


def test_the_package_writes_no_event_by_kind_name() -> None:
    found = free_form_writes(ROOT)
    assert not found, "write a typed record, events.write(Record(...)), instead of:\n" + "\n".join(found)


def test_the_check_finds_a_free_form_write(tmp_path: Path) -> None:
    """The grep above can fail: a module with `events.log("kind", ...)` (and one with `._log(`) is named by line."""
    pkg = tmp_path / "diloco_chaos" / "harness"
    pkg.mkdir(parents=True)
    (pkg / "a.py").write_text('x = 1\nevents.log(\n    "step", learner=0)\nmath.log(2.0)\n')
    (pkg / "b.py").write_text("self.events._log('merge')\n")
    (tmp_path / WRITER).parent.mkdir(parents=True)
    (tmp_path / WRITER).write_text('self._log("exempt")\n')
    a, b = ((pkg / name).relative_to(tmp_path) for name in ("a.py", "b.py"))
    assert [f.split(": ")[0] for f in free_form_writes(tmp_path)] == [f"{a}:2", f"{b}:1"]


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "lenient"])
def test_named_refuses_a_misspelled_field_naming_it(tmp_path: Path, strict: bool) -> None:
    log = EventLog(tmp_path / EVENTS_FILE, "supervisor", strict=strict)
    try:
        with pytest.raises(EventSchemaError, match="event 'link_flap', field 'learnr': unknown field") as err:
            log.named("link_flap", learnr=1, down=True)
        assert (err.value.kind, err.value.field) == ("link_flap", "learnr")
        with pytest.raises(EventSchemaError, match="event 'link_flap', field 'down': required field missing"):
            log.named("link_flap", learner=1)
        with pytest.raises(EventSchemaError, match="event 'link_flapp'"):
            log.named("link_flapp", learner=1, down=True)
        with pytest.raises(EventSchemaError, match="field 'proc': unknown field"):  # the header is the writer's
            log.named("link_flap", learner=1, down=True, proc="someone")
        log.named("link_flap", learner=1, down=True)
        log.named("process_fault", kind="kill", learner=None, pids=[7], signal="SIGKILL")
    finally:
        log.close()
    flap, fault = read_records(tmp_path / EVENTS_FILE)  # nothing refused reached the file
    assert isinstance(flap, LinkFlap) and (flap.learner, flap.down, flap.proc) == (1, True, "supervisor")
    assert isinstance(fault, ProcessFault) and fault.pids == [7] and fault.speed is None


def test_write_all_puts_its_records_in_one_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A push and the reason it was superseded go out together (diloco_chaos/harness/syncer/decoupled.py): one
    os.write, so a syncer SIGKILLed between them cannot leave the push without its reason (updates_accounted
    then reported it lost: a CI run of tests/trainers/test_fault_path_mutations.py, 2026-12-07)."""
    import os

    writes: list[bytes] = []
    real = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: writes.append(bytes(data)) or real(fd, data))
    log = EventLog(tmp_path / EVENTS_FILE, "syncer", strict=True)
    try:
        log.write_all([LinkFlap(learner=0, down=True), LinkFlap(learner=0, down=False)])
        log.write(LinkFlap(learner=1, down=True))
    finally:
        log.close()
    assert len(writes) == 2 and writes[0].count(b"\n") == 2, writes
    assert [(r.learner, r.down) for r in read_records(tmp_path / EVENTS_FILE)] == [(0, True), (0, False), (1, True)]
