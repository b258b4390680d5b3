"""Tests for the embedded server's ``corrupt`` toxic, through real sockets and the client."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Iterator

import pytest

from diloco_chaos.chaos.toxiproxy_client import ToxiproxyClient, ToxiproxyError
from diloco_chaos.chaos.toxiproxy_server import EmbeddedToxiproxy

SIZE = 200_000


@pytest.fixture
def sink() -> Iterator[tuple[str, list[bytes], threading.Event]]:
    """An upstream that records everything it receives until EOF."""
    srv = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []
    done = threading.Event()

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                got.append(data)
        done.set()

    threading.Thread(target=serve, daemon=True).start()
    yield f"127.0.0.1:{srv.getsockname()[1]}", got, done
    srv.close()


def _send_through(probability: float, sink: tuple[str, list[bytes], threading.Event]) -> bytes:
    address, got, done = sink
    with EmbeddedToxiproxy(seed=7) as server:
        client = ToxiproxyClient(server.url)
        info = client.create_proxy("p", address)
        client.add_toxic("p", "c", "corrupt", stream="upstream", probability=probability)
        with socket.create_connection((info.listen_host, info.listen_port), timeout=10) as sock:
            sock.sendall(bytes(SIZE))
        assert done.wait(10)
    return b"".join(got)


@pytest.mark.parametrize("p", [0.01, 0.25])
def test_corrupt_flips_about_p_of_bytes_one_bit_each(p: float, sink: tuple[str, list[bytes], threading.Event]) -> None:
    out = _send_through(p, sink)
    assert len(out) == SIZE
    flipped = [b for b in out if b]
    bound = 5 * math.sqrt(SIZE * p * (1 - p))
    assert abs(len(flipped) - SIZE * p) < bound
    assert all(bin(b).count("1") == 1 for b in flipped)


def test_corrupt_probability_zero_is_identity(sink: tuple[str, list[bytes], threading.Event]) -> None:
    assert _send_through(0.0, sink) == bytes(SIZE)


@pytest.mark.parametrize("value", [1.5, -0.1, "x"])
def test_corrupt_bad_probability_is_400_naming_it(value: object) -> None:
    with EmbeddedToxiproxy(seed=1) as server:
        client = ToxiproxyClient(server.url)
        client.create_proxy("p", "127.0.0.1:9")
        with pytest.raises((ToxiproxyError, ValueError)) as err:
            client.add_toxic("p", "c", "corrupt", probability=value)  # type: ignore[arg-type]
        assert "probability" in str(err.value)
        if isinstance(err.value, ToxiproxyError):
            assert err.value.status == 400
