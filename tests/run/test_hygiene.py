"""leftovers() sees a live process and a still-bound port of a run, so the suites' cleanup checks can fail."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.run import LinksReady, StoreReady
from diloco_chaos.harness.record.syncer import SyncerStart
from diloco_chaos.harness.testing.hygiene import leftovers, run_ports


def test_leftovers_reports_live_processes_and_bound_ports(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    ev = EventLog(tmp_path / EVENTS_FILE, "supervisor")  # only the port fields matter here
    ev.write(StoreReady(port=port))
    ev.write(SyncerStart(port=1, algorithm="decoupled", fragments=2))  # nothing listens there
    ev.write(LinksReady(backend="embedded", url="http://127.0.0.1:2", version="x", proxies={"0": 3}))
    ev.close()
    assert run_ports(tmp_path) == {port, 1, 2, 3}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        res = SimpleNamespace(run_dir=tmp_path, pids=[child.pid], report={"chip_pids": []})
        assert leftovers(res) == {"processes": [child.pid], "ports": [port]}
    finally:
        child.kill()
        child.wait(timeout=10)
        listener.close()
    assert leftovers(res) == {"processes": [], "ports": []}
