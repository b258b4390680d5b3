"""The typed event records (diloco_chaos/harness/record): parse checks every field of every kind, every emitter in the
code writes only kinds and fields the schema names, docs/events.md is generated from the records, and real runs
(decoupled with a chip kill under restart and a freeze; ddp) write only lines that parse into their records."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny

from diloco_chaos.harness.record import REGISTRY, SCHEMA_VERSION, EventSchemaError, RunLog, parse, read_records
from diloco_chaos.harness.record.doc import DOC, field_docs, render
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.run import RunStart
from diloco_chaos.harness.record.syncer import Push, PushSuperseded
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.trainers.syncers.decoupled_records import PushOutcome, SupersededCause

ROOT = Path(__file__).resolve().parents[2]
BASE = {"t": 1.5, "wall": 1e9, "pid": 42, "proc": "learner0.chip0"}
STEP = {**BASE, "ev": "step", "learner": 0, "step": 3, "loss": 2.5, "tokens": 512, "chips": 2, "compute_s": 0.01,
        "sync_s": 0.002}
PUSH = {**BASE, "proc": "syncer", "ev": "push", "learner": 1, "fragment": 2, "round": 4, "c_steps": 4,
        "c_tokens": 1024, "first_step": 1, "last_step": 4, "base_version": 0, "outcome": "accepted", "final": False,
        "joined": 4}


def test_parse_returns_the_typed_record_with_enums() -> None:
    step = parse(STEP)
    assert isinstance(step, Step) and step.loss == 2.5 and step.cpu_s is None
    push = parse(PUSH)
    assert isinstance(push, Push) and push.outcome is PushOutcome.ACCEPTED
    sup = parse({**BASE, "ev": "push_superseded", "learner": 1, "fragment": 0, "reason": "newer push",
                 "cause": "newer", "first_step": 1, "last_step": 4})
    assert isinstance(sup, PushSuperseded) and sup.cause is SupersededCause.NEWER


@pytest.mark.parametrize(("raw", "kind", "field", "says"), [
    ({k: v for k, v in STEP.items() if k != "loss"}, "step", "loss", "required field missing"),
    ({**STEP, "step": "3"}, "step", "step", "expected int"),
    ({**STEP, "step": True}, "step", "step", "expected int"),
    ({**STEP, "loss": None}, "step", "loss", "expected number"),
    ({**STEP, "lossy": 1.0}, "step", "lossy", "unknown field"),
    ({**PUSH, "outcome": "maybe"}, "push", "outcome", 'expected "accepted" | "carried"'),
    ({**BASE, "ev": "no_such_kind"}, "no_such_kind", None, "unknown event kind"),
    ({k: v for k, v in STEP.items() if k != "pid"}, "step", "pid", "required field missing"),
])
def test_a_bad_event_names_its_kind_field_and_line(raw: dict[str, Any], kind: str, field: str | None,
                                                   says: str) -> None:
    with pytest.raises(EventSchemaError) as err:
        parse(raw, line=7)
    e = err.value
    assert (e.kind, e.field, e.line) == (kind, field, 7)
    assert says in str(e) and str(e).startswith("line 7: ") and repr(kind) in str(e), str(e)


def test_an_event_without_a_kind_is_refused() -> None:
    with pytest.raises(EventSchemaError, match="no 'ev' field"):
        parse({k: v for k, v in STEP.items() if k != "ev"})


def test_read_records_skips_a_torn_last_line_and_names_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    log = EventLog(path, "learner0.chip0")
    log.write(Step(**{k: v for k, v in STEP.items() if k not in BASE and k != "ev"}))
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"t": 1, "ev": "ste')  # a writer killed mid-line
    (rec,) = read_records(path)
    assert isinstance(rec, Step) and rec.proc == "learner0.chip0"
    with open(path, "ab") as f:
        f.write(b"\n" + json.dumps({**STEP, "extra": 1}).encode() + b"\n")
    with pytest.raises(EventSchemaError, match="line 2: not JSON"):
        read_records(path)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + lines[2])
    with pytest.raises(EventSchemaError, match="line 2: event 'step', field 'extra': unknown field"):
        read_records(path)


def test_docs_events_md_is_generated_from_the_records() -> None:
    assert DOC.read_text() == render(), "docs/events.md is stale: run python -m diloco_chaos.harness.record.doc"


def test_every_field_of_every_record_is_documented() -> None:
    undocumented = [f"{kind}.{name}" for kind, cls in REGISTRY.items()
                    for name in cls.__dataclass_fields__ if name not in field_docs(cls)]
    assert not undocumented, undocumented
    assert all(cls.__doc__ and cls.EMITTER for cls in REGISTRY.values())


def _emitted() -> dict[str, list[tuple[str, set[str]]]]:
    """kind -> (where, keywords) of every `on_event("kind", ...)` (the chaos layer's, written by `EventLog.named`) /
    `Record(...)` construction in the code (written by `*.write(Record(...))` or in a list by `write_all`; a record
    imported under another name, `Push as PushEvent`, counted as its own)."""
    out: dict[str, list[tuple[str, set[str]]]] = {}
    by_class = {cls.__name__: kind for kind, cls in REGISTRY.items()}
    for pkg in ("harness", "trainers", "chaos"):
        for path in sorted((ROOT / "diloco_chaos" / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text())
            kinds = {a.asname or a.name: by_class[a.name] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                     and (n.module or "").startswith("diloco_chaos.harness.record")
                     for a in n.names if a.name in by_class}  # records this module imports, by the name it uses
            for n in ast.walk(tree):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr in ("named", "on_event") and n.args and isinstance(n.args[0], ast.Constant)
                        and isinstance(n.args[0].value, str)):
                    where = f"{path.relative_to(ROOT)}:{n.lineno}"
                    out.setdefault(n.args[0].value, []).append((where, {k.arg for k in n.keywords if k.arg}))
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in kinds:
                    # Record(...): built to be written, by events.write(Record(...)) or in a list for write_all
                    where = f"{path.relative_to(ROOT)}:{n.lineno}"
                    out.setdefault(kinds[n.func.id], []).append((where, {k.arg for k in n.keywords if k.arg}))
    return out


def test_every_emitter_writes_a_registered_kind_with_known_fields() -> None:
    """Static half of keeping writers and schema in step (the runs below are the dynamic half): every event
    the code writes by name is a registered kind, and each keyword it passes is a field of that record."""
    emitted = _emitted()
    assert len(emitted) >= 70, sorted(emitted)
    unknown = {k: [w for w, _ in v] for k, v in emitted.items() if k not in REGISTRY}
    assert not unknown, f"kinds written but not in diloco_chaos/harness/record: {unknown}"
    stray = [(w, sorted(kw - set(REGISTRY[k].__dataclass_fields__))) for k, calls in emitted.items()
             for w, kw in calls if kw - set(REGISTRY[k].__dataclass_fields__)]
    assert not stray, f"fields written but not in their record: {stray}"
    assert not set(REGISTRY) - set(emitted), f"records nobody writes: {sorted(set(REGISTRY) - set(emitted))}"


def _check_run(run_dir: Path) -> RunLog:
    run = RunLog.load(run_dir / EVENTS_FILE, strict=True)
    raw = (run_dir / EVENTS_FILE).read_bytes().count(b"\n")
    assert len(run.records) == raw
    start = run.first(RunStart)
    assert start is not None and start.schema_version == SCHEMA_VERSION
    return run


@pytest.mark.timeout(300)
def test_real_runs_write_only_events_that_parse(runs_dir: Path) -> None:
    """A decoupled 2x2 run with a chip killed (recovery: restart) and a learner frozen, and a ddp run: every line
    of their logs parses into its record."""
    rec = {"policy": "restart", "repair_s": 1.0, "max_restarts": 2}
    faults = [{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 15, "learner": 0}},
              {"action": "freeze", "learner": 0, "at": {"step": 30, "learner": 0}, "until": {"after_s": 0.5}}]
    dec = run_scenario(tiny("decoupled", steps=60, recovery=rec, faults=faults), runs_dir)
    ddp = run_scenario(tiny("ddp", chips=1, steps=30), runs_dir)
    kinds = set()
    for res in (dec, ddp):
        kinds |= {r.ev for r in _check_run(Path(res.run_dir)).records}
    for must in ("step", "apply", "push", "pull", "merge", "eval", "fault_start", "fault_end", "process_fault",
                 "process_fault_off", "learner_down", "learner_restart", "initial_pull", "rtt",
                 "link_stats", "errors_labelled", "run_end"):
        assert must in kinds, (must, sorted(kinds))


def test_strict_event_log_refuses_a_drifting_emitter_before_writing(tmp_path: Path) -> None:
    path = tmp_path / EVENTS_FILE
    log = EventLog(path, "learner0.chip0", strict=True)
    fields = {k: v for k, v in STEP.items() if k not in BASE and k != "ev"}
    log.write(Step(**fields))
    with pytest.raises(EventSchemaError, match="event 'step', field 'loss': expected number"):
        log.write(Step(**{**fields, "loss": "2.5"}))  # mistyped: only the strict parse of the line sees it
    with pytest.raises(EventSchemaError, match="event 'step', field 'loss_': unknown field"):
        log.named("step", **{**fields, "loss_": 1.0})
    with pytest.raises(EventSchemaError, match="event 'stepp'"):
        log.named("stepp", **fields)
    log.close()
    assert len(read_records(path)) == 1


def test_run_log_lenient_load_reads_an_older_run_and_lists_what_it_could_not(tmp_path: Path) -> None:
    from diloco_chaos.harness.record import RunLog
    from diloco_chaos.harness.record.syncer import Merge
    merge = {**BASE, "t": 1.0, "proc": "syncer", "ev": "merge", "version": 1, "merges": 1, "participants": [0],
             "tokens": 1.0, "c_tokens": [1.0], "tokens_merged": 1.0}  # written before fragment/round existed
    lines = [json.dumps({**STEP, "t": 2.0, "old_field": 1}), json.dumps(merge),
             json.dumps({**BASE, "ev": "no_such_kind"}), json.dumps({**STEP, "loss": "nan?"}),
             json.dumps({k: v for k, v in STEP.items() if k != "tokens"}), "[1]", json.dumps(STEP)[:20]]
    (tmp_path / EVENTS_FILE).write_text("\n".join(lines))  # the last line torn: no newline
    log = RunLog.load(tmp_path)
    assert [type(r) for r in log.records] == [Merge, Step]  # time order, not file order
    m = log.of(Merge)[0]
    assert m.fragment is None and m.round is None and m.step is None
    got = {(p.line, p.kind, p.field, p.skipped) for p in log.problems}
    assert got == {(1, "step", "old_field", False), (2, "merge", "fragment", False), (2, "merge", "round", False),
                   (3, "no_such_kind", None, True), (4, "step", "loss", True), (5, "step", "tokens", True),
                   (6, None, None, True)}
    with pytest.raises(EventSchemaError, match="line 1: .*old_field"):
        RunLog.load(tmp_path, strict=True)


def test_run_log_lenient_parse_of_a_current_event_equals_strict_parse() -> None:
    from diloco_chaos.harness.record import RunLog, parse_lenient
    rec, problems = parse_lenient(PUSH)
    assert rec == parse(PUSH) and problems == []
    log = RunLog.from_dicts([PUSH, {**STEP, "t": 0.5}], strict=True)
    assert log.first(Step) == parse({**STEP, "t": 0.5}) and log.last(Push) == parse(PUSH) and log.count(Step) == 1
