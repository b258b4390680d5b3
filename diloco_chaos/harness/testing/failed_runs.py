"""Keeping the run directories of failed tests where CI can upload them, each with its HTML report.

A chaos test's runs live under pytest's temporary directory, which CI throws away and which holds every
test's runs, failed or not. With ``--chaos-keep-failed DIR`` the pytest plugin copies the run directories
of each failed test to ``DIR/<test id>/<run>`` and writes the run's ``report.html`` there, so that a CI job
uploads exactly what a person needs to see why the test failed (docs: ci/README.md).
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def test_folder(nodeid: str) -> str:
    """A folder name for a test id: `suites/test_x.py::test_y[a-1]` -> `suites_test_x.py_test_y_a-1`."""
    return _UNSAFE.sub("_", nodeid).strip("_")[:150] or "test"


def keep_failed(root: str | Path, nodeid: str, run_dirs: Iterable[str | Path]) -> list[Path]:
    """Copy each run directory to root/<test folder>/<run directory's name> with its report.html; return the
    copies. A run that cannot be copied or reported on is logged and skipped: keeping evidence must never
    hide the test's own failure."""
    from diloco_chaos.harness.report.html import write_report

    kept = []
    for run_dir in run_dirs:
        src = Path(run_dir)
        dst = Path(root) / test_folder(nodeid) / src.name
        try:
            shutil.copytree(src, dst, dirs_exist_ok=True)
        except OSError as e:
            log.warning("could not keep run directory %s: %s", src, e)
            continue
        try:
            write_report(dst)
        except Exception as e:  # noqa: BLE001 - a damaged run still gets copied; the report is a convenience
            log.warning("kept %s without report.html: %s", dst, e)
        kept.append(dst)
    return kept
