"""The supervisor's side of `[launch] hosts = "netns"`: make the run's hosts, carry link faults on them with the
kernel link backend, and remove everything at the end, whatever happened. `NetnsRun` is the `Hosts`
(diloco_chaos/harness/hosts/base.py) of netns hosts with forked chips (`backend = "local"`); with torchrun,
diloco_chaos/harness/hosts/torchrun.py `TorchrunHosts` runs over it.

diloco_chaos/harness/hosts/netns.py makes and removes namespaces; diloco_chaos/chaos/kernel_links.py turns link faults
into tc and nft commands; this module ties them to a run: events (`hosts_swept`, `hosts_ready`, `links_ready`,
`hosts_removed`), where each learner's chips live and connect, and the order of teardown (faults, then
qdiscs and tables, then namespaces).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from diloco_chaos.chaos.kernel_links import HostLink, KernelLinkError, KernelToxics
from diloco_chaos.chaos.links import LinkChaos, proxy_name
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import fragment_bytes
from diloco_chaos.harness.hosts.base import HostsUnavailable, Routes, Spawner
from diloco_chaos.harness.hosts.local import LocalHosts
from diloco_chaos.harness.hosts.netns import INNER_DEV, NetnsHosts, availability
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.run import HostsReady, HostsRemoved, HostsSwept, LinksReady

log = logging.getLogger(__name__)


@dataclass
class KernelRunLinks:
    """The kernel link backend of one run: the same `chaos` API as the Toxiproxy side
    (diloco_chaos/harness/hosts/link_proxies.py
    RunLinks), carried by tc and nft on the hosts' veths."""

    toxics: KernelToxics
    chaos: LinkChaos
    ports: dict[int, int] = field(default_factory=dict)

    def close(self, timeout_s: float) -> None:
        """Remove every fault, qdisc and nft table (never raises: it runs while a run is torn down)."""
        try:
            self.chaos.clear_all()
        finally:
            self.toxics.close()


class NetnsRun(LocalHosts):
    """The run's netns hosts; `close` removes the kernel links, then the hosts (and logs what, if anything, was
    left)."""

    def __init__(self, sc: Scenario, events: EventLog, spawner: Spawner, hosts: NetnsHosts) -> None:
        super().__init__(sc, events, spawner)
        self.hosts = hosts

    @classmethod
    def open(cls, sc: Scenario, events: EventLog, spawner: Spawner) -> NetnsRun:
        why = availability()
        if why is not None:
            raise HostsUnavailable(f"launch.hosts = 'netns': {why}")
        try:
            hosts = NetnsHosts.create(sc.topology.learners)
        except KernelLinkError as e:
            raise HostsUnavailable(f"launch.hosts = 'netns': the hosts could not be made: {e}") from e
        if hosts.swept:
            events.write(HostsSwept(removed=hosts.swept))
        events.write(HostsReady(prefix=hosts.prefix, bridge=hosts.bridge, syncer_address=hosts.syncer_address,
                                hosts=hosts.describe()))
        return cls(sc, events, spawner, hosts)

    @property
    def listen(self) -> str:
        return self.hosts.syncer_address

    def netns_of(self, learner: int) -> str:
        """The namespace a chip of `learner` enters (ChipSpec.netns)."""
        return self.hosts.hosts[learner].netns

    def connect(self, syncer_ports: list[int]) -> Routes:
        """With links.backend = "kernel" (or auto with link faults: `Scenario.links_in_effect`; validated: one
        shard), the kernel link backend on every host's veth, matching the syncer's port; else no link faults
        (proxies on loopback cannot reach the hosts)."""
        sc = self.sc
        routes = Routes.direct(sc.topology.learners, syncer_ports)
        if sc.links_in_effect.backend != "kernel":
            return routes
        syncer_port = syncer_ports[0]
        toxics = KernelToxics({proxy_name(m): HostLink(h.netns, INNER_DEV, h.outer_dev, syncer_port)
                               for m, h in enumerate(self.hosts.hosts)})
        self.links = KernelRunLinks(toxics, LinkChaos(toxics, sc.topology.learners, sc.seed,
                                                      on_event=self.events.named, fragment_bytes=fragment_bytes(sc),
                                                      step_s=sc.links.step_time_s), routes.ports)
        toxics.prepare()
        self.events.write(LinksReady(backend="kernel", url=f"tcp://{self.hosts.syncer_address}:{syncer_port}",
                                     version=os.uname().release,
                                     proxies={str(m): p for m, p in routes.ports.items()}))
        return routes

    def close(self) -> None:
        """Remove the kernel links, then the namespaces, veths and bridge; never raises."""
        try:
            super().close()
        except Exception as e:  # noqa: BLE001 - the namespaces must go whatever happened to the links
            log.warning("could not remove the kernel links: %s", e)
        try:
            left = self.hosts.close()
        except Exception as e:  # noqa: BLE001 - teardown must go on
            left = [f"clean-up failed: {type(e).__name__}: {e}"]
        self.events.write(HostsRemoved(left=left))
