"""A finished run's events.jsonl is read once per command, and nothing appends to it after `run_end`.

The opens are counted in-process by wrapping `open` (builtins and io, what Path.open calls) and `os.open`, keyed
on the events file's path: during the post-run phase of a real run, `diloco-chaos report`, the reading side of
`diloco-chaos replay --against`, and a suite's ChaosRun (report, events, invariants, hygiene). A grep asserts
that no reader of a finished run parses the file but through FinishedRun (diloco_chaos/harness/run/rundir.py).
"""

from __future__ import annotations

import builtins
import io
import os
import re
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny

from diloco_chaos.harness import cli
from diloco_chaos.harness.chaos_run import ChaosRun
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.invariants import check_all
from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.report.html import write_report
from diloco_chaos.harness.report.run_report import build_report
from diloco_chaos.harness.run import supervisor
from diloco_chaos.harness.run.rundir import CONFIG_FILE, FinishedRun, read_json

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def counting_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Count the opens of any events.jsonl, by its resolved path, while the block runs."""
    opens: Counter[str] = Counter()
    real_open, real_os_open = builtins.open, os.open

    def note(path: Any) -> None:
        if isinstance(path, (str, os.PathLike)) and os.fspath(path).endswith(EVENTS_FILE):
            opens[str(Path(os.fspath(path)).resolve())] += 1

    def counted_open(file: Any, *args: Any, **kw: Any) -> Any:
        note(file)
        return real_open(file, *args, **kw)

    def counted_os_open(path: Any, *args: Any, **kw: Any) -> int:
        note(path)
        return real_os_open(path, *args, **kw)

    with monkeypatch.context() as m:
        m.setattr(builtins, "open", counted_open)
        m.setattr(io, "open", counted_open)
        m.setattr(os, "open", counted_os_open)
        yield opens


def events_of(run_dir: Path) -> str:
    return str((run_dir / EVENTS_FILE).resolve())


@pytest.fixture
def saved_run(tmp_path: Path) -> Path:
    """A finished run directory with faults (a decoupled run whose faults fired), made by a real run."""
    sc = tiny("decoupled", learners=2, chips=1, steps=40).replace(faults=[
        {"action": "partition", "learner": 1, "at": {"step": 10, "learner": 0}, "until": {"step": 20, "learner": 0}}])
    return supervisor.run_scenario(sc, tmp_path / "runs").run_dir


def test_a_real_run_reads_its_log_once_after_it_ends_and_run_end_is_its_last_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[Counter[str]] = []
    real_finish = supervisor.finish_run

    def counted_finish(*args: Any, **kw: Any) -> Any:
        with counting_opens(monkeypatch) as opens:
            out = real_finish(*args, **kw)
        counts.append(opens)
        return out

    monkeypatch.setattr(supervisor, "finish_run", counted_finish)
    sc = tiny("decoupled", learners=2, chips=1, steps=30)
    res = supervisor.run_scenario(sc, tmp_path / "runs")
    (opens,) = counts
    assert opens == Counter({events_of(res.run_dir): 1}), opens
    lines = (res.run_dir / EVENTS_FILE).read_text().splitlines()
    kinds = [read_kind(ln) for ln in lines]
    assert kinds[-1] == "run_end", kinds[-5:]
    assert kinds.count("run_end") == 1
    assert {"errors_labelled", "eval"} <= set(kinds[:-1])
    assert res.finished is not None and res.finished.report == res.report
    assert res.report == build_report(res.run_dir), "the report of the log read once is the report of the file"


def read_kind(line: str) -> str:
    m = re.search(r'"ev":"([a-z_]+)"', line)
    assert m, line
    return m.group(1)


def test_readers_read_once_and_never_append(saved_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = saved_run / EVENTS_FILE
    before = path.read_bytes()
    # diloco-chaos report RUN_DIR
    with counting_opens(monkeypatch) as opens:
        assert cli.main(["report", str(saved_run)]) == 0
    assert opens == Counter({events_of(saved_run): 1}), opens
    # the reading side of diloco-chaos replay: both runs' logs, once each
    other = tmp_path / "other"
    shutil.copytree(saved_run, other)
    with counting_opens(monkeypatch) as opens:
        assert cli.main(["replay", str(saved_run), "--against", str(other), "--quiet"]) == 0
    assert opens == Counter({events_of(saved_run): 1, events_of(other): 1}), opens
    # a suite's ChaosRun: report, events, every invariant, the failure summary and the hygiene check
    run = ChaosRun(from_dict(read_json(saved_run / CONFIG_FILE)), saved_run)
    with counting_opens(monkeypatch) as opens:
        assert run.report["name"] == run.scenario.name
        assert run.events[0]["ev"] == "run_start" and run.events[-1]["ev"] == "run_end"
        results = run.check_all()
        assert results and all(r.ok for r in results)
        assert run.summary() and run.leftovers() == {"processes": [], "ports": []}
    assert opens == Counter({events_of(saved_run): 1}), opens
    capsys.readouterr()
    # none of the readers wrote to the log
    finished = FinishedRun.load(saved_run)
    build_report(finished)
    check_all(finished)
    write_report(finished)
    assert path.read_bytes() == before


def test_only_the_record_layer_parses_an_event_log() -> None:
    """Readers of a finished run take a FinishedRun (or RunLog): no other module of the report, the invariants,
    replay, the CLI or the suites' handle parses events.jsonl itself."""
    readers = [*(ROOT / "diloco_chaos/harness/report").glob("*.py"),
               *(ROOT / "diloco_chaos/harness/invariants").rglob("*.py"),
               ROOT / "diloco_chaos/harness/run/replay.py", ROOT / "diloco_chaos/harness/cli.py",
               ROOT / "diloco_chaos/harness/chaos_run.py", ROOT / "diloco_chaos/harness/testing/pytest_plugin.py"]
    loaders = re.compile(r"RunLog\.load\(|read_events\(|iter_events\(|iter_lines\(|read_records\(|EventTail\(")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in readers
                 for n, line in enumerate(p.read_text().splitlines(), 1) if loaders.search(line)]
    assert offenders == []
    users = {p.relative_to(ROOT).as_posix() for p in (ROOT / "diloco_chaos").rglob("*.py")
             if "RunLog.load(" in p.read_text() and "harness/record/" not in p.as_posix()}
    assert users <= {"diloco_chaos/harness/run/rundir.py", "diloco_chaos/harness/run/finish.py"}, users
