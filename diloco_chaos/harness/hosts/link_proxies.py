"""The run's Toxiproxy side: the server, one proxy per learner link, and the chaos API on top.

`RunLinks.open` finds or starts the Toxiproxy server (diloco_chaos/chaos/toxiproxy_backend.py),
creates proxy `learner-<i>` for every learner (listening on a free
127.0.0.1 port, upstream the syncer; with syncer.shards = S > 1 also
`learner-<i>-shard<k>` upstream shard k) and returns the ports each learner
must connect to. `close` removes every fault and every proxy it made and stops a
server it started; it never raises, because it runs while a run is being torn
down, possibly after a failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from diloco_chaos.chaos.links import LinkChaos, proxy_name
from diloco_chaos.chaos.toxiproxy_backend import ToxiproxyBackend, start_backend
from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.run import LinksReady, ProcessStart

log = logging.getLogger(__name__)


@dataclass
class RunLinks:
    """Proxies of one run; `ports[m]` is where learner m connects."""

    backend: ToxiproxyBackend
    client: ToxiproxyClient
    chaos: LinkChaos
    ports: dict[int, int] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)

    shard_ports: dict[int, list[int]] = field(default_factory=dict)
    """syncer.shards > 1: learner -> the proxy ports of its connections to shards 1..S-1."""

    @classmethod
    def open(cls, sc: Scenario, syncer_ports: list[int], events: EventLog, fragment_bytes: int) -> RunLinks:
        """Proxies for every learner to every shard (`syncer_ports[k]`: shard k's port)."""
        t = sc.links
        backend = start_backend(sc.links_in_effect.proxy, sc.seed, sc.timeouts.startup_s, t.http_timeout_s)
        if backend.proc is not None:
            events.write(ProcessStart(name="toxiproxy", child_pid=backend.proc.pid))
        client = ToxiproxyClient(backend.url, timeout_s=t.http_timeout_s)
        chaos = LinkChaos(client, sc.topology.learners, sc.seed, on_event=events.named,
                          fragment_bytes=fragment_bytes, step_s=t.step_time_s, shards=len(syncer_ports))
        links = cls(backend, client, chaos)
        try:
            for m in range(sc.topology.learners):
                for k, port in enumerate(syncer_ports):
                    info = client.create_proxy(proxy_name(m, k), f"127.0.0.1:{port}", listen="127.0.0.1:0")
                    links.created.append(info.name)
                    if k == 0:
                        links.ports[m] = info.listen_port
                    else:
                        links.shard_ports.setdefault(m, []).append(info.listen_port)
        except ToxiproxyError as e:
            links.close(sc.timeouts.shutdown_s)
            if e.status == 409:
                raise ToxiproxyError(f"{e} (another run on the same Toxiproxy server at {backend.url} owns these "
                                     "proxy names; runs sharing TOXIPROXY_URL must not overlap)") from None
            raise
        events.write(LinksReady(backend=backend.kind, url=backend.url, version=backend.version,
                                proxies={str(m): p for m, p in links.ports.items()},
                                shard_proxies={str(m): ps for m, ps in links.shard_ports.items()}
                                if links.shard_ports else None))
        return links

    def close(self, timeout_s: float) -> None:
        self.chaos.clear_all()
        for name in self.created:
            try:
                self.client.delete_proxy(name, missing_ok=True)
            except ToxiproxyError as e:
                log.warning("could not delete proxy %s: %s", name, e)
        self.created.clear()
        try:
            self.backend.stop(timeout_s)
        except Exception as e:  # noqa: BLE001 - teardown must go on
            log.warning("could not stop the Toxiproxy server: %s", e)

