"""The run's child processes (chips, links, syncer) write their stderr to the run directory's logs/<process>.stderr,
not to the terminal: a run whose errors are all expected (a frozen chip's peer times out in its collective) prints
no traceback, and the traceback is in the peer chip's file; an unexpected error is listed with its file's path.

Why a freeze and not a kill: a killed chip's peer fails at once, but the supervisor, restarting the learner, may
SIGKILL it before it logs the error, and the run then has no error to show; a frozen chip's peer raises only
after timeouts.gloo_s, while nothing else has happened to its learner, so its error is always logged."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import tiny_table

from diloco_chaos.harness.run.progress import error_lines
from diloco_chaos.harness.run.rundir import stderr_file
from tests.report.test_results import write_toml

ROOT = Path(__file__).resolve().parents[2]


def test_expected_errors_leave_their_tracebacks_in_the_run_dir_not_on_the_terminal(tmp_path: Path) -> None:
    table = tiny_table("decoupled", learners=2, chips=2, steps=60, recovery={"policy": "restart", "repair_s": 0.5},
                       timeouts={"gloo_s": 4.0})
    path = write_toml(tmp_path / "freeze.toml", table)
    path.write_text(path.read_text() + """
[[faults]]
action = "freeze"
learner = 1
chip = 1
at = { step = 20, learner = 1 }
until = { after_s = 8.0 }
""")
    # a fresh interpreter, as a person runs it: its forkserver's stderr is this terminal's (the pipe read here)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "run", str(path), "--runs-dir",
                           str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-4000:]
    run_dir = Path(re.search(r"^run directory: (\S+)$", done.stdout, re.M).group(1))  # type: ignore[union-attr]
    report = json.loads((run_dir / "report.json").read_text())
    errors = report["errors"]
    assert errors and all(e["expected"] for e in errors), errors  # the peer chip's timed-out collective
    assert "expected errors" in terminal and "UNEXPECTED" not in terminal, terminal[-3000:]
    assert "Traceback" not in terminal, terminal[-4000:]
    peer = next(e for e in errors if e["ev"] == "chip_error")
    log = stderr_file(run_dir, peer["proc"]).read_text()
    assert "Traceback (most recent call last)" in log and peer["error"].split(":")[0] in log, log[-3000:]


def test_an_unexpected_error_is_listed_with_its_stderr_file(tmp_path: Path) -> None:
    f = stderr_file(tmp_path, "learner0.chip1")
    f.parent.mkdir()
    f.write_text("Process learner0.chip1:\nTraceback (most recent call last):\n  File \"x.py\", line 1\n"
                 "RuntimeError: boom\n")
    errors = [{"proc": "learner0.chip1", "ev": "chip_error", "error": "RuntimeError: boom", "expected": False},
              {"proc": "learner1.chip0", "ev": "chip_error", "error": "CollectiveFailed: reset", "expected": True,
               "cause": "fault 0: kill_chip"}]
    lines = error_lines(errors, run_dir=tmp_path)
    assert lines[:3] == ["UNEXPECTED errors (1):", "  learner0.chip1 chip_error: RuntimeError: boom",
                         f"    its stderr: {f}"], lines
    assert not any("learner1.chip0" in x and "stderr" in x for x in lines), lines  # expected: no pointer
