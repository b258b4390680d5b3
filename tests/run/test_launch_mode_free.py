"""The supervisor and its helpers in harness/run/ have no branch on the launch mode: `[launch] hosts` and
`backend` are read once, by diloco_chaos/harness/hosts/base.py `open_hosts`, which picks the run's `Hosts`."""

from __future__ import annotations

import re
from pathlib import Path

import diloco_chaos.harness.run as run_pkg

LAUNCH_KEYS = re.compile(r"launch\s*\.\s*(hosts|backend)\b")


def test_no_module_of_harness_run_reads_the_launch_mode() -> None:
    folder = Path(run_pkg.__file__).parent
    modules = sorted(folder.glob("*.py"))
    assert any(p.name == "supervisor.py" for p in modules), f"nothing to check in {folder}"
    found = [f"{p.relative_to(folder.parent.parent.parent)}:{n}: {line.strip()}"
             for p in modules for n, line in enumerate(p.read_text().splitlines(), 1) if LAUNCH_KEYS.search(line)]
    assert found == [], "read the launch mode through the run's Hosts (harness/hosts/base.py) instead:\n" + "\n".join(
        found)
