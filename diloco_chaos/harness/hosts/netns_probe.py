"""Measure what a netns host's link really carries: TCP payload rate between a host and the bridge.

Used by tests/hosts/test_netns_hosts.py (a kernel bandwidth limit's measured rate is within 10 % of the one set) and
bench/kernel_link_rate.py (the table in docs/multi-host.md). One end runs in a thread of this process that has
entered the host's namespace (setns moves only the calling thread), the other on the bridge's address in the
root namespace, so the bytes cross the host's veth, its qdiscs and its nft rules as a run's would.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from diloco_chaos.harness.hosts.netns import CLONE_NEWNET

CHUNK = 64 * 1024
_T = TypeVar("_T")


def in_netns(netns: str, fn: Callable[[], _T], timeout_s: float) -> _T:
    """`fn()` run by a new thread that first enters namespace `netns`; its result (its exception re-raised)."""
    out: dict[str, object] = {}

    def body() -> None:
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns {netns}")
            finally:
                os.close(fd)
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=body, name=f"in-{netns}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError(f"work inside {netns} did not finish within {timeout_s}s")
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]  # type: ignore[return-value]


@dataclass(frozen=True)
class RateSample:
    """What one measurement saw."""

    payload_bytes: int
    """Bytes received inside the window."""
    seconds: float
    """The window: from `warmup_s` after the first byte to the end of sending."""

    @property
    def kbps(self) -> float:
        """Payload kilobits per second (the unit of degrade's bandwidth_kbps)."""
        return self.payload_bytes * 8 / 1000 / self.seconds


def _sink(sock: socket.socket, warmup_s: float, seconds: float) -> RateSample:
    """Receive until the sender closes; count the bytes that arrive inside [first + warmup_s, + seconds]."""
    first = None
    counted = 0
    buf = bytearray(CHUNK)
    while True:
        n = sock.recv_into(buf)
        now = time.monotonic()
        if n == 0:
            break
        if first is None:
            first = now
        if first + warmup_s <= now <= first + warmup_s + seconds:
            counted += n
    return RateSample(counted, seconds)


def _source(sock: socket.socket, total_s: float) -> None:
    data = b"\0" * CHUNK
    end = time.monotonic() + total_s
    while time.monotonic() < end:
        sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def measure_rate(netns: str, bridge_address: str, upstream: bool, seconds: float = 2.0,
                 warmup_s: float = 0.5) -> RateSample:
    """The payload rate one TCP flow gets from the host to the bridge (`upstream`) or back, measured over
    `seconds` after a `warmup_s` (slow start and the token bucket's first burst left out)."""
    total = warmup_s + seconds + 0.2
    bound = total + 30.0
    with socket.create_server((bridge_address, 0)) as listener:
        listener.settimeout(bound)
        port = listener.getsockname()[1]
        result: dict[str, object] = {}

        def root_side() -> None:
            try:
                conn, _ = listener.accept()
                with conn:
                    conn.settimeout(bound)
                    if upstream:
                        result["sample"] = _sink(conn, warmup_s, seconds)
                    else:
                        _source(conn, total)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                result["error"] = e

        def host_side() -> RateSample | None:
            with socket.create_connection((bridge_address, port), timeout=bound) as s:
                s.settimeout(bound)
                if upstream:
                    _source(s, total)
                    return None
                return _sink(s, warmup_s, seconds)

        root = threading.Thread(target=root_side, name="probe-root", daemon=True)
        root.start()
        sample = in_netns(netns, host_side, bound)
        root.join(bound)
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    out = sample if sample is not None else result.get("sample")
    assert isinstance(out, RateSample)
    return out
