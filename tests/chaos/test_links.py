"""Tests for diloco_chaos.chaos.links (LinkChaos, LinkFault, proxy_name) on a real Toxiproxy data path.

What: every fault LinkChaos offers (degrade with and without a WAN profile and seeded
jitter, partition in both modes, heal, flap, reset_peer, reset_connections, slicing,
limit_data, apply() of schedule entries, clear/clear_all and the LinkFault scope) is
checked twice: by the toxics the server reports through ``ToxiproxyClient.toxics``
(types, streams, exact attribute values, toxicity 1.0, nothing left behind after a
clear) and by what real loopback sockets see through the proxies ``learner-0`` and
``learner-1`` in front of a threaded echo server (delay, silence, refusal, resets,
truncation, intact data).

Why: LinkChaos is the only thing between a scenario's ``[[faults]]`` and the learners'
WAN links; a wrong unit (round trip vs one way, kbps vs KB/s), a toxic on the wrong
stream or learner, or a fault that outlives its scope silently changes what a chaos run
measures.  The server is our EmbeddedToxiproxy, so the tests need no binary.

No sleeps: waits are socket timeouts and bounded polling loops paced by
``threading.Event().wait``; every socket has a timeout.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.faults.base import FaultHandle
from diloco_chaos.chaos.links import JITTER_PERIOD_S, LinkChaos, LinkFault, proxy_name
from diloco_chaos.chaos.schedule import FaultSpec, parse_fault
from diloco_chaos.chaos.toxiproxy_client import ToxicInfo, ToxiproxyClient
from diloco_chaos.chaos.toxiproxy_server import EmbeddedToxiproxy

SOCK_TIMEOUT_S = 5.0
POLL_S = 0.05
WAIT_S = 5.0
SEED = 7
FRAGMENT_BYTES = 68_500
STEP_S = 0.15
BIG = 50_000


# ----------------------------------------------------------------------------- helpers



class Recorder:
    """The on_event callback: keeps every (event, fields) call, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, ev: str, /, **fields: Any) -> None:
        with self._lock:
            self._calls.append((ev, dict(fields)))

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return list(self._calls)

    def names(self) -> list[str]:
        return [ev for ev, _ in self.calls]


class RecordingClient(ToxiproxyClient):
    """A real client that also keeps every update_toxic call (proxy, toxic, attributes), in order."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        super().__init__(url, timeout_s)
        self._lock = threading.Lock()
        self.updates: list[tuple[str, str, dict[str, int]]] = []

    def update_toxic(self, proxy: str, name: str, toxicity: float | None = None, **attributes: int) -> ToxicInfo:
        with self._lock:
            self.updates.append((proxy, name, dict(attributes)))
        return super().update_toxic(proxy, name, toxicity, **attributes)

    def latency_updates(self, proxy: str, name: str, since: int = 0) -> list[int]:
        """Latency values sent to one toxic, from the `since`-th recorded update on."""
        with self._lock:
            return [a["latency"] for p, n, a in self.updates[since:] if p == proxy and n == name]


def _wait_until(pred: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Poll ``pred`` every POLL_S until it holds (True) or ``timeout_s`` has passed (False)."""
    pause = threading.Event()  # never set: a bounded pause
    deadline = time.monotonic() + timeout_s
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(POLL_S)


def _connect(port: int, timeout_s: float = SOCK_TIMEOUT_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    got = bytearray()
    while len(got) < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _echo(port: int, payload: bytes = b"hello through the link") -> bytes:
    with _connect(port) as sock:
        sock.sendall(payload)
        return _recv_exact(sock, len(payload))


def _recv_until_closed(sock: socket.socket) -> bytes:
    """Everything the peer sends until EOF or a reset; a socket timeout (still open) propagates."""
    got = bytearray()
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return bytes(got)


def _send_ignoring_close(sock: socket.socket, payload: bytes) -> None:
    """sendall that tolerates the proxy cutting the connection mid-send (what the fault is for)."""
    try:
        sock.sendall(payload)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _payload(n: int) -> bytes:
    return random.Random(n).randbytes(n)


def _toxics(client: ToxiproxyClient, learner: int) -> dict[str, ToxicInfo]:
    return client.toxics(proxy_name(learner))


def _shape(client: ToxiproxyClient, learner: int, *attrs: str) -> list[tuple[str, str, float, dict[str, int]]]:
    """(type, stream, toxicity, the named attributes) of each toxic, sorted; `attrs` empty keeps them all."""
    out = []
    for t in _toxics(client, learner).values():
        kept = {k: v for k, v in t.attributes.items() if not attrs or k in attrs}
        out.append((t.type, t.stream, t.toxicity, kept))
    return sorted(out, key=lambda x: (x[0], x[1], sorted(x[3].items())))


# ----------------------------------------------------------------------------- fixtures


@dataclass
class Rig:
    client: RecordingClient
    chaos: LinkChaos
    rec: Recorder
    ports: dict[int, int]

    def new_chaos(self, seed: int = SEED) -> LinkChaos:
        return LinkChaos(self.client, learners=2, seed=seed, on_event=Recorder(), fragment_bytes=FRAGMENT_BYTES,
                         step_s=STEP_S)


@pytest.fixture
def rig(echo: str) -> Iterator[Rig]:
    """A fresh embedded Toxiproxy with proxies learner-0 and learner-1 in front of the echo server."""
    with EmbeddedToxiproxy(host="127.0.0.1", port=0) as server:
        client = RecordingClient(server.url, timeout_s=5.0)
        ports = {}
        for i in range(2):
            info = client.create_proxy(proxy_name(i), echo, listen="127.0.0.1:0")
            assert info.enabled and info.listen_port > 0
            ports[i] = info.listen_port
        rec = Recorder()
        chaos = LinkChaos(client, learners=2, seed=SEED, on_event=rec, fragment_bytes=FRAGMENT_BYTES, step_s=STEP_S)
        r = Rig(client, chaos, rec, ports)
        try:
            yield r
        finally:
            chaos.clear_all()  # stops jitter/flap threads before the server goes


# ----------------------------------------------------------------------------- basics


def test_proxy_name() -> None:
    assert proxy_name(0) == "learner-0"
    assert proxy_name(13) == "learner-13"


def test_links_pass_data_before_any_fault(rig: Rig) -> None:
    for i in range(2):
        assert _echo(rig.ports[i], b"x" * 100) == b"x" * 100
        assert _toxics(rig.client, i) == {}
    assert rig.chaos.active() == []
    assert rig.rec.calls == []


# ----------------------------------------------------------------------------- degrade


def test_degrade_latency_and_bandwidth_toxics_delay_and_clear(rig: Rig) -> None:
    client, chaos = rig.client, rig.chaos
    # A toxic LinkChaos did not make: clear() must leave it alone.
    client.add_toxic(proxy_name(0), "bystander", "noop", stream="downstream")
    latency_ms, kbps = 200, 8000

    fault = chaos.degrade(0, latency_ms=latency_ms, bandwidth_kbps=kbps)

    assert isinstance(fault, LinkFault) and fault.kind == "degrade" and fault.learner == 0
    assert fault.thread is None  # no jitter, no thread
    toxics = _toxics(client, 0)
    ours = {n: t for n, t in toxics.items() if n != "bystander"}
    assert len(ours) == 4
    assert {name for _, name in fault.toxics} == set(ours)
    assert all(proxy == "learner-0" for proxy, _ in fault.toxics)
    lat = sorted((t.stream, t.attributes["latency"], t.attributes["jitter"]) for t in ours.values()
                 if t.type == "latency")
    assert lat == [("downstream", 100, 0), ("upstream", 100, 0)]  # half of the round trip each way
    bw = sorted((t.stream, t.attributes["rate"]) for t in ours.values() if t.type == "bandwidth")
    assert bw == [("downstream", 1000), ("upstream", 1000)]  # 8000 kbit/s = 1000 KB/s
    assert all(t.toxicity == 1.0 for t in ours.values())
    assert _toxics(client, 1) == {}
    assert chaos.active() == [fault]

    payload = b"round trip"
    with _connect(rig.ports[0]) as sock:
        t0 = time.monotonic()
        sock.sendall(payload)
        got = _recv_exact(sock, len(payload))
        elapsed_ms = (time.monotonic() - t0) * 1e3
    assert got == payload
    assert latency_ms <= elapsed_ms < latency_ms + 3000, elapsed_ms
    assert _echo(rig.ports[1]) == b"hello through the link"

    fault.clear()
    assert set(_toxics(client, 0)) == {"bystander"}
    assert chaos.active() == []
    assert fault.cleared and fault.toxics == []
    fault.clear()  # idempotent: no second event, no error
    assert rig.rec.names() == ["link_fault_on", "link_fault_off"]
    on, off = rig.rec.calls
    assert on[1] == {"learner": 0, "kind": "degrade", "latency_ms": latency_ms, "jitter_ms": 0.0,
                     "bandwidth_kbps": kbps}
    assert off[1] == {"learner": 0, "kind": "degrade"}


@pytest.mark.parametrize(("kbps", "rate"), [(800, 100), (1004, 126), (4, 1)])
def test_degrade_bandwidth_rate_is_kbps_over_8_at_least_1(rig: Rig, kbps: float, rate: int) -> None:
    rig.chaos.degrade(1, bandwidth_kbps=kbps)
    assert _shape(rig.client, 1, "rate") == [("bandwidth", s, 1.0, {"rate": rate}) for s in ("downstream", "upstream")]
    assert _toxics(rig.client, 0) == {}


def test_degrade_profile_resolves_through_wan_profiles(rig: Rig) -> None:
    # wan-2gbps-40ms: transfer_steps 4, rtt_steps 0.04, no jitter. With 68 500-byte fragments and 0.15 s steps:
    # rate = 68500 / (4 * 0.15) B/s = 114 166.7 B/s = 913.3 kbit/s -> 114 KB/s;
    # RTT = 0.04 * 0.15 s = 6 ms -> 3 ms each way.
    fault = rig.chaos.degrade(0, profile="wan-2gbps-40ms")
    assert fault.thread is None
    assert _shape(rig.client, 0, "latency", "rate", "jitter") == [
        ("bandwidth", "downstream", 1.0, {"rate": 114}),
        ("bandwidth", "upstream", 1.0, {"rate": 114}),
        ("latency", "downstream", 1.0, {"latency": 3, "jitter": 0}),
        ("latency", "upstream", 1.0, {"latency": 3, "jitter": 0}),
    ]
    (ev, fields), = rig.rec.calls
    assert ev == "link_fault_on" and fields["kind"] == "degrade"
    assert fields["latency_ms"] == pytest.approx(6.0)
    assert fields["bandwidth_kbps"] == pytest.approx(913.333, rel=1e-4)
    assert fields["jitter_ms"] == 0.0


def test_degrade_profile_explicit_fields_override(rig: Rig) -> None:
    rig.chaos.degrade(0, profile="wan-2gbps-40ms", latency_ms=50, bandwidth_kbps=1600)
    assert _shape(rig.client, 0, "latency", "rate") == [
        ("bandwidth", "downstream", 1.0, {"rate": 200}),
        ("bandwidth", "upstream", 1.0, {"rate": 200}),
        ("latency", "downstream", 1.0, {"latency": 25}),
        ("latency", "upstream", 1.0, {"latency": 25}),
    ]


def test_degrade_jitter_updates_latency_within_bounds_and_by_seed(rig: Rig) -> None:
    client = rig.client
    fault = rig.chaos.degrade(0, latency_ms=40, jitter_ms=20)
    assert fault.thread is not None and fault.thread.is_alive()
    names = sorted(n for _, n in fault.toxics)
    assert len(names) == 2 and all(n.startswith("latency-") for n in names)

    observed: list[int] = []

    def moved() -> bool:
        values = [t.attributes["latency"] for t in _toxics(client, 0).values() if t.type == "latency"]
        observed.extend(values)
        return any(v != 20 for v in values)

    assert _wait_until(moved), f"latency never left 20 within {WAIT_S}s: {observed}"
    assert observed and all(10 <= v <= 30 for v in observed), observed  # half of 40 +- 20

    # Both directions get the same seeded value each period; the sequence is the one the run's seed fixes.
    assert _wait_until(lambda: all(len(client.latency_updates("learner-0", n)) >= 3 for n in names))
    fault.clear()
    assert not fault.thread.is_alive()
    ups, downs = (client.latency_updates("learner-0", n) for n in names)
    n = min(len(ups), len(downs))
    assert ups[:n] == downs[:n]
    rng = random.Random(f"{SEED}/jitter/0")
    expected = [round(max(0.0, 40 + rng.uniform(-20, 20)) / 2) for _ in range(n)]
    assert ups[:n] == expected
    assert set(observed) <= {20, *expected}
    assert _toxics(client, 0) == {}


def test_jitter_sequence_is_fixed_by_seed_and_learner(rig: Rig) -> None:
    client = rig.client

    def draws(chaos: LinkChaos, learner: int, count: int = 3) -> list[int]:
        since = len(client.updates)  # toxic names restart with every LinkChaos: count only this one's
        fault = chaos.degrade(learner, latency_ms=40, jitter_ms=20)
        name = next(n for _, n in fault.toxics if n.startswith("latency-"))
        proxy = proxy_name(learner)
        assert _wait_until(lambda: len(client.latency_updates(proxy, name, since)) >= count,
                           timeout_s=WAIT_S + count * JITTER_PERIOD_S)
        fault.clear()
        return client.latency_updates(proxy, name, since)[:count]

    first = draws(rig.new_chaos(SEED), 0)
    again = draws(rig.new_chaos(SEED), 0)
    other_seed = draws(rig.new_chaos(SEED + 1), 0)
    other_learner = draws(rig.new_chaos(SEED), 1)
    assert first == again
    assert first != other_seed
    assert first != other_learner
    assert _toxics(client, 0) == {} and _toxics(client, 1) == {}


# ----------------------------------------------------------------------------- partition / heal


def test_partition_blackhole_silences_new_connections_until_heal(rig: Rig) -> None:
    fault = rig.chaos.partition(0, mode="blackhole")
    assert fault.kind == "partition" and not fault.disabled
    assert _shape(rig.client, 0, "timeout") == [("timeout", s, 1.0, {"timeout": 0})
                                                 for s in ("downstream", "upstream")]
    assert rig.client.get_proxy("learner-0").enabled
    with _connect(rig.ports[0], timeout_s=0.5) as sock:  # the handshake completes: the path just goes dead
        sock.sendall(b"anyone there?")
        with pytest.raises(TimeoutError):
            sock.recv(100)
    assert _echo(rig.ports[1]) == b"hello through the link"  # the other learner's link is untouched

    rig.chaos.heal(0)
    assert fault.cleared
    assert _toxics(rig.client, 0) == {}
    assert _echo(rig.ports[0]) == b"hello through the link"
    assert rig.rec.names() == ["link_fault_on", "link_fault_off"]
    assert rig.rec.calls[0][1] == {"learner": 0, "kind": "partition", "mode": "blackhole"}


def test_partition_refuse_disables_proxy_until_heal(rig: Rig) -> None:
    with _connect(rig.ports[0]) as live:
        live.sendall(b"before")
        assert _recv_exact(live, 6) == b"before"
        fault = rig.chaos.partition(0, mode="refuse")
        assert _recv_until_closed(live) == b""  # live connections are dropped
    assert fault.disabled
    assert _toxics(rig.client, 0) == {}
    assert rig.client.get_proxy("learner-0").enabled is False
    try:
        with _connect(rig.ports[0], timeout_s=1.0) as sock:
            sock.sendall(b"x")
            assert _recv_until_closed(sock) == b""  # if the connect got through at all, it is closed at once
    except (ConnectionRefusedError, ConnectionResetError, BrokenPipeError):
        pass

    rig.chaos.heal(0)
    assert rig.client.get_proxy("learner-0").enabled is True
    assert not fault.disabled
    assert _echo(rig.ports[0]) == b"hello through the link"


def test_heal_ends_partitions_and_flaps_but_keeps_degradations(rig: Rig) -> None:
    deg = rig.chaos.degrade(0, latency_ms=10)
    part = rig.chaos.partition(0)
    flap = rig.chaos.flap(0, period_s=0.2, duty=0.5)
    other = rig.chaos.partition(1)
    rig.chaos.heal(0)
    assert part.cleared and flap.cleared and not deg.cleared and not other.cleared
    assert flap.thread is not None and not flap.thread.is_alive()
    assert {t.type for t in _toxics(rig.client, 0).values()} == {"latency"}
    assert {t.type for t in _toxics(rig.client, 1).values()} == {"timeout"}
    assert sorted(f.kind for f in rig.chaos.active()) == ["degrade", "partition"]


def test_overlapping_refuse_partitions_keep_link_down_until_last_clears(rig: Rig) -> None:
    first = rig.chaos.partition(0, mode="refuse")
    second = rig.chaos.partition(0, mode="refuse")
    first.clear()
    assert rig.client.get_proxy("learner-0").enabled is False, "link came back while a partition is active"
    second.clear()
    assert rig.client.get_proxy("learner-0").enabled is True


def test_reset_connections_does_not_heal_a_refuse_partition(rig: Rig) -> None:
    rig.chaos.partition(0, mode="refuse")
    rig.chaos.reset_connections(0)
    assert rig.client.get_proxy("learner-0").enabled is False


# ----------------------------------------------------------------------------- flap


@pytest.mark.parametrize("mode", ["blackhole", "refuse"])
def test_flap_goes_down_and_up_and_clear_restores(rig: Rig, mode: str) -> None:
    fault = rig.chaos.flap(0, period_s=0.4, duty=0.5, mode=mode)
    assert fault.kind == "flap" and fault.thread is not None

    def flaps() -> list[bool]:
        return [f["down"] for ev, f in rig.rec.calls if ev == "link_flap"]

    assert _wait_until(lambda: True in flaps() and False in flaps()[flaps().index(True):]), rig.rec.calls
    fault.clear()
    seen = flaps()
    assert seen[0] is True and seen[-1] is False, seen  # starts down, ends up
    assert all(a != b for a, b in zip(seen, seen[1:], strict=False)), seen  # strictly alternating
    assert all(f["learner"] == 0 for ev, f in rig.rec.calls if ev == "link_flap")
    assert not fault.thread.is_alive()
    assert not [t for t in _toxics(rig.client, 0).values() if t.type == "timeout"]
    assert _toxics(rig.client, 0) == {}
    assert rig.client.get_proxy("learner-0").enabled is True
    names = rig.rec.names()
    assert names[0] == "link_fault_on" and names[-1] == "link_fault_off"
    assert rig.rec.calls[-2] == ("link_flap", {"learner": 0, "down": False})  # ended up, not down
    assert _echo(rig.ports[0]) == b"hello through the link"


# ----------------------------------------------------------------------------- resets


def test_reset_peer_resets_connections_until_cleared(rig: Rig) -> None:
    fault = rig.chaos.reset_peer(0, timeout_ms=0)
    assert _shape(rig.client, 0, "timeout") == [("reset_peer", "upstream", 1.0, {"timeout": 0})]
    with _connect(rig.ports[0]) as sock:
        _send_ignoring_close(sock, b"this will not arrive")
        assert _recv_until_closed(sock) == b""  # RST (ConnectionResetError) or EOF, never an echo
    fault.clear()
    assert _toxics(rig.client, 0) == {}
    assert _echo(rig.ports[0]) == b"hello through the link"
    assert rig.rec.calls[0][1] == {"learner": 0, "kind": "reset_peer", "timeout_ms": 0}


def test_reset_connections_drops_live_connection_then_link_works(rig: Rig) -> None:
    with _connect(rig.ports[0]) as live, _connect(rig.ports[1]) as bystander:
        for sock in (live, bystander):
            sock.sendall(b"ping")
            assert _recv_exact(sock, 4) == b"ping"
        rig.chaos.reset_connections(0)
        assert _recv_until_closed(live) == b""
        bystander.sendall(b"still here")  # learner-1's connection is not touched
        assert _recv_exact(bystander, 10) == b"still here"
    assert rig.client.get_proxy("learner-0").enabled is True
    assert rig.client.get_proxy("learner-0").listen_port == rig.ports[0]
    assert _echo(rig.ports[0]) == b"hello through the link"
    assert rig.rec.calls == [("link_connections_dropped", {"learner": 0, "already_refused": False})]
    assert rig.chaos.active() == []  # one-shot: nothing to clear


# ----------------------------------------------------------------------------- slicing / truncation


def test_slicing_delivers_data_intact(rig: Rig) -> None:
    fault = rig.chaos.corrupt_by_slicing(0, average_size=16, size_variation=8, delay_us=0)
    assert fault.kind == "slice"
    assert _shape(rig.client, 0) == [
        ("slicer", s, 1.0, {"average_size": 16, "size_variation": 8, "delay": 0}) for s in ("downstream", "upstream")
    ]
    payload = _payload(BIG)
    with _connect(rig.ports[0]) as sock:
        sock.sendall(payload)
        assert _recv_exact(sock, BIG) == payload
    fault.clear()
    assert _toxics(rig.client, 0) == {}


def _assert_truncated(port: int, limit: int) -> None:
    payload = _payload(BIG)
    with _connect(port) as sock:
        _send_ignoring_close(sock, payload)
        got = _recv_until_closed(sock)  # a TimeoutError here means the connection was never cut
    assert len(got) <= limit < BIG
    assert got == payload[:len(got)]


def test_slicing_with_limit_cuts_connection(rig: Rig) -> None:
    rig.chaos.corrupt_by_slicing(0, average_size=16, size_variation=8, delay_us=0, limit_bytes=1000)
    limits = [t for t in _toxics(rig.client, 0).values() if t.type == "limit_data"]
    assert [(t.stream, t.attributes) for t in limits] == [("upstream", {"bytes": 1000})]
    _assert_truncated(rig.ports[0], 1000)
    assert rig.rec.calls[0][1]["limit_bytes"] == 1000


def test_limit_data_cuts_connection_until_cleared(rig: Rig) -> None:
    fault = rig.chaos.limit_data(0, 500)
    assert fault.kind == "limit_data"
    assert _shape(rig.client, 0) == [("limit_data", "upstream", 1.0, {"bytes": 500})]
    _assert_truncated(rig.ports[0], 500)
    fault.clear()
    payload = _payload(BIG)
    with _connect(rig.ports[0]) as sock:
        sock.sendall(payload)
        assert _recv_exact(sock, BIG) == payload


# ----------------------------------------------------------------------------- apply(FaultSpec)


_BOTH = ("downstream", "upstream")


def _apply(rig: Rig, spec: FaultSpec) -> Any:
    """Start a fault as the run's FaultRunner does: through its kind in the fault registry."""
    handle: FaultHandle = faults.get(spec.action).apply(faults.FaultContext(links=rig.chaos), spec)
    return handle


@pytest.mark.parametrize(("raw", "kind", "expected"), [
    ({"action": "degrade", "latency_ms": 100, "bandwidth_kbps": 800}, "degrade",
     [("bandwidth", s, {"rate": 100}) for s in _BOTH] + [("latency", s, {"latency": 50}) for s in _BOTH]),
    ({"action": "degrade", "profile": "wan-2gbps-40ms"}, "degrade",
     [("bandwidth", s, {"rate": 114}) for s in _BOTH] + [("latency", s, {"latency": 3}) for s in _BOTH]),
    ({"action": "partition"}, "partition", [("timeout", s, {"timeout": 0}) for s in _BOTH]),
    ({"action": "partition", "mode": "refuse"}, "partition", []),
    ({"action": "reset_peer", "timeout_ms": 25}, "reset_peer", [("reset_peer", "upstream", {"timeout": 25})]),
    ({"action": "reset_peer"}, "reset_peer", [("reset_peer", "upstream", {"timeout": 0})]),
    ({"action": "slice", "average_size": 16, "size_variation": 8, "delay_us": 5}, "slice",
     [("slicer", s, {"average_size": 16, "size_variation": 8, "delay": 5}) for s in _BOTH]),
    ({"action": "limit_data", "bytes": 500}, "limit_data", [("limit_data", "upstream", {"bytes": 500})]),
], ids=["degrade", "degrade-profile", "blackhole", "refuse", "reset_peer", "reset_peer-default", "slice",
        "limit_data"])
def test_apply_dispatches_to_the_right_toxics(rig: Rig, raw: dict[str, Any], kind: str,
                                              expected: list[tuple[str, str, dict[str, int]]]) -> None:
    spec = parse_fault({**raw, "learner": 1}, "faults[0]", learners=2)
    fault = _apply(rig, spec)
    assert fault.kind == kind and fault.learner == 1
    keys = {k for _, _, attrs in expected for k in attrs}
    got = [(ty, stream, attrs) for ty, stream, tox, attrs in _shape(rig.client, 1, *keys)]
    assert got == sorted(expected, key=lambda x: (x[0], x[1], sorted(x[2].items())))
    assert all(t.toxicity == 1.0 for t in _toxics(rig.client, 1).values())
    assert rig.client.get_proxy("learner-1").enabled is (raw.get("mode") != "refuse")
    assert _toxics(rig.client, 0) == {}
    assert rig.chaos.active() == [fault]
    fault.clear()
    assert _toxics(rig.client, 1) == {}
    assert rig.client.get_proxy("learner-1").enabled is True


def test_apply_corrupt_adds_the_embedded_corrupt_toxic_both_ways(rig: Rig) -> None:
    """corrupt (an extension of the embedded server) is two plain toxics, one per direction, removed by clear()."""
    fault = _apply(rig, parse_fault({"action": "corrupt", "learner": 1, "probability": 0.002}, "faults[0]",
                                        learners=2))
    assert fault.kind == "corrupt" and fault.learner == 1
    assert [(ty, stream, attrs) for ty, stream, _, attrs in _shape(rig.client, 1)] == [
        ("corrupt", s, {"probability": 0.002}) for s in _BOTH]
    assert ("link_fault_on", {"learner": 1, "kind": "corrupt", "params": {"probability": 0.002}}) in rig.rec.calls
    fault.clear()
    assert _toxics(rig.client, 1) == {} and rig.chaos.active() == []


def test_apply_flap_and_jittered_profile_start_threads(rig: Rig) -> None:
    flap = _apply(rig, parse_fault({"action": "flap", "learner": 0, "period_s": 0.2, "duty": 0.5},
                                       "faults[0]", learners=2))
    jit = _apply(rig, parse_fault({"action": "degrade", "learner": 1, "profile": "transatlantic"},
                                      "faults[1]", learners=2))
    assert flap.kind == "flap" and flap.thread is not None and flap.thread.is_alive()
    assert jit.kind == "degrade" and jit.thread is not None and jit.thread.is_alive()
    assert _wait_until(lambda: any(ev == "link_flap" and f["down"] for ev, f in rig.rec.calls))
    on = [f for ev, f in rig.rec.calls if ev == "link_fault_on"]
    assert on[0] == {"learner": 0, "kind": "flap", "period_s": 0.2, "duty": 0.5}
    # transatlantic: RTT 0.08 * 0.15 s = 12 ms, jitter 10% of it
    assert on[1]["latency_ms"] == pytest.approx(12.0) and on[1]["jitter_ms"] == pytest.approx(1.2)
    rig.chaos.clear_all()
    assert not flap.thread.is_alive() and not jit.thread.is_alive()
    assert _toxics(rig.client, 0) == {} and _toxics(rig.client, 1) == {}


def test_a_process_action_finds_no_processes_to_act_on_and_adds_no_toxic(rig: Rig) -> None:
    spec = parse_fault({"action": "kill_chip", "learner": 0, "chip": 0}, "faults[0]", learners=2)
    with pytest.raises(RuntimeError, match="process faults need the run's process registry"):
        _apply(rig, spec)
    assert _toxics(rig.client, 0) == {} and rig.chaos.active() == []


# ----------------------------------------------------------------------------- scopes and clear_all


def test_clear_all_removes_overlapping_faults_on_both_learners(rig: Rig) -> None:
    chaos, client = rig.chaos, rig.client
    faults = [
        chaos.degrade(0, latency_ms=20, jitter_ms=10, bandwidth_kbps=8000),
        chaos.degrade(0, latency_ms=30),
        chaos.partition(0),
        chaos.flap(0, period_s=0.2, duty=0.5),
        chaos.corrupt_by_slicing(1, limit_bytes=10_000),
        chaos.limit_data(1, 5000),
        chaos.reset_peer(1, timeout_ms=100),
        chaos.partition(1, mode="refuse"),
    ]
    assert len(chaos.active()) == len(faults)
    assert len(_toxics(client, 0)) >= 8 and len(_toxics(client, 1)) == 5
    assert client.get_proxy("learner-1").enabled is False

    chaos.clear_all()

    assert chaos.active() == []
    assert all(f.cleared for f in faults)
    assert all(f.thread is None or not f.thread.is_alive() for f in faults)
    for i in range(2):
        assert _toxics(client, i) == {}
        assert client.get_proxy(proxy_name(i)).enabled is True
        assert _echo(rig.ports[i]) == b"hello through the link"
    names = rig.rec.names()
    assert names.count("link_fault_on") == names.count("link_fault_off") == len(faults)
    chaos.clear_all()  # nothing left: a no-op
    assert rig.rec.names().count("link_fault_off") == len(faults)


def test_link_fault_context_manager_clears_on_exception(rig: Rig) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with rig.chaos.partition(0) as fault, rig.chaos.degrade(1, latency_ms=10) as deg:
            assert len(_toxics(rig.client, 0)) == 2 and len(_toxics(rig.client, 1)) == 2
            raise RuntimeError("boom")
    assert fault.cleared and deg.cleared
    assert _toxics(rig.client, 0) == {} and _toxics(rig.client, 1) == {}
    assert rig.chaos.active() == []
    assert rig.rec.names() == ["link_fault_on", "link_fault_on", "link_fault_off", "link_fault_off"]


def test_link_fault_context_manager_clears_on_normal_exit(rig: Rig) -> None:
    with rig.chaos.limit_data(0, 100) as fault:
        assert fault in rig.chaos.active()
    assert fault.cleared and _toxics(rig.client, 0) == {}


def test_ownerless_link_fault_clear_is_a_no_op() -> None:
    fault = LinkFault("degrade", 0)
    fault.clear()
    assert not fault.cleared


# ----------------------------------------------------------------------------- argument checks


_CALLS: dict[str, Callable[[LinkChaos, int], object]] = {
    "degrade": lambda c, m: c.degrade(m, latency_ms=10),
    "partition": lambda c, m: c.partition(m),
    "flap": lambda c, m: c.flap(m, period_s=0.2, duty=0.5),
    "reset_peer": lambda c, m: c.reset_peer(m),
    "corrupt_by_slicing": lambda c, m: c.corrupt_by_slicing(m),
    "limit_data": lambda c, m: c.limit_data(m, 10),
    "reset_connections": lambda c, m: c.reset_connections(m),
}


@pytest.mark.parametrize("learner", [2, -1, 99])
@pytest.mark.parametrize("method", list(_CALLS))
def test_learner_out_of_range_raises_value_error(rig: Rig, method: str, learner: int) -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]") as err:
        _CALLS[method](rig.chaos, learner)
    assert str(learner) in str(err.value)
    assert rig.chaos.active() == [] and rig.rec.calls == []
    assert _toxics(rig.client, 0) == {} and _toxics(rig.client, 1) == {}


# ----------------------------------------------------------------------------- a sharded synchronizer


def test_sharded_link_faults_hit_every_proxy_of_the_learner_and_split_bandwidth(echo: str) -> None:
    """syncer.shards = 2: learner 0's link is proxies learner-0 and learner-0-shard1; a fault lands on both,
    a bandwidth cap is halved on each (the learner's total is the cap), a refuse partition cuts both, and
    clearing restores both; learner 1's proxies are untouched."""
    with EmbeddedToxiproxy(host="127.0.0.1", port=0) as server:
        client = RecordingClient(server.url, timeout_s=5.0)
        ports = {}
        for m in range(2):
            for k in range(2):
                ports[(m, k)] = client.create_proxy(proxy_name(m, k), echo, listen="127.0.0.1:0").listen_port
        chaos = LinkChaos(client, learners=2, seed=SEED, on_event=Recorder(), fragment_bytes=FRAGMENT_BYTES,
                          step_s=STEP_S, shards=2)
        try:
            fault = chaos.degrade(0, latency_ms=100, bandwidth_kbps=8000)
            assert {proxy for proxy, _ in fault.toxics} == {"learner-0", "learner-0-shard1"}
            for name in ("learner-0", "learner-0-shard1"):
                toxics = client.toxics(name).values()
                assert sorted((t.stream, t.attributes["rate"]) for t in toxics if t.type == "bandwidth") == [
                    ("downstream", 500), ("upstream", 500)]
                assert len(toxics) == 4
            assert client.toxics("learner-1") == {} and client.toxics("learner-1-shard1") == {}
            fault.clear()
            assert client.toxics("learner-0") == {} and client.toxics("learner-0-shard1") == {}
            cut = chaos.partition(0, mode="refuse")
            assert [client.get_proxy(proxy_name(0, k)).enabled for k in range(2)] == [False, False]
            assert _echo(ports[(1, 1)]) == b"hello through the link"
            cut.clear()
            assert all(_echo(ports[(0, k)]) == b"hello through the link" for k in range(2))
        finally:
            chaos.clear_all()
