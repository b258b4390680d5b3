"""Picking the run's `Hosts` (diloco_chaos/harness/hosts/base.py) from its scenario: the one place that reads
`[launch] hosts` and `backend`. Each launch mode's module is imported only when a run uses it (the default run
never loads the netns or agent code).
"""

from __future__ import annotations

from pathlib import Path

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.hosts.base import Hosts, Spawner
from diloco_chaos.harness.record.events import EventLog


def open_hosts(sc: Scenario, run_dir: Path, secret: bytes, events: EventLog, spawner: Spawner) -> Hosts:
    """The run's hosts for `sc.launch`, opened: namespaces made, remote agents connected (HostsUnavailable
    otherwise, having undone what it made). The one place that reads `launch.hosts` and `launch.backend`."""
    la = sc.launch
    if la.hosts == "remote":
        from diloco_chaos.harness.hosts.remote import RemoteHosts

        return RemoteHosts.open(sc, run_dir, secret, events, spawner)
    if la.hosts == "netns":
        from diloco_chaos.harness.hosts.netns_run import NetnsRun

        netns = NetnsRun.open(sc, events, spawner)
        if la.backend == "torchrun":
            from diloco_chaos.harness.hosts.torchrun import TorchrunHosts

            return TorchrunHosts(netns, run_dir, secret, sc.timeouts.startup_s, spawner)
        return netns
    if sc.elastic.engine == "torchrun":  # elastic_ddp as one torchrun elastic job on this machine
        from diloco_chaos.harness.hosts.elastic_torchrun import ElasticTorchrunHosts

        return ElasticTorchrunHosts(sc, run_dir, events, spawner)
    from diloco_chaos.harness.hosts.local import LocalHosts

    return LocalHosts(sc, events, spawner)
