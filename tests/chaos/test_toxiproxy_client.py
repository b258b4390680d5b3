"""Tests for diloco_chaos.chaos.toxiproxy_client against real servers on loopback sockets.

Every API test runs against our EmbeddedToxiproxy and, when a ``toxiproxy-server``
binary is on PATH, against the real Go server too (that parameter is skipped, with the
reason, otherwise).  Failure paths use real sockets as well: a closed port (unreachable)
and a listening socket that never accepts (a server that never answers HTTP).  No
sleeps: synchronisation is by socket reads with timeouts and the client's own bounded
waits; elapsed times are measured with time.monotonic against generous bounds.
"""

from __future__ import annotations

import math
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import toxiproxy.api
from toxiproxy.api import APIConsumer

from diloco_chaos.chaos.toxiproxy_backend import free_port
from diloco_chaos.chaos.toxiproxy_client import ProxyInfo, ToxicInfo, ToxiproxyClient, ToxiproxyError
from diloco_chaos.chaos.toxiproxy_server import VERSION, EmbeddedToxiproxy

SOCK_TIMEOUT_S = 5.0
REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- helpers



def _echo_through(info: ProxyInfo, payload: bytes = b"hello through the proxy") -> bytes:
    with socket.create_connection((info.listen_host, info.listen_port), timeout=SOCK_TIMEOUT_S) as sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
    return got


def _check(err: pytest.ExceptionInfo[ToxiproxyError], status: int | None, *needles: str) -> None:
    assert err.value.status == status, str(err.value)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=["embedded", "toxiproxy-server"])
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(kind, API url) of a running server of each kind."""
    if request.param == "embedded":
        with EmbeddedToxiproxy(seed=7) as srv:
            yield "embedded", srv.url
        return
    exe = shutil.which("toxiproxy-server")
    if exe is None:
        pytest.skip("no `toxiproxy-server` binary on PATH; the Go server is exercised only where it is installed")
    port = free_port()
    proc = subprocess.Popen([exe, "-host", "127.0.0.1", "-port", str(port)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        ToxiproxyClient(url, timeout_s=2.0).wait_ready(10.0)
        yield "toxiproxy-server", url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def client(server: tuple[str, str]) -> Iterator[ToxiproxyClient]:
    c = ToxiproxyClient(server[1], timeout_s=5.0)
    yield c
    for name in c.proxies():
        c.delete_proxy(name, missing_ok=True)


@pytest.fixture
def proxy(client: ToxiproxyClient, echo: str) -> ProxyInfo:
    return client.create_proxy("p1", echo)


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A port that completes TCP handshakes (kernel backlog) but never accepts or answers."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    sock.settimeout(SOCK_TIMEOUT_S)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# ----------------------------------------------------------------------------- server


def test_version_and_wait_ready(client: ToxiproxyClient, server: tuple[str, str]) -> None:
    kind, url = server
    version = client.version()
    assert isinstance(version, str) and version[0].isdigit()
    if kind == "embedded":
        assert version == VERSION
    assert client.wait_ready(5.0) == version
    assert client.url == url and client.timeout_s == 5.0


# ----------------------------------------------------------------------------- proxies


def test_create_get_list_delete(client: ToxiproxyClient, echo: str) -> None:
    info = client.create_proxy("p1", echo)
    assert info.name == "p1" and info.upstream == echo and info.enabled is True
    assert info.listen_host == "127.0.0.1" and info.listen_port > 0
    assert info.listen == f"127.0.0.1:{info.listen_port}"
    assert client.get_proxy("p1") == info
    other = client.create_proxy("p2", echo, listen="127.0.0.1:0")
    assert other.listen_port not in (0, info.listen_port)
    assert client.proxies() == {"p1": info, "p2": other}
    client.delete_proxy("p2")
    assert client.proxies() == {"p1": info}
    with pytest.raises(ToxiproxyError) as err:
        client.get_proxy("p2")
    _check(err, 404, "get_proxy", "'p2'", client.url, "404")
    with pytest.raises(ToxiproxyError) as err:
        client.delete_proxy("p2")
    _check(err, 404, "delete_proxy", "'p2'", f"DELETE {client.url}/proxies/p2", "HTTP 404", "not found")
    client.delete_proxy("p2", missing_ok=True)


def test_create_duplicate_is_409(client: ToxiproxyClient, proxy: ProxyInfo, echo: str) -> None:
    with pytest.raises(ToxiproxyError) as err:
        client.create_proxy("p1", echo)
    _check(err, 409, "create_proxy", "'p1'", client.url, "409")
    assert client.proxies() == {"p1": proxy}


def test_create_listen_in_use_is_500_not_keyerror(client: ToxiproxyClient, echo: str) -> None:
    # toxiproxy-python alone turns this 500 into KeyError('name').
    with pytest.raises(ToxiproxyError) as err:
        client.create_proxy("busy", echo, listen=echo)
    _check(err, 500, "create_proxy", "'busy'", f"POST {client.url}/proxies", "HTTP 500", "address already in use")


def test_create_disabled_then_enable(client: ToxiproxyClient, echo: str) -> None:
    info = client.create_proxy("later", echo, enabled=False)
    assert info.enabled is False and info.listen_host == "127.0.0.1"
    enabled = client.set_enabled("later", True)
    assert enabled.enabled is True and enabled.listen_port > 0
    assert _echo_through(enabled) == b"hello through the proxy"


def test_data_flows_through_proxy(proxy: ProxyInfo) -> None:
    assert _echo_through(proxy) == b"hello through the proxy"
    big = bytes(range(256)) * 1024
    assert _echo_through(proxy, big) == big


def test_set_enabled(client: ToxiproxyClient, proxy: ProxyInfo) -> None:
    disabled = client.set_enabled("p1", False)
    assert disabled.enabled is False and disabled.name == "p1"
    assert client.get_proxy("p1").enabled is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.listen_host, proxy.listen_port), timeout=SOCK_TIMEOUT_S).close()
    enabled = client.set_enabled("p1", True)
    assert enabled.enabled is True and client.get_proxy("p1") == enabled
    assert _echo_through(enabled) == b"hello through the proxy"
    with pytest.raises(ToxiproxyError) as err:
        client.set_enabled("nope", False)
    _check(err, 404, "set_enabled", "'nope'", f"POST {client.url}/proxies/nope", "HTTP 404")


# ----------------------------------------------------------------------------- toxics


def test_toxic_add_update_list_remove(client: ToxiproxyClient, proxy: ProxyInfo) -> None:
    added = client.add_toxic("p1", "lag", "latency", stream="upstream", toxicity=0.5, latency=100, jitter=5)
    assert added == ToxicInfo("lag", "latency", "upstream", 0.5, {"latency": 100, "jitter": 5})
    cut = client.add_toxic("p1", "cut", "limit_data", bytes=1000)
    assert cut.stream == "downstream" and cut.toxicity == 1.0 and cut.attributes == {"bytes": 1000}
    assert client.toxics("p1") == {"lag": added, "cut": cut}

    updated = client.update_toxic("p1", "lag", latency=250)
    assert updated.attributes == {"latency": 250, "jitter": 5} and updated.toxicity == 0.5
    assert client.toxics("p1")["lag"] == updated
    updated = client.update_toxic("p1", "lag", toxicity=1.0)
    assert updated.toxicity == 1.0 and updated.attributes == {"latency": 250, "jitter": 5}
    assert client.toxics("p1")["lag"].toxicity == 1.0

    client.remove_toxic("p1", "lag")
    assert client.toxics("p1") == {"cut": cut}
    with pytest.raises(ToxiproxyError) as err:
        client.remove_toxic("p1", "lag")
    _check(err, 404, "remove_toxic", "'lag'", "'p1'", f"DELETE {client.url}/proxies/p1/toxics/lag", "HTTP 404")
    client.remove_toxic("p1", "lag", missing_ok=True)
    client.remove_toxic("gone", "lag", missing_ok=True)


def test_toxic_takes_effect_and_update_follows(client: ToxiproxyClient, proxy: ProxyInfo) -> None:
    client.add_toxic("p1", "cut", "limit_data", stream="downstream", bytes=4)
    assert _echo_through(proxy, b"0123456789") == b"0123"
    client.update_toxic("p1", "cut", bytes=8)
    assert _echo_through(proxy, b"0123456789") == b"01234567"


def test_toxic_errors(client: ToxiproxyClient, proxy: ProxyInfo) -> None:
    with pytest.raises(ToxiproxyError) as err:
        client.add_toxic("nope", "lag", "latency", latency=1)
    _check(err, 404, "add_toxic", "'lag'", "'nope'", f"POST {client.url}/proxies/nope/toxics", "HTTP 404")

    client.add_toxic("p1", "lag", "latency", latency=1)
    with pytest.raises(ToxiproxyError) as err:
        client.add_toxic("p1", "lag", "latency", latency=2)
    _check(err, 409, "add_toxic", "'lag'", "'p1'", "HTTP 409", "already exists")

    with pytest.raises(ToxiproxyError) as err:
        client.add_toxic("p1", "weird", "no_such_toxic")
    _check(err, 400, "add_toxic", "'weird'", "'p1'", "HTTP 400", "invalid toxic type")

    with pytest.raises(ToxiproxyError) as err:  # does not fit the server's int64
        client.add_toxic("p1", "huge", "latency", latency=2**64)
    _check(err, 400, "add_toxic", "'huge'", "'p1'", "HTTP 400")

    with pytest.raises(ToxiproxyError) as err:
        client.update_toxic("p1", "huge", latency=2)
    _check(err, 404, "update_toxic", "'huge'", "'p1'", f"POST {client.url}/proxies/p1/toxics/huge", "HTTP 404")
    with pytest.raises(ToxiproxyError) as err:
        client.update_toxic("p1", "lag", latency=2**64)
    _check(err, 400, "update_toxic", "'lag'", "HTTP 400")
    with pytest.raises(ToxiproxyError) as err:
        client.update_toxic("nope", "lag", latency=2)
    _check(err, 404, "update_toxic", "'nope'", "HTTP 404")
    with pytest.raises(ToxiproxyError) as err:
        client.toxics("nope")
    _check(err, 404, "toxics", "'nope'", f"GET {client.url}/proxies/nope/toxics", "HTTP 404")
    assert list(client.toxics("p1")) == ["lag"]


def test_reset(client: ToxiproxyClient, proxy: ProxyInfo) -> None:
    client.add_toxic("p1", "lag", "latency", latency=10)
    client.set_enabled("p1", False)
    client.reset()
    assert client.toxics("p1") == {}
    assert client.get_proxy("p1").enabled is True
    assert _echo_through(proxy) == b"hello through the proxy"


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("listen", [":0", "0", "", ":8474", "[]:0", "::1:0", "127.0.0.1", "127.0.0.1:x",
                                    "127.0.0.1:70000"])
def test_listen_must_name_its_host(listen: str) -> None:
    # A closed port: a ValueError (not "unreachable") proves nothing was sent.
    c = ToxiproxyClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    with pytest.raises(ValueError, match="listen"):
        c.create_proxy("p", "127.0.0.1:9", listen=listen)


def test_arguments_are_checked_before_sending() -> None:
    c = ToxiproxyClient(f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    bad_calls = [
        lambda: c.create_proxy("p", "", listen="127.0.0.1:0"),
        lambda: c.create_proxy("p", ":8080"),
        lambda: c.create_proxy("p", "127.0.0.1:0"),
        lambda: c.create_proxy("a/b", "127.0.0.1:9"),
        lambda: c.create_proxy("", "127.0.0.1:9"),
        lambda: c.create_proxy("p", "127.0.0.1:9", enabled=1),  # type: ignore[arg-type]
        lambda: c.get_proxy("a b"),
        lambda: c.delete_proxy("x?y"),
        lambda: c.set_enabled("p", "no"),  # type: ignore[arg-type]
        lambda: c.add_toxic("p", "t", "latency", stream="both"),
        lambda: c.add_toxic("p", "t", "latency", toxicity=1.5),
        lambda: c.add_toxic("p", "t", "latency", toxicity=-0.1),
        lambda: c.add_toxic("p", "t", "latency", toxicity=math.nan),
        lambda: c.add_toxic("p", "t", "latency", toxicity=True),
        lambda: c.add_toxic("p", "t", "latency", latency="10"),  # type: ignore[arg-type]
        lambda: c.add_toxic("p", "t", "latency", latency=1.5),  # type: ignore[arg-type]
        lambda: c.add_toxic("p", "t", ""),
        lambda: c.add_toxic("p", "t%2F", "latency"),
        lambda: c.update_toxic("p", "t", toxicity=2.0),
        lambda: c.update_toxic("p", "t", latency=False),
        lambda: c.remove_toxic("p", "#t"),
        lambda: c.toxics("p\n"),
        lambda: c.wait_ready(0),
    ]
    for call in bad_calls:
        with pytest.raises(ValueError):
            call()
    for url in ["https://127.0.0.1:8474", "http://127.0.0.1", "http://127.0.0.1:8474/api", "127.0.0.1:8474",
                "http://:8474", "http://127.0.0.1:8474?x=1"]:
        with pytest.raises(ValueError, match="url"):
            ToxiproxyClient(url)
    for timeout in [0, -1.0, math.inf]:
        with pytest.raises(ValueError, match="timeout_s"):
            ToxiproxyClient("http://127.0.0.1:8474", timeout_s=timeout)
    assert ToxiproxyClient("http://[::1]:8474/").url == "http://[::1]:8474"


def test_proxy_info_address_parts() -> None:
    assert ProxyInfo("a", "127.0.0.1:8080", "x:1", True).listen_port == 8080
    assert ProxyInfo("a", "[::1]:8080", "x:1", True).listen_host == "::1"
    assert ProxyInfo("a", "localhost:0", "x:1", False).listen_host == "localhost"


# ----------------------------------------------------------------------------- failures


def test_unreachable_server_fails_fast() -> None:
    c = ToxiproxyClient(f"http://127.0.0.1:{free_port()}", timeout_s=5.0)
    for call, op in [(c.version, "version"), (c.proxies, "proxies"),
                     (lambda: c.update_toxic("p", "t", latency=1), "update_toxic")]:
        start = time.monotonic()
        with pytest.raises(ToxiproxyError) as err:
            call()
        assert time.monotonic() - start < 2.0
        _check(err, None, op, c.url, "unreachable", "Connection refused")
    start = time.monotonic()
    with pytest.raises(ToxiproxyError) as err:
        c.wait_ready(0.3)
    elapsed = time.monotonic() - start
    assert 0.3 <= elapsed < 2.0
    _check(err, None, "wait_ready", c.url, "0.3s", "unreachable")


def test_server_that_never_answers_times_out(blackhole: str) -> None:
    c = ToxiproxyClient(blackhole, timeout_s=0.2)
    for call, op in [(c.proxies, "proxies"), (lambda: c.add_toxic("p", "t", "latency"), "add_toxic"),
                     (lambda: c.update_toxic("p", "t", latency=1), "update_toxic")]:
        start = time.monotonic()
        with pytest.raises(ToxiproxyError) as err:
            call()
        elapsed = time.monotonic() - start
        assert 0.15 <= elapsed < 0.2 * 2 + 1.5, elapsed
        _check(err, None, op, blackhole, "timed out after 0.2s")
    start = time.monotonic()
    with pytest.raises(ToxiproxyError) as err:
        c.wait_ready(0.3)
    assert time.monotonic() - start < 0.3 + 0.2 + 1.5
    _check(err, None, "wait_ready", blackhole, "timed out")


def test_two_clients_do_not_cross(echo: str) -> None:
    before = (APIConsumer.host, APIConsumer.port, toxiproxy.api.requests)
    with EmbeddedToxiproxy(seed=1) as s1, EmbeddedToxiproxy(seed=2) as s2:
        c1, c2 = ToxiproxyClient(s1.url, timeout_s=5.0), ToxiproxyClient(s2.url, timeout_s=5.0)
        for i in range(3):
            c1.create_proxy(f"one-{i}", echo)
            c2.create_proxy(f"two-{i}", echo)
            c1.add_toxic(f"one-{i}", "t1", "latency", latency=1)
            c2.add_toxic(f"two-{i}", "t2", "latency", latency=2)
        assert sorted(c1.proxies()) == ["one-0", "one-1", "one-2"]
        assert sorted(c2.proxies()) == ["two-0", "two-1", "two-2"]
        assert list(c1.toxics("one-1")) == ["t1"] and list(c2.toxics("two-1")) == ["t2"]

        failures: list[BaseException] = []

        def hammer(c: ToxiproxyClient, prefix: str) -> None:
            try:
                for _ in range(10):
                    assert all(name.startswith(prefix) for name in c.proxies())
                    c.set_enabled(f"{prefix}-0", False)
                    c.set_enabled(f"{prefix}-0", True)
            except BaseException as exc:  # noqa: BLE001 - reported to the test thread
                failures.append(exc)

        threads = [threading.Thread(target=hammer, args=(c1, "one")), threading.Thread(target=hammer, args=(c2, "two"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads) and failures == []
    assert (APIConsumer.host, APIConsumer.port, toxiproxy.api.requests) == before


# ----------------------------------------------------------------------------- CLI


def test_cli_toxiproxy_server_runs_and_stops_on_sigterm(echo: str) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "diloco_chaos.harness.entry", "toxiproxy-server", "--port", str(port), "--seed", "3",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        c = ToxiproxyClient(f"http://127.0.0.1:{port}", timeout_s=2.0)
        assert c.wait_ready(60.0) == VERSION
        info = c.create_proxy("cli", echo)
        assert _echo_through(info) == b"hello through the proxy"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - start < 10
        assert proc.returncode == 0, err.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
