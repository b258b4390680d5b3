"""Run directories: one folder per run holding everything needed to understand or replay it.

Layout:
    config.json   the resolved, validated scenario (replay starts from it)
    events.jsonl  the append-only event log of every process
    global.pt     the global model checkpoint (written atomically)
    report.json   the summary computed from the event log
    invariants.json each bound-free invariant's verdict, figure and bound, checked once as the run ended
    processes.json pids of every process the run started (so tests can prove none survives)

`FinishedRun` is a finished run directory read once: its event log parsed into a RunLog
(diloco_chaos/harness/record/run_record.py), config.json and report.json. Every reader of a finished run (the
report, the invariants, the HTML page, replay, the CLI's table, a suite's ChaosRun) takes one, so each command
opens events.jsonl once, and nothing after the run appends to it.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from diloco_chaos.harness.record.events import EVENTS_FILE
from diloco_chaos.harness.record.run_record import RunLog

CONFIG_FILE = "config.json"
MUTATION_KEY = "mutation"
"""A top-level key of config.json beside the scenario's, written only when a mutation was switched on
(diloco_chaos/trainers/mutations.py): its name. Not a scenario setting (a scenario file holding it is refused:
only the environment turns a mutation on); `scenario_table` leaves it out when a run's scenario is read back."""
REPORT_FILE = "report.json"
INVARIANTS_FILE = "invariants.json"
CHECKPOINT_FILE = "global.pt"
PROCESSES_FILE = "processes.json"
LOGS_DIR = "logs"
"""Where each child process of a run (chip, link, syncer, host agent) writes its stderr: tracebacks, warnings and
what Gloo and torch print, one file per process (diloco_chaos/harness/run/procutil.py `stderr_to_file`)."""


def stderr_file(run_dir: str | os.PathLike[str], proc: str) -> Path:
    """The stderr file of process `proc` (as events name it: learner1.chip0, learner1.link, syncer, ...)."""
    return Path(run_dir) / LOGS_DIR / f"{proc}.stderr"


def make_run_dir(root: str | os.PathLike[str], name: str, algorithm: str) -> Path:
    """A fresh, uniquely named directory under `root`."""
    Path(root).mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.mkdtemp(prefix=f"{stamp}-{name}-{algorithm}-", dir=root))


def _atomic_write(path: str | os.PathLike[str], write: Any, durable: bool = True) -> None:
    """Write to a temp file in the same directory, fsync it, rename over `path`, fsync the directory.

    The rename makes it atomic: a reader sees the old file or the new one, never a torn one, whoever dies.
    `durable=False` skips the two fsyncs: still atomic against a process crash (the page cache outlives the
    process), not against the machine losing power."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str], durable: bool = True) -> None:
    _atomic_write(path, lambda f: torch.save(obj, f), durable)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    _atomic_write(path, lambda f: f.write((json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()))


def read_json(path: str | os.PathLike[str]) -> Any:
    with open(path) as f:
        return json.load(f)


class RunDirError(ValueError):
    """A run directory that is missing a file a command needs, or holds one that is damaged."""


def check_run_dir(run_dir: str | os.PathLike[str], json_files: tuple[str, ...], events_file: str | None) -> None:
    """Raise RunDirError, naming the file, unless `run_dir` holds each of `json_files` as a JSON object and
    `events_file` (if given) as an event log with at least one event, each with its kind and time. A torn last
    line of the log is not damage (a killed writer leaves one); a line that is not an event is."""
    root = Path(run_dir)
    if not root.is_dir():
        raise RunDirError(f"{str(run_dir)!r} is not a folder")
    for name in json_files:
        path = root / name
        if not path.is_file():
            raise RunDirError(f"{str(run_dir)!r} has no {name} (not a finished run directory)")
        try:
            obj = read_json(path)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise RunDirError(f"{str(path)!r} is damaged: {e}") from None
        if not isinstance(obj, dict):
            raise RunDirError(f"{str(path)!r} is damaged: a JSON {type(obj).__name__}, not an object")
    if events_file is not None and not (root / events_file).is_file():
        raise RunDirError(f"{str(run_dir)!r} has no {events_file} (not a run directory)")


def check_events(log: RunLog, run_dir: str | os.PathLike[str]) -> None:
    """Raise RunDirError, naming the line, unless the loaded log holds at least one event and every complete line
    is one, with its kind and time (a torn last line is not damage: a killed writer leaves one)."""
    path = str(Path(run_dir) / EVENTS_FILE)
    count = len(log.records)
    for p in sorted(log.problems, key=lambda p: p.line or 0):
        if not p.skipped:
            continue
        if p.what.startswith("not JSON"):
            raise RunDirError(f"{path!r} is damaged: line {p.line} is not JSON")
        if p.field in ("ev", "t") or p.what.startswith("not a JSON object"):
            raise RunDirError(f"{path!r} is damaged: line {p.line} is not an event (needs 'ev' and 't')")
        count += 1  # an event of a kind this version does not know, or with a field it cannot read: still an event
    if count == 0:
        raise RunDirError(f"{path!r} holds no event")


@dataclass(frozen=True)
class FinishedRun:
    """A run directory read once: its event log as records (RunLog, loaded leniently so older runs still load),
    config.json and report.json ({} when absent). What every reader of a finished run takes."""

    run_dir: Path
    log: RunLog
    """The events as typed records, in time order."""
    config: dict[str, Any] = field(default_factory=dict)
    """config.json: the resolved scenario ({} when absent)."""
    report: dict[str, Any] = field(default_factory=dict)
    """report.json ({} when absent, or before the run's report is built)."""

    @classmethod
    def load(cls, run_dir: str | os.PathLike[str], log: RunLog | None = None, keep_lines: bool = False
             ) -> FinishedRun:
        """Read the run directory: events.jsonl (required; its one read) unless its `log` is given, config.json
        and report.json when present. `keep_lines`: also keep the decoded lines, in file order (RunLog.lines)."""
        d = Path(run_dir)
        config = read_json(d / CONFIG_FILE) if (d / CONFIG_FILE).is_file() else {}
        report = read_json(d / REPORT_FILE) if (d / REPORT_FILE).is_file() else {}
        return cls(d, log if log is not None else RunLog.load(d, keep_lines=keep_lines), config, report)

    @classmethod
    def of(cls, run: FinishedRun | str | os.PathLike[str]) -> FinishedRun:
        """`run` itself, or the run directory it names read once."""
        return run if isinstance(run, FinishedRun) else cls.load(run)

    def with_report(self, report: dict[str, Any]) -> FinishedRun:
        """The same run with its report (the supervisor builds the report from the run it loaded)."""
        return replace(self, report=report)


def scenario_table(config: dict[str, Any]) -> dict[str, Any]:
    """The scenario's own table of a run's config.json: without MUTATION_KEY, which records the run, not the
    scenario."""
    return {k: v for k, v in config.items() if k != MUTATION_KEY}
