"""Link chaos: degrade, partition, flap, reset or slice one learner's link, through its Toxiproxy proxy.

Every learner reaches the syncer only through its proxy `learner-<i>`, so a
toxic on that proxy is a fault on that learner's WAN link and nowhere else.
With netns hosts the same API drives the kernel link backend instead
(diloco_chaos/chaos/kernel_links.py: the same toxics as tc qdiscs and nftables rules on
the host's veth), through `ToxicApi`.
Each call returns a `LinkFault`: a scope that is removed by `clear()`, by
leaving its `with` block, or by `LinkChaos.clear_all()` (which the supervisor
calls at the end of every run, failed or not).

Deterministic by construction: every toxic we send has toxicity 1.0 and no
Toxiproxy-side randomness (Toxiproxy's `-seed` has had no effect since 2.9).
Jitter is drawn by the harness from the run's seed and applied by updating
the latency toxic every `JITTER_PERIOD_S`; the sequence of values is fixed
by the seed, only their timing is wall-clock.

Units: `latency_ms` and `jitter_ms` are round-trip figures, applied half on
each direction; `bandwidth_kbps` is kilobits per second on each direction,
sent to Toxiproxy as `rate` = kbps / 8 KB/s (Toxiproxy's KB is 1000 bytes
and its rate is per connection). With a sharded synchronizer (syncer.shards
= S) a learner's link is S proxies (`learner-<i>`, `learner-<i>-shard<k>`),
one connection each: every fault applies to all of them, and a bandwidth cap
is split evenly across them (`shard_rate`: 1/S of it each), so the learner's
total is the rate set, as on one WAN pipe.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError
from diloco_chaos.chaos.wan_profiles import WAN_PROFILES

log = logging.getLogger(__name__)

JITTER_PERIOD_S = 0.2
"""How often a jittered latency toxic gets a new seeded value."""
STREAMS = ("upstream", "downstream")


def _no_event(ev: str, /, **fields: Any) -> None:
    pass


class ToxicApi(Protocol):
    """What LinkChaos needs of a link backend: a Toxiproxy client (diloco_chaos/chaos/toxiproxy_client.py), or tc and
    nft on a learner host's veth (diloco_chaos/chaos/kernel_links.py `KernelToxics`)."""

    timeout_s: float

    def add_toxic(self, proxy: str, name: str, type_: str, /, stream: str = ..., toxicity: float = ...,
                  **attributes: float) -> object: ...

    def update_toxic(self, proxy: str, name: str, /, toxicity: float | None = ..., **attributes: float) -> object: ...

    def remove_toxic(self, proxy: str, name: str, /, missing_ok: bool = ...) -> None: ...

    def set_enabled(self, proxy: str, enabled: bool, /) -> object: ...




def shard_rate(bandwidth_kbps: float, shards: int) -> int:
    """Toxiproxy's `rate` (KB/s, per connection) of each of a learner's `shards` connections, so that their sum
    is the learner's bandwidth: a learner's WAN link is one pipe, whatever number of shards it reaches."""
    return max(1, round(bandwidth_kbps / 8 / shards))


def proxy_name(learner: int, shard: int = 0) -> str:
    """The proxy of learner's connection to synchronizer shard `shard` (`learner-<i>` for shard 0, the only one
    without sharding)."""
    return f"learner-{learner}" if shard == 0 else f"learner-{learner}-shard{shard}"


@dataclass
class LinkFault:
    """One active fault on one learner's link; `clear()` (idempotent) removes it."""

    kind: str
    learner: int
    toxics: list[tuple[str, str]] = field(default_factory=list)
    disabled: bool = False
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    owner: LinkChaos | None = None
    cleared: bool = False

    def clear(self) -> None:
        if self.owner is not None:
            self.owner._clear(self)

    def __enter__(self) -> LinkFault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clear()


class LinkChaos:
    """Faults on learner links; every fault it made is removed by `clear_all()`."""

    def __init__(self, client: ToxiproxyClient | ToxicApi, learners: int, seed: int = 0,
                 on_event: Callable[..., None] | None = None, fragment_bytes: int = 0, step_s: float = 0.1,
                 shards: int = 1) -> None:
        self.client = client
        self.learners = learners
        self.shards = shards
        """Synchronizer shards: a learner's link is one proxy per shard, and a fault on it hits all of them."""
        self.seed = seed
        self.on_event = on_event or _no_event
        self.fragment_bytes = fragment_bytes
        self.step_s = step_s
        self._lock = threading.Lock()
        self._active: list[LinkFault] = []
        self._refused: dict[int, int] = {}  # learner -> active faults holding its proxy disabled
        self._ids = itertools.count(1)

    # -- the chaos API ---------------------------------------------------------------------------
    def degrade(self, learner: int, latency_ms: float = 0.0, jitter_ms: float = 0.0,
                bandwidth_kbps: float | None = None, profile: str | None = None) -> LinkFault:
        """Add round-trip latency (+- seeded jitter) and/or cap the bandwidth of one learner's link."""
        if profile is not None:
            base = WAN_PROFILES[profile].resolve(self.fragment_bytes, self.step_s)
            latency_ms = latency_ms or base["latency_ms"]
            jitter_ms = jitter_ms or base["jitter_ms"]
            bandwidth_kbps = bandwidth_kbps if bandwidth_kbps is not None else base["bandwidth_kbps"]
        fault = self._new("degrade", learner)
        n = fault.toxics
        with self._building(fault):
            if latency_ms > 0 or jitter_ms > 0:
                for stream in STREAMS:
                    n.extend(self._add(learner, "latency", stream, latency=round(latency_ms / 2)))
            if bandwidth_kbps is not None:
                rate = shard_rate(bandwidth_kbps, self.shards)
                for stream in STREAMS:
                    n.extend(self._add(learner, "bandwidth", stream, rate=rate))
        if jitter_ms > 0:
            fault.thread = threading.Thread(target=self._jitter, args=(fault, latency_ms, jitter_ms),
                                            name=f"jitter-{learner}", daemon=True)
            fault.thread.start()
        return self._register(fault, latency_ms=latency_ms, jitter_ms=jitter_ms, bandwidth_kbps=bandwidth_kbps)

    def partition(self, learner: int, mode: str = "blackhole") -> LinkFault:
        """Cut one learner off. blackhole: connections stay open but nothing passes (a timeout toxic with
        timeout 0 on both directions), like a dead WAN path; refuse: the proxy is disabled, which closes live
        connections and refuses new ones, like a host that is gone."""
        fault = self._new("partition", learner)
        with self._building(fault):
            self._cut(fault, mode)
        return self._register(fault, mode=mode)

    def heal(self, learner: int) -> None:
        """End every partition and flap on one learner's link (degradations stay)."""
        self._check_learner(learner)
        with self._lock:
            faults = [f for f in self._active if f.learner == learner and f.kind in ("partition", "flap")]
        for f in faults:
            f.clear()

    def flap(self, learner: int, period_s: float, duty: float, mode: str = "blackhole") -> LinkFault:
        """Partition and heal one learner's link periodically: down for duty * period_s of every period."""
        fault = self._new("flap", learner)
        fault.thread = threading.Thread(target=self._flap, args=(fault, period_s, duty, mode),
                                        name=f"flap-{learner}", daemon=True)
        self._register(fault, period_s=period_s, duty=duty)  # logged before the thread's first flap event
        fault.thread.start()
        return fault

    def reset_peer(self, learner: int, timeout_ms: int = 0) -> LinkFault:
        """While active, every connection of the link is reset (RST) timeout_ms after data arrives."""
        fault = self._new("reset_peer", learner)
        with self._building(fault):
            fault.toxics.extend(self._add(learner, "reset_peer", "upstream", timeout=timeout_ms))
        return self._register(fault, timeout_ms=timeout_ms)

    def reset_connections(self, learner: int) -> None:
        """One shot: drop the link's live connections now (disable then enable the proxy). While a refuse
        partition holds the proxy disabled there are no live connections, and the link stays down."""
        self._check_learner(learner)
        with self._lock:
            refused = self._refused.get(learner, 0) > 0
        if not refused:
            for name in self.proxies(learner):
                self.client.set_enabled(name, False)
            for name in self.proxies(learner):
                self.client.set_enabled(name, True)
        self.on_event("link_connections_dropped", learner=learner, already_refused=refused)

    def corrupt_by_slicing(self, learner: int, average_size: int = 64, size_variation: int = 32,
                           delay_us: int = 200, limit_bytes: int | None = None) -> LinkFault:
        """Deliver the learner's bytes in small delayed slices (frames arrive in many pieces), and with
        limit_bytes also cut each connection after that many bytes (a frame cut short)."""
        fault = self._new("slice", learner)
        with self._building(fault):
            for stream in STREAMS:
                fault.toxics.extend(self._add(learner, "slicer", stream, average_size=average_size,
                                              size_variation=size_variation, delay=delay_us))
            if limit_bytes is not None:
                fault.toxics.extend(self._add(learner, "limit_data", "upstream", bytes=limit_bytes))
        return self._register(fault, average_size=average_size, size_variation=size_variation,
                              delay_us=delay_us, limit_bytes=limit_bytes)

    def limit_data(self, learner: int, nbytes: int) -> LinkFault:
        """Close each of the link's connections after nbytes from the learner (a frame cut short)."""
        fault = self._new("limit_data", learner)
        with self._building(fault):
            fault.toxics.extend(self._add(learner, "limit_data", "upstream", bytes=nbytes))
        return self._register(fault, bytes=nbytes)

    def add_toxics(self, learner: int, kind: str, toxics: list[tuple[str, str, dict[str, float]]],
                   **params: Any) -> LinkFault:
        """A fault made of plain toxics, `(type, stream, attributes)` each, added all or nothing; `params` go in
        its `link_fault_on` event as one `params` mapping, so a new kind needs no new event field. For kinds that
        need no more than that (diloco_chaos/chaos/faults/corrupt.py)."""
        fault = self._new(kind, learner)
        with self._building(fault):
            for type_, stream, attributes in toxics:
                fault.toxics.extend(self._add(learner, type_, stream, **attributes))
        return self._register(fault, params={k: v for k, v in params.items() if v is not None})

    def active(self) -> list[LinkFault]:
        with self._lock:
            return list(self._active)

    def clear_all(self) -> None:
        """Remove every fault this object made; errors are logged, never raised (runs at teardown)."""
        for f in self.active():
            try:
                f.clear()
            except ToxiproxyError as e:
                log.warning("could not clear %s on learner %d: %s", f.kind, f.learner, e)

    # -- internals -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _building(self, fault: LinkFault) -> Iterator[None]:
        """Adding a fault's toxics is all or nothing: on an error, the ones already added are removed."""
        try:
            yield
        except BaseException:
            fault.stop.set()
            try:
                self._uncut(fault)
            except ToxiproxyError as e:
                log.warning("could not roll back a half-made %s on learner %d: %s", fault.kind, fault.learner, e)
            raise

    def _check_learner(self, learner: int) -> None:
        if not 0 <= learner < self.learners:
            raise ValueError(f"learner = {learner}: must be in [0, {self.learners - 1}]")

    def _new(self, kind: str, learner: int) -> LinkFault:
        self._check_learner(learner)
        return LinkFault(kind, learner, owner=self)

    def _register(self, fault: LinkFault, **params: Any) -> LinkFault:
        with self._lock:
            self._active.append(fault)
        self.on_event("link_fault_on", learner=fault.learner, kind=fault.kind,
                      **{k: v for k, v in params.items() if v is not None})
        return fault

    def proxies(self, learner: int) -> list[str]:
        """The proxies of one learner's link: one per synchronizer shard."""
        return [proxy_name(learner, k) for k in range(self.shards)]

    def _add(self, learner: int, type_: str, stream: str, **attributes: float) -> list[tuple[str, str]]:
        """Add one toxic to each of the learner's proxies. Callers build a fault's toxics in `_building`, which
        removes them if one fails."""
        name = f"{type_}-{stream}-{next(self._ids)}"
        added = []
        for proxy in self.proxies(learner):
            self.client.add_toxic(proxy, name, type_, stream=stream, toxicity=1.0, **attributes)
            added.append((proxy, name))
        return added

    def _cut(self, fault: LinkFault, mode: str) -> None:
        if mode == "refuse":  # counted: overlapping refuse faults keep the proxy down until the last ends
            with self._lock:
                first = self._refused.get(fault.learner, 0) == 0
                self._refused[fault.learner] = self._refused.get(fault.learner, 0) + 1
                fault.disabled = True
            if first:
                for proxy in self.proxies(fault.learner):
                    self.client.set_enabled(proxy, False)
        else:
            for stream in STREAMS:
                fault.toxics.extend(self._add(fault.learner, "timeout", stream, timeout=0))

    def _uncut(self, fault: LinkFault) -> None:
        toxics, fault.toxics = fault.toxics, []
        for proxy, name in toxics:
            self.client.remove_toxic(proxy, name, missing_ok=True)
        if fault.disabled:
            with self._lock:
                self._refused[fault.learner] -= 1
                last = self._refused[fault.learner] == 0
                fault.disabled = False
            if last:
                for proxy in self.proxies(fault.learner):
                    self.client.set_enabled(proxy, True)

    def _clear(self, fault: LinkFault) -> None:
        with self._lock:
            if fault.cleared:
                return
            fault.cleared = True
            if fault in self._active:
                self._active.remove(fault)
        fault.stop.set()
        if fault.thread is not None:
            fault.thread.join(timeout=self.client.timeout_s * 4)
        try:
            self._uncut(fault)
        except ToxiproxyError:  # still (partly) in place: keep it listed so clear_all() can retry
            with self._lock:
                fault.cleared = False
                self._active.append(fault)
            raise
        self.on_event("link_fault_off", learner=fault.learner, kind=fault.kind)

    def _jitter(self, fault: LinkFault, latency_ms: float, jitter_ms: float) -> None:
        rng = random.Random(f"{self.seed}/jitter/{fault.learner}")
        names = [(proxy, n) for proxy, n in fault.toxics if n.startswith("latency-")]
        while not fault.stop.wait(JITTER_PERIOD_S):
            value = max(0.0, latency_ms + rng.uniform(-jitter_ms, jitter_ms))
            try:
                for proxy, name in names:
                    self.client.update_toxic(proxy, name, latency=round(value / 2))
            except ToxiproxyError as e:
                if not fault.stop.is_set():
                    log.warning("jitter update on learner %d failed: %s", fault.learner, e)

    def _flap(self, fault: LinkFault, period_s: float, duty: float, mode: str) -> None:
        down_s, up_s = period_s * duty, period_s * (1 - duty)
        cut = LinkFault("flap-down", fault.learner, owner=None)
        while not fault.stop.is_set():
            try:
                self._cut(cut, mode)
                self.on_event("link_flap", learner=fault.learner, down=True)
                fault.stop.wait(down_s)
            finally:
                self._uncut(cut)
            self.on_event("link_flap", learner=fault.learner, down=False)
            fault.stop.wait(up_s)
