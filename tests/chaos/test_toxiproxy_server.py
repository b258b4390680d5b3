"""Tests for diloco_chaos.chaos.toxiproxy_server, driven through toxiproxy-python like production code.

What: every API endpoint (including the 400/404/409/500 error shapes) and every toxic, on
real loopback sockets against a threaded echo upstream.  Timing assertions use generous
upper bounds and exact lower bounds (a toxic can never make data arrive *early*).

Why: the chaos harness talks to this server with toxiproxy-python, so the tests use that
client (``Toxiproxy``/``Proxy`` and, for calls it has no method for, its ``APIConsumer``).
The client's sharp edges are handled explicitly: it sets no HTTP timeouts (we swap in a
``requests`` facade with one), keeps the server address in the class attributes
``APIConsumer.host``/``port`` (set per test with monkeypatch), ``add_toxic`` returns None,
it cannot update a toxic (``APIConsumer.post`` to the toxic URL does), and a 500 on create
surfaces as ``KeyError``.  No sleeps: synchronisation is by socket timeouts and reads.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import toxiproxy.api
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from diloco_chaos.chaos.toxiproxy_server import VERSION, EmbeddedToxiproxy

HTTP_TIMEOUT_S = 10.0
UNMARSHAL = "bad request body: json: cannot unmarshal"
SOCK_TIMEOUT_S = 5.0


# ----------------------------------------------------------------------------- helpers



class _TimeoutRequests:
    """Stand-in for the ``requests`` module inside toxiproxy.api: adds a default timeout."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self._timeout)
        return requests.get(url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self._timeout)
        return requests.post(url, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self._timeout)
        return requests.delete(url, **kwargs)


def _hostport(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _connect(proxy: Proxy) -> socket.socket:
    sock = socket.create_connection(_hostport(proxy.listen), timeout=SOCK_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    parts: list[bytes] = []
    got = 0
    while got < size:
        data = sock.recv(size - got)
        if not data:
            raise EOFError(f"EOF after {got}/{size} bytes")
        parts.append(data)
        got += len(data)
    return b"".join(parts)


def _recv_all(sock: socket.socket) -> bytes:
    parts: list[bytes] = []
    while data := sock.recv(65536):
        parts.append(data)
    return b"".join(parts)


def _rtt(sock: socket.socket, payload: bytes = b"ping") -> float:
    start = time.perf_counter()
    sock.sendall(payload)
    assert _recv_exact(sock, len(payload)) == payload
    return time.perf_counter() - start


def _error_body(exc: BaseException) -> dict[str, Any]:
    """toxiproxy-python puts the raw response body in the exception's args."""
    return json.loads(exc.args[0])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedToxiproxy]:
    with EmbeddedToxiproxy(seed=1234) as srv:
        yield srv


@pytest.fixture
def tp(server: EmbeddedToxiproxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[Toxiproxy]:
    # toxiproxy-python keeps the server address process-globally on APIConsumer and
    # calls requests without a timeout: point it at our server and bound every call.
    monkeypatch.setattr(APIConsumer, "host", "127.0.0.1")
    monkeypatch.setattr(APIConsumer, "port", server.port)
    monkeypatch.setattr(toxiproxy.api, "requests", _TimeoutRequests(HTTP_TIMEOUT_S))
    client = Toxiproxy()
    yield client
    client.destroy_all()


@pytest.fixture
def proxy(tp: Toxiproxy, echo: str) -> Proxy:
    return tp.create(upstream=echo, name="learner0", listen="127.0.0.1:0")


# ----------------------------------------------------------------------------- API


def test_version_and_running(tp: Toxiproxy, server: EmbeddedToxiproxy) -> None:
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert tp.running() is True
    assert json.loads(tp.version()) == {"version": VERSION}
    assert APIConsumer.get("/version").headers["Content-Type"].startswith("application/json")


def test_proxy_create_list_show_delete(tp: Toxiproxy, echo: str) -> None:
    created = tp.create(upstream=echo, name="a", listen="127.0.0.1:0")
    host, port = _hostport(created.listen)
    assert host == "127.0.0.1" and port != 0 and created.enabled is True
    response = APIConsumer.post("/proxies", json={"name": "b", "upstream": echo, "listen": "127.0.0.1:0"})
    assert response.status_code == 201
    assert sorted(tp.proxies()) == ["a", "b"]
    assert tp.get_proxy("a").listen == created.listen
    shown = APIConsumer.get("/proxies/a")
    assert shown.status_code == 200
    assert shown.json() == {
        "name": "a",
        "listen": created.listen,
        "upstream": echo,
        "enabled": True,
        "toxics": [],
    }
    index = APIConsumer.get("/proxies").json()
    assert list(index) == ["a", "b"] and index["b"]["toxics"] == []
    assert APIConsumer.delete("/proxies/b").status_code == 204
    assert created.destroy() is True
    assert tp.proxies() == {}
    with pytest.raises(NotFound) as err:
        created.destroy()
    assert _error_body(err.value) == {"error": "proxy not found", "status": 404}


def test_disabled_proxy_created_and_update_listen(tp: Toxiproxy, echo: str) -> None:
    body = {"name": "off", "upstream": echo, "listen": "127.0.0.1:0", "enabled": False}
    created = APIConsumer.post("/proxies", json=body).json()
    assert created["enabled"] is False and created["listen"] == "127.0.0.1:0"
    enabled = APIConsumer.post("/proxies/off", json={"enabled": True}).json()
    assert enabled["enabled"] is True and _hostport(enabled["listen"])[1] != 0
    with socket.create_connection(_hostport(enabled["listen"]), timeout=SOCK_TIMEOUT_S) as sock:
        assert _rtt(sock) < 1.0


def test_duplicate_proxy_is_409(tp: Toxiproxy, proxy: Proxy, echo: str) -> None:
    with pytest.raises(ProxyExists):  # client-side check in Toxiproxy.create
        tp.create(upstream=echo, name=proxy.name, listen="127.0.0.1:0")
    with pytest.raises(ProxyExists) as err:  # the server's own 409
        APIConsumer.post("/proxies", json={"name": proxy.name, "upstream": echo, "listen": "127.0.0.1:0"})
    assert _error_body(err.value) == {"error": "proxy already exists", "status": 409}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"upstream": "127.0.0.1:1"}, "missing required field: name"),
        ({"name": "x"}, "missing required field: upstream"),
        ({"name": "x", "upstream": "127.0.0.1:1", "enabled": "yes"}, UNMARSHAL),
        (b"{not json", "bad request body: invalid character"),
        (b"", "bad request body: EOF"),
        (b"[1, 2]", f"{UNMARSHAL} array"),
    ],
)
def test_proxy_create_bad_body_is_400(tp: Toxiproxy, body: Any, message: str) -> None:
    with pytest.raises(InvalidToxic) as err:  # toxiproxy-python maps every 400 to InvalidToxic
        if isinstance(body, bytes):
            APIConsumer.post("/proxies", data=body)
        else:
            APIConsumer.post("/proxies", json=body)
    payload = _error_body(err.value)
    assert payload["status"] == 400 and payload["error"].startswith(message)
    assert tp.proxies() == {}


def test_unknown_proxy_toxic_and_route_are_404(tp: Toxiproxy, proxy: Proxy) -> None:
    calls = [
        lambda: APIConsumer.get("/proxies/nope"),
        lambda: APIConsumer.post("/proxies/nope", json={"enabled": False}),
        lambda: APIConsumer.delete("/proxies/nope"),
        lambda: APIConsumer.get("/proxies/nope/toxics"),
        lambda: APIConsumer.post("/proxies/nope/toxics", json={"type": "latency"}),
        lambda: APIConsumer.get("/proxies/nope/toxics/t"),
    ]
    for call in calls:
        with pytest.raises(NotFound) as err:
            call()
        assert _error_body(err.value) == {"error": "proxy not found", "status": 404}
    base = f"/proxies/{proxy.name}/toxics/nope"
    for call in (
        lambda: APIConsumer.get(base),
        lambda: APIConsumer.post(base, json={"attributes": {}}),
        lambda: APIConsumer.delete(base),
    ):
        with pytest.raises(NotFound) as err:
            call()
        assert _error_body(err.value) == {"error": "toxic not found", "status": 404}
    assert proxy.get_toxic("nope") is None
    with pytest.raises(NotFound) as err:
        APIConsumer.get("/no/such/route")
    assert err.value.args[0] == b"404 page not found\n"
    assert APIConsumer.get("/reset").status_code == 405  # route exists, method doesn't
    assert APIConsumer.get("/proxies", headers={"User-Agent": "Mozilla/5.0"}).status_code == 403


def test_listen_failure_is_500_which_client_create_turns_into_keyerror(tp: Toxiproxy, echo: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(KeyError):  # Proxy(**{"error":..., "status": 500}) has no "name"
            tp.create(upstream=echo, name="clash", listen=listen)
        response = APIConsumer.post("/proxies", json={"name": "clash", "upstream": echo, "listen": listen})
    assert response.status_code == 500
    payload = json.loads(response.content)
    assert payload["status"] == 500 and payload["error"].startswith(f"listen tcp {listen}")
    assert tp.proxies() == {}


def test_populate_creates_keeps_and_replaces(tp: Toxiproxy, echo: str) -> None:
    spec = [
        {"name": "l0", "upstream": echo, "listen": "127.0.0.1:0"},
        {"name": "l1", "upstream": echo, "listen": "127.0.0.1:0", "enabled": False},
    ]
    response = APIConsumer.post("/populate", json=spec)
    assert response.status_code == 201
    created = {p["name"]: p for p in response.json()["proxies"]}
    assert set(created) == {"l0", "l1"} and created["l1"]["enabled"] is False
    l0 = tp.get_proxy("l0")
    l0.add_toxic(type="latency", attributes={"latency": 10})
    # Same upstream+listen: kept as is (toxic survives); changed upstream: replaced.
    again = [
        {"name": "l0", "upstream": echo, "listen": l0.listen},
        {"name": "l1", "upstream": f"127.0.0.1:{_closed_port()}", "listen": "127.0.0.1:0"},
    ]
    second = APIConsumer.post("/populate", json=again).json()["proxies"]
    assert second[0]["listen"] == l0.listen
    assert [t["name"] for t in second[0]["toxics"]] == ["latency_downstream"]
    assert second[1]["upstream"] == again[1]["upstream"] and second[1]["enabled"] is True
    with pytest.raises(InvalidToxic) as err:
        APIConsumer.post("/populate", json=[{"name": "ok", "upstream": echo}, {"upstream": echo}])
    assert _error_body(err.value) == {
        "error": "missing required field: name at proxy 2",
        "status": 400,
        "proxies": None,
    }
    with pytest.raises(InvalidToxic):
        APIConsumer.post("/populate", json={"name": "not-a-list"})
    assert sorted(tp.proxies()) == ["l0", "l1"]


def test_toxic_crud(tp: Toxiproxy, proxy: Proxy, server: EmbeddedToxiproxy) -> None:
    assert proxy.add_toxic(type="latency", attributes={"latency": 50}) is None  # client returns None
    proxy.add_toxic(type="bandwidth", stream="upstream", name="bw", toxicity=0.5, attributes={"rate": 7})
    toxics = proxy.toxics()
    assert sorted(toxics) == ["bw", "latency_downstream"]
    assert toxics["latency_downstream"].attributes == {"latency": 50, "jitter": 0}
    assert toxics["latency_downstream"].toxicity == 1
    # Toxiproxy lists upstream toxics before downstream ones.
    listed = APIConsumer.get(f"/proxies/{proxy.name}/toxics").json()
    assert [t["name"] for t in listed] == ["bw", "latency_downstream"]
    assert APIConsumer.get(f"/proxies/{proxy.name}/toxics/bw").json() == {
        "attributes": {"rate": 7},
        "name": "bw",
        "type": "bandwidth",
        "stream": "upstream",
        "toxicity": 0.5,
    }
    with pytest.raises(ProxyExists) as err:
        proxy.add_toxic(type="latency", attributes={"latency": 1})
    assert _error_body(err.value) == {"error": "toxic already exists", "status": 409}
    made = APIConsumer.post(f"/proxies/{proxy.name}/toxics", json={"type": "slow_close"})
    assert made.status_code == 200  # Toxiproxy answers 200, not 201, for a new toxic
    assert made.json()["name"] == "slow_close_downstream" and made.json()["attributes"] == {"delay": 0}
    assert proxy.destroy_toxic("slow_close_downstream") is True
    # toxiproxy-python cannot update a toxic; its APIConsumer can POST to the toxic URL.
    change = {"attributes": {"jitter": 5}, "toxicity": 0.25}
    updated = APIConsumer.post(f"/proxies/{proxy.name}/toxics/latency_downstream", json=change)
    assert updated.status_code == 200
    assert updated.json()["attributes"] == {"latency": 50, "jitter": 5} and updated.json()["toxicity"] == 0.25
    # PATCH (toxiproxy-cli's verb) has no APIConsumer method: plain urllib here.
    request = urllib.request.Request(
        f"{server.url}/proxies/{proxy.name}/toxics/bw",
        data=json.dumps({"attributes": {"rate": 9}}).encode(),
        headers={"Content-Type": "application/json"},
        method="PATCH",
    )
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        assert response.status == 200 and json.loads(response.read())["attributes"] == {"rate": 9}
    assert APIConsumer.get(f"/proxies/{proxy.name}").json()["toxics"][0]["attributes"] == {"rate": 9}
    assert proxy.destroy_toxic("bw") is True
    assert APIConsumer.delete(f"/proxies/{proxy.name}/toxics/latency_downstream").status_code == 204
    assert proxy.toxics() == {}
    with pytest.raises(NotFound):
        APIConsumer.get(f"/proxies/{proxy.name}/toxics/bw")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"type": "latency", "stream": "sideways"}, 400, "stream was invalid"),
        ({"type": "earthquake"}, 400, "invalid toxic type"),
        ({"type": "latency", "attributes": {"latency": 1.5}}, 400, UNMARSHAL),
        ({"type": "latency", "attributes": {"latency": "100"}}, 400, UNMARSHAL),
        ({"type": "latency", "toxicity": "all"}, 400, UNMARSHAL),
        (b"{", 400, "bad request body"),
    ],
)
def test_toxic_bad_body_is_400(proxy: Proxy, body: Any, status: int, message: str) -> None:
    url = f"/proxies/{proxy.name}/toxics"
    with pytest.raises(InvalidToxic) as err:
        APIConsumer.post(url, data=body) if isinstance(body, bytes) else APIConsumer.post(url, json=body)
    payload = _error_body(err.value)
    assert payload["status"] == status and payload["error"].startswith(message)
    assert proxy.toxics() == {}


# ----------------------------------------------------------------------------- toxics


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_latency_adds_at_least_latency(proxy: Proxy, stream: str) -> None:
    proxy.add_toxic(type="latency", stream=stream, attributes={"latency": 100})
    with _connect(proxy) as sock:
        rtts = [_rtt(sock) for _ in range(3)]
    assert min(rtts) >= 0.100 and max(rtts) < 0.6


def test_latency_jitter_varies_within_bounds(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 100, "jitter": 50})
    with _connect(proxy) as sock:
        rtts = [_rtt(sock) for _ in range(6)]
    assert min(rtts) >= 0.050 and max(rtts) < 0.6
    assert max(rtts) - min(rtts) > 0.005  # uniform on [50, 150) ms: all-equal means no jitter


def test_toxic_added_and_removed_on_live_connection(proxy: Proxy) -> None:
    with _connect(proxy) as sock:
        assert _rtt(sock) < 0.1
        proxy.add_toxic(type="latency", attributes={"latency": 150})
        assert _rtt(sock) >= 0.150
        proxy.destroy_toxic("latency_downstream")
        assert _rtt(sock) < 0.1


def test_removing_toxic_releases_held_chunk(proxy: Proxy) -> None:
    proxy.add_toxic(type="latency", attributes={"latency": 5000})
    with _connect(proxy) as sock:
        sock.sendall(b"held")
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(4)
        sock.settimeout(SOCK_TIMEOUT_S)
        start = time.perf_counter()
        proxy.destroy_toxic("latency_downstream")
        assert _recv_exact(sock, 4) == b"held"
        assert time.perf_counter() - start < 1.0


def test_bandwidth_limits_throughput(proxy: Proxy) -> None:
    proxy.add_toxic(type="bandwidth", attributes={"rate": 100})  # 100 KB/s = 100_000 B/s
    payload = bytes(range(256)) * 800  # 204_800 bytes -> ~2.05 s
    with _connect(proxy) as sock:
        start = time.perf_counter()
        sock.sendall(payload)
        received = _recv_exact(sock, len(payload))
        elapsed = time.perf_counter() - start
    assert received == payload
    expected = len(payload) / 100_000
    assert expected * 0.8 <= elapsed <= expected * 1.2, f"{elapsed:.3f}s for {expected:.3f}s expected"


def test_limit_data_closes_after_n_bytes(proxy: Proxy) -> None:
    proxy.add_toxic(type="limit_data", attributes={"bytes": 1000})
    payload = bytes(range(256)) * 16
    with _connect(proxy) as sock:
        sock.sendall(payload)
        assert _recv_all(sock) == payload[:1000]


def test_slicer_delivers_all_bytes_in_pieces(proxy: Proxy) -> None:
    proxy.add_toxic(type="slicer", attributes={"average_size": 200, "size_variation": 50, "delay": 2000})
    payload = bytes(range(256)) * 40  # 10_240 bytes -> ~50 slices, 2 ms apart
    pieces: list[bytes] = []
    with _connect(proxy) as sock:
        sock.sendall(payload)
        got = 0
        while got < len(payload):
            piece = sock.recv(65536)
            assert piece, "unexpected EOF"
            pieces.append(piece)
            got += len(piece)
    assert b"".join(pieces) == payload
    assert len(pieces) >= 10, f"only {len(pieces)} pieces"


def test_reset_peer_resets_after_timeout(proxy: Proxy) -> None:
    proxy.add_toxic(type="reset_peer", attributes={"timeout": 200})
    with _connect(proxy) as sock:
        start = time.perf_counter()
        sock.sendall(b"hello")
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert time.perf_counter() - start >= 0.200


def test_timeout_holds_data_then_closes(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", attributes={"timeout": 300})
    with _connect(proxy) as sock:
        start = time.perf_counter()
        sock.sendall(b"lost")
        assert sock.recv(100) == b""  # no data, then EOF
        elapsed = time.perf_counter() - start
    assert 0.300 <= elapsed < 2.0


def test_timeout_zero_holds_forever_until_removed(proxy: Proxy) -> None:
    proxy.add_toxic(type="timeout", attributes={"timeout": 0})
    with _connect(proxy) as sock:
        sock.sendall(b"lost")
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(100)
        sock.settimeout(SOCK_TIMEOUT_S)
        proxy.destroy_toxic("timeout_downstream")
        assert sock.recv(100) == b""  # Toxiproxy closes links whose data a timeout toxic dropped
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0


def test_slow_close_delays_eof(proxy: Proxy) -> None:
    def time_to_eof() -> float:
        with _connect(proxy) as sock:
            assert _rtt(sock) < 1.0
            start = time.perf_counter()
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(100) == b""
            return time.perf_counter() - start

    assert time_to_eof() < 0.2
    proxy.add_toxic(type="slow_close", attributes={"delay": 300})
    assert 0.300 <= time_to_eof() < 2.0


def test_toxicity_is_per_connection_and_seeded(echo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(toxiproxy.api, "requests", _TimeoutRequests(HTTP_TIMEOUT_S))

    def pattern(seed: int) -> list[bool]:
        with EmbeddedToxiproxy(seed=seed) as srv:
            monkeypatch.setattr(APIConsumer, "host", "127.0.0.1")
            monkeypatch.setattr(APIConsumer, "port", srv.port)
            proxy = Toxiproxy().create(upstream=echo, name="p", listen="127.0.0.1:0")
            proxy.add_toxic(type="limit_data", toxicity=0.5, attributes={"bytes": 0})
            cut: list[bool] = []
            for _ in range(16):
                with _connect(proxy) as sock:
                    sock.sendall(b"x")
                    cut.append(sock.recv(1) == b"")
            return cut

    first, second, other = pattern(7), pattern(7), pattern(8)
    assert first == second
    assert any(first) and not all(first)
    assert first != other


def test_disable_drops_connections_and_enable_relistens(tp: Toxiproxy, proxy: Proxy) -> None:
    address = _hostport(proxy.listen)
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0
        proxy.disable()
        assert sock.recv(100) == b""  # EOF, not a reset
    assert tp.get_proxy(proxy.name).enabled is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=SOCK_TIMEOUT_S).close()
    proxy.enable()
    assert tp.get_proxy(proxy.name).listen == proxy.listen
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0
        with proxy.down():
            assert sock.recv(100) == b""
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(address, timeout=SOCK_TIMEOUT_S).close()
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0


def test_reset_removes_toxics_and_enables_proxies(tp: Toxiproxy, proxy: Proxy, echo: str) -> None:
    other = tp.create(upstream=echo, name="learner1", listen="127.0.0.1:0")
    proxy.add_toxic(type="latency", attributes={"latency": 2000})
    other.add_toxic(type="timeout", stream="upstream", attributes={"timeout": 0})
    other.disable()
    assert tp.reset() is True
    assert APIConsumer.post("/reset").status_code == 204
    for name in ("learner0", "learner1"):
        state = APIConsumer.get(f"/proxies/{name}").json()
        assert state["enabled"] is True and state["toxics"] == []
    for target in (proxy, other):
        with _connect(target) as sock:
            assert _rtt(sock) < 1.0


def test_update_upstream_and_unreachable_upstream(tp: Toxiproxy, proxy: Proxy, echo: str) -> None:
    dead = f"127.0.0.1:{_closed_port()}"
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0
        updated = APIConsumer.post(f"/proxies/{proxy.name}", json={"upstream": dead}).json()
        assert updated["upstream"] == dead and updated["enabled"] is True
        assert sock.recv(100) == b""  # changing upstream restarts the proxy
    with _connect(proxy) as sock:
        assert sock.recv(100) == b""  # upstream refused: client is closed
    APIConsumer.post(f"/proxies/{proxy.name}", json={"upstream": echo})
    with _connect(proxy) as sock:
        assert _rtt(sock) < 1.0


def test_bulk_transfer_is_intact_both_ways(proxy: Proxy) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB through both links
    with _connect(proxy) as sock:
        reader_out: list[bytes] = []
        reader = threading.Thread(target=lambda: reader_out.append(_recv_exact(sock, len(payload))))
        reader.start()
        sock.sendall(payload)
        reader.join(SOCK_TIMEOUT_S)
    assert reader_out == [payload]


def test_main_serves_until_sigterm(echo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "diloco_chaos.chaos.toxiproxy_server", "--host", "127.0.0.1", "--port", "0",
         "--seed", "3"],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr or []], daemon=True).start()
    try:
        line = ""
        while "api.started" not in line:
            line = lines.get(timeout=10)
        port = int(line.split("address=")[1].split()[0].rpartition(":")[2])
        monkeypatch.setattr(APIConsumer, "host", "127.0.0.1")
        monkeypatch.setattr(APIConsumer, "port", port)
        monkeypatch.setattr(toxiproxy.api, "requests", _TimeoutRequests(HTTP_TIMEOUT_S))
        assert json.loads(Toxiproxy().version()) == {"version": VERSION}
        created = Toxiproxy().create(upstream=echo, name="cli", listen="127.0.0.1:0")
        with _connect(created) as sock:
            assert _rtt(sock) < 1.0
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
            assert sock.recv(100) == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_embedded_start_stop_idempotence() -> None:
    srv = EmbeddedToxiproxy(seed=0)
    srv.stop()  # not started: no-op
    srv.start()
    with pytest.raises(RuntimeError):
        srv.start()
    port = srv.port
    with socket.create_connection(("127.0.0.1", port), timeout=SOCK_TIMEOUT_S):
        pass
    srv.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=SOCK_TIMEOUT_S).close()
    srv.start()  # restartable after stop
    with socket.create_connection(("127.0.0.1", srv.port), timeout=SOCK_TIMEOUT_S):
        pass
    srv.stop()
