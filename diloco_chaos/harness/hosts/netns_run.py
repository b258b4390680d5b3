"""The supervisor's side of `[launch] hosts = "netns"`: make the run's hosts, carry link faults on them with the
kernel link backend, and remove everything at the end, whatever happened.

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
from diloco_chaos.harness.hosts.netns import INNER_DEV, NetnsHosts, availability
from diloco_chaos.harness.record.events import EventLog

log = logging.getLogger(__name__)


class HostsUnavailable(RuntimeError):
    """`[launch] hosts = "netns"` cannot run here (not root, a tool missing, a command that failed); the message
    says which (the supervisor raises it as a RunFailed)."""


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


@dataclass
class NetnsRun:
    """The run's netns hosts; `close` removes them (and logs what, if anything, was left)."""

    hosts: NetnsHosts

    @classmethod
    def open(cls, sc: Scenario, events: EventLog) -> NetnsRun:
        why = availability()
        if why is not None:
            raise HostsUnavailable(f"launch.hosts = 'netns': {why}")
        try:
            hosts = NetnsHosts.create(sc.topology.learners)
        except KernelLinkError as e:
            raise HostsUnavailable(f"launch.hosts = 'netns': the hosts could not be made: {e}") from e
        if hosts.swept:
            events.log("hosts_swept", removed=hosts.swept)
        events.log("hosts_ready", prefix=hosts.prefix, bridge=hosts.bridge, syncer_address=hosts.syncer_address,
                   hosts=hosts.describe())
        return cls(hosts)

    @property
    def syncer_address(self) -> str:
        return self.hosts.syncer_address

    def netns_of(self, learner: int) -> str:
        """The namespace a chip of `learner` enters (ChipSpec.netns)."""
        return self.hosts.hosts[learner].netns

    def open_links(self, sc: Scenario, syncer_port: int, events: EventLog, fragment_bytes: int) -> KernelRunLinks:
        """The kernel link backend on every host's veth, matching the syncer's port."""
        toxics = KernelToxics({proxy_name(m): HostLink(h.netns, INNER_DEV, h.outer_dev, syncer_port)
                               for m, h in enumerate(self.hosts.hosts)})
        toxics.prepare()
        chaos = LinkChaos(toxics, sc.topology.learners, sc.seed, on_event=events.log,
                          fragment_bytes=fragment_bytes, step_s=sc.links.step_time_s)
        links = KernelRunLinks(toxics, chaos, {m: syncer_port for m in range(sc.topology.learners)})
        events.log("links_ready", backend="kernel", url=f"tcp://{self.hosts.syncer_address}:{syncer_port}",
                   version=os.uname().release, proxies={str(m): p for m, p in links.ports.items()})
        return links

    def close(self, events: EventLog) -> None:
        """Remove the namespaces, veths and bridge; never raises."""
        try:
            left = self.hosts.close()
        except Exception as e:  # noqa: BLE001 - teardown must go on
            left = [f"clean-up failed: {type(e).__name__}: {e}"]
        events.log("hosts_removed", left=left)
