"""The default launch (`[launch] hosts = "local"`, `backend = "local"`): every learner's chips are forked on this
machine from the run's forkserver, reach the syncer over loopback, and carry link faults through one Toxiproxy
proxy per learner link (diloco_chaos/harness/hosts/link_proxies.py) unless `links.proxy = "off"`.

`LocalHosts` is the `Hosts` of diloco_chaos/harness/hosts/base.py for that mode; netns hosts
(diloco_chaos/harness/hosts/netns_run.py) start their chips the same way, each in its learner's namespace.
"""

from __future__ import annotations

import dataclasses
import signal

from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.chaos.processes import local_signaller
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import fragment_bytes
from diloco_chaos.harness.hosts.base import Links, Proc, Routes, Spawner
from diloco_chaos.harness.learner.chip import ChipSpec, chip_main
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.run.procutil import running


class LocalHosts:
    """This machine's forkserver and loopback; the run's Toxiproxy proxies, if any, once the syncer listens."""

    def __init__(self, sc: Scenario, events: EventLog, spawner: Spawner) -> None:
        self.sc, self.events, self.spawner = sc, events, spawner
        self.links: Links | None = None

    @property
    def listen(self) -> str:
        return "127.0.0.1"

    def netns_of(self, learner: int) -> str:
        """The network namespace learner `learner`'s chips enter ("": this machine's)."""
        return ""

    def connect(self, syncer_ports: list[int]) -> Routes:
        sc = self.sc
        if sc.links_in_effect.proxy == "off":
            return Routes.direct(sc.topology.learners, syncer_ports)
        from diloco_chaos.harness.hosts.link_proxies import RunLinks

        links = self.links = RunLinks.open(sc, syncer_ports, self.events, fragment_bytes(sc))
        return Routes(dict(links.ports), {m: tuple(links.shard_ports.get(m, [])) for m in links.ports})

    @property
    def link_chaos(self) -> LinkChaos | None:
        return self.links.chaos if self.links is not None else None

    def start_learner(self, spec: ChipSpec) -> dict[int, Proc]:
        return {r: self.start_chip(dataclasses.replace(spec, rank=r)) for r in range(spec.size)}

    def start_chip(self, spec: ChipSpec) -> Proc:
        spec = dataclasses.replace(spec, netns=self.netns_of(spec.learner))
        proc: Proc = self.spawner.start_process(f"learner{spec.learner}.chip{spec.rank}", chip_main, (spec,))
        return proc

    def chip_pids(self, learner: int, chips: list[Proc]) -> list[int]:
        return [p.pid for p in chips if p.pid is not None and running(p)]  # any thread may ask (procutil.running)

    def send(self, learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        return local_signaller(learner, pids, sig, children)

    def close(self) -> None:
        if self.links is not None:
            self.links.close(self.sc.timeouts.shutdown_s)
            self.links = None
