"""What a finished run left behind on the machine: live processes and bound ports (both must be none).

The run's pids come from its RunResult (every generation of every process)
and its event log (each host's link process, forked by the host itself); its
ports from the event log: the syncer's listener, the supervisor's Gloo
rendezvous store, the Toxiproxy API, every proxy listener and the torchft target's Lighthouse.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from diloco_chaos.harness.record.events import EVENTS_FILE, read_events


def run_ports(run_dir: str | os.PathLike[str]) -> set[int]:
    """Every TCP port the run listened on, as recorded in its event log."""
    return _ports(read_events(Path(run_dir) / EVENTS_FILE))


def _ports(events: list[dict[str, Any]]) -> set[int]:
    ports: set[int] = set()
    for e in events:
        if e["ev"] == "syncer_start":
            ports.add(int(e["port"]))
        elif e["ev"] in ("store_ready", "lighthouse_ready"):
            ports.add(int(e["port"]))
        elif e["ev"] == "links_ready":
            ports.update(int(p) for p in e["proxies"].values())
            if e.get("backend") != "external":
                port = urlsplit(e["url"]).port
                if port:
                    ports.add(port)
    return ports


def leftovers(result: Any, events: list[dict[str, Any]] | None = None) -> dict[str, list[int]]:
    """Processes of the run still alive (zombies excluded) and its ports still listening. `events`: the run's
    decoded events when the caller has read them already (else read here, once: pids and ports both come from it)."""
    if events is None:
        events = read_events(Path(result.run_dir) / EVENTS_FILE)
    links = [int(e["pid"]) for e in events if e["ev"] == "link_process_start"]  # forked by the hosts themselves
    links += [int(e["child_pid"]) for e in events if e["ev"] == "lighthouse_ready"]  # the torchft target's
    pids = [*result.pids, *result.report.get("chip_pids", []), *links]
    alive = sorted({p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE})
    ports = _ports(events)
    bound = sorted({c.laddr.port for c in psutil.net_connections("tcp")
                    if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports})
    return {"processes": alive, "ports": bound}
