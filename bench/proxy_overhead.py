"""Benchmark: what a Toxiproxy hop (no toxics) costs on loopback.

What: bulk throughput (MB/s, client -> server and server -> client) and small-message
round-trip latency (median and p99 in microseconds of N 16-byte ping-pongs) for
  * a direct loopback connection,
  * the embedded server in this process (``EmbeddedToxiproxy``, asyncio in a thread),
  * the embedded server as its own process (``python -m diloco_chaos.chaos.toxiproxy_server``),
  * the Go ``toxiproxy-server`` if one is on PATH (otherwise the row says it was skipped).

Why: every learner -> synchronizer link in a chaos run goes through one proxy, so the
harness needs to know how much bandwidth and latency the proxy itself takes away before
any toxic is added.  The upstream is a small threaded server in this process, identical
for every row; in the "in-process" row the proxy shares this process's GIL with it.

Usage: ``python bench/proxy_overhead.py [--mb 64] [--pings 2000] [--runs 3]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import socket
import socketserver
import statistics
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from diloco_chaos.chaos.toxiproxy_server import EmbeddedToxiproxy

LOG = logging.getLogger("bench.proxy_overhead")

BLOCK = 1024 * 1024
PING = b"p" * 16
_MODE_ECHO, _MODE_SINK, _MODE_SOURCE = b"E", b"S", b"D"


# ----------------------------------------------------------------------------- upstream


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise EOFError(f"EOF after {got}/{size} bytes")
        got += n
    return bytes(buf)


def _drain(sock: socket.socket, size: int) -> None:
    buf = bytearray(BLOCK)
    left = size
    while left:
        n = sock.recv_into(buf, min(left, BLOCK))
        if n == 0:
            raise EOFError(f"EOF with {left} bytes outstanding")
        left -= n


def _send_zeros(sock: socket.socket, size: int) -> None:
    block = memoryview(bytes(BLOCK))
    left = size
    while left:
        chunk = min(left, BLOCK)
        sock.sendall(block[:chunk])
        left -= chunk


class _Handler(socketserver.BaseRequestHandler):
    """First byte picks the mode: E = echo, S = sink N bytes then ack, D = send N bytes."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            mode = _recv_exact(sock, 1)
            if mode == _MODE_ECHO:
                buf = bytearray(65536)
                while n := sock.recv_into(buf):
                    sock.sendall(memoryview(buf)[:n])
            elif mode == _MODE_SINK:
                (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
                _drain(sock, size)
                sock.sendall(b"K")
            elif mode == _MODE_SOURCE:
                (size,) = struct.unpack("!Q", _recv_exact(sock, 8))
                _send_zeros(sock, size)
        except (OSError, EOFError):
            pass


class _Upstream(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


# ----------------------------------------------------------------------------- measurements


@dataclass
class Result:
    path: str
    up_mbps: float | None = None
    down_mbps: float | None = None
    rtt_median_us: float | None = None
    rtt_p99_us: float | None = None
    note: str = ""


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address, timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _upload(address: tuple[str, int], size: int) -> float:
    with _connect(address) as sock:
        start = time.perf_counter()
        sock.sendall(_MODE_SINK + struct.pack("!Q", size))
        _send_zeros(sock, size)
        if _recv_exact(sock, 1) != b"K":
            raise RuntimeError("sink did not acknowledge")
        return size / (time.perf_counter() - start) / 1e6


def _download(address: tuple[str, int], size: int) -> float:
    with _connect(address) as sock:
        start = time.perf_counter()
        sock.sendall(_MODE_SOURCE + struct.pack("!Q", size))
        _drain(sock, size)
        return size / (time.perf_counter() - start) / 1e6


def _pings(address: tuple[str, int], count: int) -> list[float]:
    samples: list[float] = []
    with _connect(address) as sock:
        sock.sendall(_MODE_ECHO)
        for i in range(count + count // 10):
            start = time.perf_counter_ns()
            sock.sendall(PING)
            _recv_exact(sock, len(PING))
            if i >= count // 10:  # first 10% are warm-up
                samples.append((time.perf_counter_ns() - start) / 1000.0)
    return samples


def measure(path: str, address: tuple[str, int], size: int, pings: int, runs: int) -> Result:
    ups = [_upload(address, size) for _ in range(runs)]
    downs = [_download(address, size) for _ in range(runs)]
    rtts = _pings(address, pings)
    rtts.sort()
    return Result(
        path,
        up_mbps=statistics.median(ups),
        down_mbps=statistics.median(downs),
        rtt_median_us=statistics.median(rtts),
        rtt_p99_us=rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))],
    )


# ----------------------------------------------------------------------------- proxies


def _api(base_url: str, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "User-Agent": "proxy-overhead-bench"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _create_proxy(base_url: str, upstream: str) -> tuple[str, int]:
    proxy = _api(base_url, "/proxies", {"name": "bench", "upstream": upstream, "listen": "127.0.0.1:0"})
    host, _, port = str(proxy["listen"]).rpartition(":")
    return host, int(port)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _embedded_in_process(upstream: str) -> Iterator[tuple[str, int]]:
    with EmbeddedToxiproxy() as server:
        yield _create_proxy(server.url, upstream)


@contextmanager
def _embedded_subprocess(upstream: str) -> Iterator[tuple[str, int]]:
    command = [sys.executable, "-m", "diloco_chaos.chaos.toxiproxy_server", "--host", "127.0.0.1", "--port", "0"]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr or []], daemon=True).start()
    try:
        line = ""
        while "api.started" not in line:  # the server logs its real address once listening
            line = lines.get(timeout=15)
        address = line.split("address=")[1].split()[0]
        yield _create_proxy(f"http://{address}", upstream)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def _go_toxiproxy(binary: str, upstream: str) -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-host", "127.0.0.1", "-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:  # the Go server prints nothing machine-readable on readiness: poll
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("toxiproxy-server did not start") from None
                time.sleep(0.05)
        yield _create_proxy(f"http://127.0.0.1:{port}", upstream)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ----------------------------------------------------------------------------- main


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[Result], size: int, pings: int, runs: int) -> None:
    print(
        f"proxy overhead on loopback: {size / 1e6:.0f} MB transfers (median of {runs}), "
        f"{pings} x {len(PING)}-byte ping-pongs; python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    header = f"{'path':<32} {'up MB/s':>9} {'down MB/s':>10} {'RTT p50 us':>11} {'RTT p99 us':>11}"
    print(header)
    print("-" * len(header))
    for r in results:
        if r.note:
            print(f"{r.path:<32} {r.note}")
            continue
        print(
            f"{r.path:<32} {_fmt(r.up_mbps, '9.0f')} {_fmt(r.down_mbps, '10.0f')} "
            f"{_fmt(r.rtt_median_us, '11.0f')} {_fmt(r.rtt_p99_us, '11.0f')}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Toxiproxy hop overhead on loopback")
    parser.add_argument("--mb", type=int, default=64, help="MB per throughput transfer (default 64)")
    parser.add_argument(
        "--pings", type=int, default=2000, help="ping-pongs for the RTT median (default 2000)"
    )
    parser.add_argument("--runs", type=int, default=3, help="throughput runs per direction (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    size = args.mb * 1_000_000

    upstream = _Upstream(("127.0.0.1", 0), _Handler)
    threading.Thread(target=upstream.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    up_address = f"127.0.0.1:{upstream.server_address[1]}"

    targets: list[tuple[str, Callable[[], AbstractContextManager[tuple[str, int]]] | None, str]] = [
        ("direct loopback", None, ""),
        ("embedded (in-process thread)", lambda: _embedded_in_process(up_address), ""),
        ("embedded (python -m subprocess)", lambda: _embedded_subprocess(up_address), ""),
    ]
    binary = shutil.which("toxiproxy-server")
    if binary is None:
        targets.append(("toxiproxy-server (Go)", None, "skipped: toxiproxy-server not on PATH"))
    else:
        targets.append(("toxiproxy-server (Go)", lambda: _go_toxiproxy(binary, up_address), ""))

    results: list[Result] = []
    try:
        for path, factory, skip_note in targets:
            if skip_note:
                results.append(Result(path, note=skip_note))
            elif factory is None:
                results.append(measure(path, upstream.server_address, size, args.pings, args.runs))
            else:
                with factory() as address:
                    results.append(measure(path, address, size, args.pings, args.runs))
    finally:
        upstream.shutdown()
        upstream.server_close()
    print_table(results, size, args.pings, args.runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
