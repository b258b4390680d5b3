"""Embedded, Toxiproxy-compatible TCP fault-injection server (asyncio, stdlib only).

What: an in-process re-implementation of Shopify Toxiproxy's v2 HTTP API
(``/version``, ``/proxies``, ``/populate``, ``/proxies/{p}``, ``/proxies/{p}/toxics``,
``/proxies/{p}/toxics/{t}``, ``/reset``) and of its TCP data path with the ``latency``,
``bandwidth``, ``timeout``, ``reset_peer``, ``slow_close``, ``slicer``, ``limit_data`` (and
``noop``) toxics.  Clients written for the real server (toxiproxy-python, toxiproxy-cli) talk
to it unchanged: same routes, methods, JSON shapes, status codes and error bodies.

Why: the chaos harness puts one proxy on every learner -> synchronizer link and must run
where the Go ``toxiproxy-server`` binary is not installed.  Embedding the server also lets a
test own it (start/stop per test) and makes every random decision (jitter, toxicity, slicer
sizes) come from one seeded ``random.Random`` so a failing chaos run can be replayed.

Design: every proxied connection has two *links* (upstream = client -> server, downstream =
server -> client).  A link is a reader task that reads chunks of up to ``CHUNK_SIZE`` bytes
and time-stamps them into a bounded buffer, plus a processor task that pushes each chunk
through the link's current toxic chain (ordered by creation, like Toxiproxy's chain) and
writes it out.  Toxics act per chunk (never per byte).  Adding, updating or removing a toxic
re-links live connections immediately: a toxic sleeping on a chunk is interrupted and the
chunk continues down the chain, as Toxiproxy's ``InterruptToxic`` does.  All state lives on
one event loop (no thread locks; one asyncio lock serialises API calls, as Toxiproxy's
collection mutexes do); ``EmbeddedToxiproxy`` runs that loop in a daemon thread, ``main()``
runs it in the foreground.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import email.utils
import ipaddress
import itertools
import json
import logging
import random
import signal
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

LOG = logging.getLogger(__name__)

#: Version reported by ``GET /version`` (the Toxiproxy release whose API this mirrors).
VERSION = "2.12.0"
#: Largest chunk read from a socket in one go.
CHUNK_SIZE = 64 * 1024
#: Bytes a link may buffer between its reader and its toxic chain before reading pauses.
LINK_BUFFER_BYTES = 4 * 1024 * 1024
#: Seconds allowed for dialing a proxy's upstream before the client is dropped.
UPSTREAM_CONNECT_TIMEOUT_S = 10.0
#: Largest HTTP request body the API accepts.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Seconds an API connection may sit idle between requests (Go's server uses 60 s).
API_IDLE_TIMEOUT_S = 60.0
#: Seconds allowed to read one request's headers and body (Go's server uses 15 s).
API_READ_TIMEOUT_S = 15.0

_DIRECTIONS = ("upstream", "downstream")
_INT_LIMITS = {"int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1)}

# Toxic types -> ordered (attribute, Go type) pairs, as the Go structs declare them.
_TOXIC_ATTRS: dict[str, tuple[tuple[str, str], ...]] = {
    "noop": (),
    "latency": (("latency", "int64"), ("jitter", "int64")),
    "bandwidth": (("rate", "int64"),),
    "slow_close": (("delay", "int64"),),
    "timeout": (("timeout", "int64"),),
    "reset_peer": (("timeout", "int64"),),
    "slicer": (("average_size", "int"), ("size_variation", "int"), ("delay", "int")),
    "limit_data": (("bytes", "int64"),),
}
_TOXIC_STRUCTS = {
    "noop": "NoopToxic",
    "latency": "LatencyToxic",
    "bandwidth": "BandwidthToxic",
    "slow_close": "SlowCloseToxic",
    "timeout": "TimeoutToxic",
    "reset_peer": "ResetToxic",
    "slicer": "SlicerToxic",
    "limit_data": "LimitDataToxic",
}

_HTTP_REASONS = {
    100: "Continue",
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
}

# Outcomes of an interruptible sleep inside a link.
_DONE, _REMOVED, _CLOSED = 0, 1, 2


# --------------------------------------------------------------------------------------
# Errors and JSON helpers (Go ``encoding/json`` semantics where clients can observe them)
# --------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error with an HTTP status, rendered as Toxiproxy's ``{"error", "status"}`` body."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def _bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _missing(field_name: str) -> ApiError:
    return ApiError(f"missing required field: {field_name}", 400)


def _err_proxy_not_found() -> ApiError:
    return ApiError("proxy not found", 404)


def _err_toxic_not_found() -> ApiError:
    return ApiError("toxic not found", 404)


class _AlreadyStarted(Exception):
    """Raised by ``_Proxy.start`` when the proxy is already listening."""


def _dumps(value: Any) -> bytes:
    """Compact JSON with Go's HTML-safe escaping of ``<``, ``>`` and ``&``."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, esc)
    return text.encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def _decode_json(body: bytes) -> Any:
    """Decode the first JSON value of ``body`` like Go's ``json.Decoder.Decode``."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise _bad_body("EOF")
    try:
        value, _ = json.JSONDecoder(parse_constant=_reject_constant).raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise _bad_body("unexpected EOF") from None
        raise _bad_body(f"invalid character '{text[exc.pos]}' {exc.msg[0].lower()}{exc.msg[1:]}") from None
    except ValueError as exc:
        raise _bad_body(str(exc)) from None
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_error(value: Any, where: str, gotype: str) -> ApiError:
    kind = _json_kind(value)
    return _bad_body(f"json: cannot unmarshal {kind} into Go struct field {where} of type {gotype}")


def _fold_keys(obj: dict[str, Any]) -> dict[str, Any]:
    """Go matches JSON keys to struct fields case-insensitively; the last occurrence wins."""
    return {key.lower(): value for key, value in obj.items()}


def _as_object(value: Any, gotype: str) -> dict[str, Any] | None:
    """Return ``value`` as a key-folded object, ``None`` for JSON null, or raise a 400."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go value of type {gotype}")
    return _fold_keys(value)


def _get_str(obj: dict[str, Any], key: str, default: str, where: str) -> str:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise _type_error(value, f"{where}.{key}", "string")
    return value


def _get_bool(obj: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(value, f"{where}.{key}", "bool")
    return value


def _get_float32(obj: dict[str, Any], key: str, default: float, where: str) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(value, f"{where}.{key}", "float32")
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def _get_int(obj: dict[str, Any], key: str, default: int, where: str, gotype: str) -> int:
    value = obj.get(key)
    if value is None:
        return default
    low, high = _INT_LIMITS[gotype]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            target = f"Go struct field {where}.{key} of type {gotype}"
            raise _bad_body(f"json: cannot unmarshal number {value} into {target}")
        raise _type_error(value, f"{where}.{key}", gotype)
    return value


def _float32_json(value: float) -> int | float:
    """Render a float32 the way Go's ``json.Marshal`` does (shortest round-trip form)."""
    packed = struct.pack("f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("f", candidate) == packed:
            value = candidate
            break
    return int(value) if value.is_integer() else value


# --------------------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------------------


def _split_hostport(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` / ``:port`` like Go's ``net.SplitHostPort``."""
    if not address:
        return "", 0  # Go's net.Listen("tcp", ""): all interfaces, any port
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or not address[end + 1 :].startswith(":"):
            raise ValueError(f"address {address}: missing port in address")
        host, port_text = address[1:end], address[end + 2 :]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address}: missing port in address")
        if ":" in host:
            raise ValueError(f"address {address}: too many colons in address")
    if not port_text:
        return host, 0  # "127.0.0.1:" means an ephemeral port, as in Go
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, int(port_text)


def _format_sockname(sockname: tuple[Any, ...]) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _resolve_listen(address: str) -> tuple[socket.AddressFamily, tuple[Any, ...]] | None:
    """Resolve a listen address to (family, sockaddr); ``None`` means "all interfaces"."""
    host, port = _split_hostport(address)
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"lookup {host}: no such host") from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # Go prefers IPv4
        return infos[0][0], infos[0][4]
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, (str(ip), port)


async def _canonical_listen(address: str) -> str:
    """What Go's ``net.ResolveTCPAddr(address).String()`` gives (used to detect changes)."""
    resolved = await _resolve_listen(address)
    if resolved is None:
        return f":{_split_hostport(address)[1]}"
    return _format_sockname(resolved[1])


async def _bind(address: str) -> socket.socket:
    """Create a listening socket for ``address`` (port 0 picks a free port)."""
    resolved = await _resolve_listen(address)
    if resolved is None:
        port = _split_hostport(address)[1]
        if socket.has_dualstack_ipv6():
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("0.0.0.0", port))
    family, sockaddr = resolved
    return socket.create_server(sockaddr, family=family)


# --------------------------------------------------------------------------------------
# Toxics and links
# --------------------------------------------------------------------------------------


@dataclass
class _Toxic:
    """A toxic as configured through the API (shared by every link it applies to)."""

    name: str
    type: str
    stream: str
    direction: str
    toxicity: float
    attributes: dict[str, int]
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {
            "attributes": dict(self.attributes),
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": _float32_json(self.toxicity),
        }


@dataclass
class _ToxicState:
    """Per-link state of one toxic: whether it applies (toxicity roll) and its counters."""

    toxic: _Toxic
    active: bool
    transmitted: int = 0  # limit_data: bytes let through on this link
    debt: float = 0.0  # bandwidth: seconds of transmission time still owed
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)  # timeout toxic


def _resolve_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Link:
    """One direction of a proxied connection: source reader -> toxic chain -> destination."""

    def __init__(
        self,
        conn: _Connection,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.conn = conn
        self.direction = direction
        self._reader = reader
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._rng = conn.proxy.core.rng
        self._states: dict[int, _ToxicState] = {}
        self._order: list[_ToxicState] = []
        self._buf: collections.deque[tuple[bytes, float]] = collections.deque()
        self._buf_bytes = 0
        self._src_eof = False
        self.finished = False
        self._torn_down = False
        self._close_from: int | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._waiter_idle = False
        self._space = asyncio.Event()
        self._space.set()

    # ---- chain changes (called on the loop thread by the API) -------------------------

    def attach(self, toxic: _Toxic) -> None:
        state = _ToxicState(toxic, active=self._rng.random() < toxic.toxicity)
        self._states[toxic.seq] = state
        self._order.append(state)
        self._order.sort(key=lambda st: st.toxic.seq)
        self._arm_timer(state)
        self._wake(idle_only=False)

    def update(self, toxic: _Toxic) -> None:
        state = self._states.get(toxic.seq)
        if state is None:
            return
        state.active = self._rng.random() < toxic.toxicity
        state.debt = 0.0
        self._arm_timer(state)
        self._wake(idle_only=False)

    def detach(self, toxic: _Toxic) -> None:
        state = self._states.pop(toxic.seq, None)
        if state is None:
            return
        self._order.remove(state)
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if toxic.type == "timeout" and state.active:
            # Toxiproxy's TimeoutToxic.Cleanup closes the stream: data was dropped, so the
            # byte stream can't be resumed consistently.
            self._request_close(toxic.seq)
        self._wake(idle_only=False)

    def tear_down(self) -> None:
        self._torn_down = True
        self._space.set()
        for state in self._order:
            if state.timer is not None:
                state.timer.cancel()
        self._wake(idle_only=False)

    # ---- timers / wakeups ---------------------------------------------------------------

    def _arm_timer(self, state: _ToxicState) -> None:
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if state.toxic.type == "timeout" and state.active and state.toxic.attributes["timeout"] > 0:
            delay = state.toxic.attributes["timeout"] / 1000.0
            state.timer = self._loop.call_later(delay, self._timer_fired, state)

    def _timer_fired(self, state: _ToxicState) -> None:
        state.timer = None
        if self._states.get(state.toxic.seq) is state:
            LOG.debug("toxic.timeout.fired toxic=%s link=%s", state.toxic.name, self.direction)
            self._request_close(state.toxic.seq)

    def _request_close(self, seq: int) -> None:
        """Close the link's output as the toxic at ``seq`` does (later toxics see EOF)."""
        if self._close_from is None or seq < self._close_from:
            self._close_from = seq
        self._wake(idle_only=False)

    def _wake(self, idle_only: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self._waiter_idle or not idle_only):
            waiter.set_result(None)

    async def _idle_wait(self) -> None:
        fut = self._loop.create_future()
        self._waiter, self._waiter_idle = fut, True
        try:
            await fut
        finally:
            self._waiter = None

    async def _sleep(self, seconds: float, seq: int | None, closing_ok: bool = False) -> int:
        """Sleep, returning early with ``_REMOVED`` if toxic ``seq`` leaves the chain or with
        ``_CLOSED`` if the link is torn down (or closed, unless ``closing_ok``)."""
        deadline = self._loop.time() + seconds
        while True:
            if self._torn_down or (self._close_from is not None and not closing_ok):
                return _CLOSED
            if seq is not None and seq not in self._states:
                return _REMOVED
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return _DONE
            fut = self._loop.create_future()
            self._waiter, self._waiter_idle = fut, False
            handle = self._loop.call_later(remaining, _resolve_future, fut)
            try:
                await fut
            finally:
                handle.cancel()
                self._waiter = None

    # ---- tasks ----------------------------------------------------------------------------

    async def read_loop(self) -> None:
        """Read chunks from the source into the buffer until EOF (discarding once finished)."""
        reader = self._reader
        try:
            while True:
                data = await reader.read(CHUNK_SIZE)
                if not data:
                    break
                if self.finished or self._torn_down:
                    continue
                self._buf.append((data, self._loop.time()))
                self._buf_bytes += len(data)
                self._wake(idle_only=True)
                if self._buf_bytes >= LINK_BUFFER_BYTES:
                    self._space.clear()
                    await self._space.wait()
        except (ConnectionError, OSError) as exc:
            LOG.debug("link.src_error proxy=%s link=%s error=%r", self.conn.proxy.name, self.direction, exc)
        finally:
            self._src_eof = True
            self._wake(idle_only=True)

    async def process_loop(self) -> None:
        """Push buffered chunks through the toxic chain; close the destination at the end."""
        try:
            while not self._torn_down:
                if self._close_from is not None:
                    await self._finish(self._close_from)
                    return
                if self._buf:
                    data, stamp = self._buf.popleft()
                    self._buf_bytes -= len(data)
                    if self._buf_bytes < LINK_BUFFER_BYTES:
                        self._space.set()
                    if self._order:
                        await self._emit(data, stamp, 0)
                    else:
                        await self._write(data)
                    continue
                if self._src_eof:
                    await self._finish(0)
                    return
                await self._idle_wait()
        except (ConnectionError, OSError) as exc:
            LOG.debug("link.dest_error proxy=%s link=%s error=%r", self.conn.proxy.name, self.direction, exc)
        finally:
            self.finished = True
            self._space.set()
            self.conn.close_transport(self._writer)
            self.conn.link_finished()

    # ---- data path ----------------------------------------------------------------------

    def _next_state(self, after: int) -> _ToxicState | None:
        for state in self._order:
            if state.toxic.seq > after and state.active:
                return state
        return None

    async def _write(self, data: bytes) -> None:
        writer = self._writer
        if writer.transport.is_closing():
            raise ConnectionResetError("destination closed")
        writer.write(data)
        await writer.drain()

    async def _emit(self, data: bytes, stamp: float, after: int) -> None:
        """Hand ``data`` to the first applicable toxic after position ``after`` (or write it)."""
        if self._close_from is not None or self._torn_down:
            return
        state = self._next_state(after)
        if state is None:
            await self._write(data)
            return
        kind = state.toxic.type
        if kind == "latency":
            await self._latency(state, data, stamp)
        elif kind == "bandwidth":
            await self._bandwidth(state, data, stamp)
        elif kind == "slicer":
            await self._slicer(state, data, stamp)
        elif kind == "limit_data":
            await self._limit_data(state, data, stamp)
        elif kind == "timeout":
            self._arm_timer(state)  # data is dropped; Toxiproxy restarts its timer per chunk
        elif kind == "reset_peer":
            await self._reset_peer(state)
        else:  # noop, slow_close: pass data through
            await self._emit(data, stamp, state.toxic.seq)

    async def _latency(self, state: _ToxicState, data: bytes, stamp: float) -> None:
        attrs = state.toxic.attributes
        delay_ms = attrs["latency"]
        if attrs["jitter"] > 0:
            delay_ms += self._rng.randrange(2 * attrs["jitter"]) - attrs["jitter"]
        sleep = delay_ms / 1000.0 - (self._loop.time() - stamp)
        if sleep > 0:
            outcome = await self._sleep(sleep, state.toxic.seq)
            if outcome == _CLOSED:
                return
            if outcome == _DONE:
                stamp += sleep
        await self._emit(data, stamp, state.toxic.seq)

    async def _bandwidth(self, state: _ToxicState, data: bytes, stamp: float) -> None:
        seq = state.toxic.seq
        rate = state.toxic.attributes["rate"]  # KB/s == bytes per ms
        if rate <= 0:
            state.debt = 0.0
            await self._emit(data, stamp, seq)
            return
        state.debt += len(data) / (rate * 1000.0)
        piece = rate * 100  # what the rate allows in 100 ms
        while len(data) > piece:
            outcome = await self._sleep(0.1, seq)
            if outcome == _CLOSED:
                return
            if outcome == _REMOVED:
                break
            await self._emit(data[:piece], stamp, seq)
            data = data[piece:]
            state.debt -= 0.1
        else:
            start = self._loop.time()
            outcome = await self._sleep(state.debt, seq)
            if outcome == _CLOSED:
                return
            state.debt -= self._loop.time() - start
        await self._emit(data, stamp, seq)

    def _slice_bounds(self, start: int, end: int, average: int, variation: int, out: list[int]) -> None:
        """Toxiproxy's recursive halving: stop once a piece is within average+variation."""
        if (end - start) - average <= variation:
            out.append(end)
            return
        mid = start + (end - start) // 2
        if variation > 0:
            mid += self._rng.randrange(2 * variation) - variation
        mid = min(max(mid, start + 1), end - 1)
        self._slice_bounds(start, mid, average, variation, out)
        self._slice_bounds(mid, end, average, variation, out)

    async def _slicer(self, state: _ToxicState, data: bytes, stamp: float) -> None:
        seq = state.toxic.seq
        attrs = state.toxic.attributes
        delay = attrs["delay"] / 1_000_000.0
        ends: list[int] = []
        self._slice_bounds(0, len(data), max(1, attrs["average_size"]), max(0, attrs["size_variation"]), ends)
        view = memoryview(data)
        start = 0
        for end in ends:
            await self._emit(bytes(view[start:end]), stamp, seq)
            start = end
            if delay > 0:
                outcome = await self._sleep(delay, seq)
                if outcome == _CLOSED:
                    return
                if outcome == _REMOVED:
                    if start < len(data):
                        await self._emit(bytes(view[start:]), stamp, seq)
                    return

    async def _limit_data(self, state: _ToxicState, data: bytes, stamp: float) -> None:
        limit = state.toxic.attributes["bytes"]
        remaining = max(0, limit - state.transmitted)
        if remaining < len(data):
            data = data[:remaining]
        if data:
            state.transmitted += len(data)
            await self._emit(data, stamp, state.toxic.seq)
        if limit - state.transmitted <= 0:
            self._request_close(state.toxic.seq)

    async def _reset_peer(self, state: _ToxicState) -> None:
        # Like Toxiproxy: the first chunk (dropped) starts the countdown, which removal of the
        # toxic does not cancel; then both sockets are closed with SO_LINGER=0 (RST).
        outcome = await self._sleep(state.toxic.attributes["timeout"] / 1000.0, None)
        if outcome == _CLOSED:
            return
        self.conn.set_reset()
        self._request_close(state.toxic.seq)

    async def _finish(self, after: int) -> None:
        """Propagate EOF through the toxics after ``after`` (slow_close / reset_peer act)."""
        seq = after
        while (state := self._next_state(seq)) is not None:
            seq = state.toxic.seq
            if state.toxic.type == "slow_close":
                delay = state.toxic.attributes["delay"] / 1000.0
                if await self._sleep(delay, seq, closing_ok=True) == _CLOSED:
                    return
            elif state.toxic.type == "reset_peer":
                timeout = state.toxic.attributes["timeout"] / 1000.0
                if await self._sleep(timeout, None, closing_ok=True) == _CLOSED:
                    return
                self.conn.set_reset()


class _Connection:
    """A client socket, its upstream socket and the two links between them."""

    def __init__(
        self,
        proxy: _Proxy,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        self.proxy = proxy
        self.reset = False
        self.peer = _format_sockname(client[1].get_extra_info("peername") or ("?", 0))
        self._writers = (client[1], upstream[1])
        self.links = (
            _Link(self, "upstream", client[0], upstream[1]),
            _Link(self, "downstream", upstream[0], client[1]),
        )
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, toxics: list[_Toxic]) -> None:
        for link in self.links:
            for toxic in toxics:
                if toxic.direction == link.direction:
                    link.attach(toxic)
        for link in self.links:
            self._tasks.append(asyncio.create_task(link.read_loop()))
            self._tasks.append(asyncio.create_task(link.process_loop()))

    def set_reset(self) -> None:
        """Make closing either socket send RST instead of FIN."""
        if self.reset:
            return
        self.reset = True
        for writer in self._writers:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError as exc:
                    LOG.debug("conn.linger_failed proxy=%s error=%r", self.proxy.name, exc)

    def close_transport(self, writer: asyncio.StreamWriter) -> None:
        if self.reset:
            writer.transport.abort()
        else:
            writer.close()

    def link_finished(self) -> None:
        if all(link.finished for link in self.links):
            for writer in self._writers:
                self.close_transport(writer)
            self.proxy.connections.pop(self, None)
            LOG.debug("conn.closed proxy=%s client=%s", self.proxy.name, self.peer)

    async def teardown(self) -> None:
        """Drop the connection now (proxy disabled/deleted): both peers see EOF."""
        for link in self.links:
            link.tear_down()
        for writer in self._writers:
            self.close_transport(writer)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.proxy.connections.pop(self, None)


class _Proxy:
    """A named listener forwarding to one upstream through a chain of toxics."""

    def __init__(self, core: _Core, name: str, listen: str, upstream: str) -> None:
        self.core = core
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self.toxics: list[_Toxic] = []
        self.connections: dict[_Connection, None] = {}  # insertion-ordered for reproducibility
        self._server: asyncio.Server | None = None
        self._epoch = 0

    def toxics_json(self) -> list[dict[str, Any]]:
        ordered = [t for d in _DIRECTIONS for t in self.toxics if t.direction == d]
        return [toxic.to_json() for toxic in ordered]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            "toxics": self.toxics_json(),
        }

    def find_toxic(self, name: str) -> _Toxic | None:
        return next((toxic for toxic in self.toxics if toxic.name == name), None)

    async def start(self) -> None:
        if self.enabled:
            raise _AlreadyStarted
        try:
            sock = await _bind(self.listen)
        except ValueError as exc:  # unparsable address: Go's OpError has no Addr then
            LOG.warning("proxy.listen_failed name=%s listen=%s error=%s", self.name, self.listen, exc)
            raise ApiError(f"listen tcp: {exc}", 500) from None
        except OSError as exc:
            LOG.warning("proxy.listen_failed name=%s listen=%s error=%s", self.name, self.listen, exc)
            detail = f"bind: {exc.strerror.lower()}" if exc.strerror else str(exc)
            raise ApiError(f"listen tcp {self.listen}: {detail}", 500) from None
        self.listen = _format_sockname(sock.getsockname())
        self._server = await asyncio.start_server(self._on_client, sock=sock, limit=2 * CHUNK_SIZE)
        self.enabled = True
        LOG.info("proxy.started name=%s listen=%s upstream=%s", self.name, self.listen, self.upstream)

    async def stop(self) -> None:
        if not self.enabled:
            return
        self.enabled = False
        self._epoch += 1
        if self._server is not None:
            self._server.close()
            self._server = None
        conns = list(self.connections)
        await asyncio.gather(*(conn.teardown() for conn in conns))
        LOG.info("proxy.stopped name=%s dropped_connections=%d", self.name, len(conns))

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        epoch = self._epoch
        peer = writer.get_extra_info("peername")
        try:
            host, port = _split_hostport(self.upstream)
            upstream = await asyncio.wait_for(
                asyncio.open_connection(host or None, port, limit=2 * CHUNK_SIZE), UPSTREAM_CONNECT_TIMEOUT_S
            )
        except (TimeoutError, OSError, ValueError) as exc:
            LOG.warning("proxy.dial_failed name=%s upstream=%s error=%r", self.name, self.upstream, exc)
            writer.close()
            return
        except asyncio.CancelledError:  # shutdown mid-dial; top of a handler task, nothing to propagate
            writer.close()
            return
        if epoch != self._epoch or not self.enabled:
            writer.close()
            upstream[1].close()
            return
        conn = _Connection(self, (reader, writer), upstream)
        self.connections[conn] = None
        conn.start(self.toxics)
        LOG.debug("proxy.accepted name=%s client=%s", self.name, peer)

    def add_toxic(self, toxic: _Toxic) -> None:
        self.toxics.append(toxic)
        for conn in list(self.connections):
            for link in conn.links:
                if link.direction == toxic.direction:
                    link.attach(toxic)

    def update_toxic(self, toxic: _Toxic) -> None:
        for conn in list(self.connections):
            for link in conn.links:
                link.update(toxic)

    def remove_toxic(self, toxic: _Toxic) -> None:
        self.toxics.remove(toxic)
        for conn in list(self.connections):
            for link in conn.links:
                link.detach(toxic)


# --------------------------------------------------------------------------------------
# The API
# --------------------------------------------------------------------------------------


@dataclass
class _Response:
    status: int
    body: bytes = b""
    content_type: str | None = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)


def _json_response(value: Any, status: int = 200) -> _Response:
    return _Response(status, _dumps(value))


def _error_response(err: ApiError) -> _Response:
    # Toxiproxy writes errors with net/http's http.Error: text/plain, trailing newline.
    return _Response(
        err.status,
        _dumps(err.to_json()) + b"\n",
        "text/plain; charset=utf-8",
        [("X-Content-Type-Options", "nosniff")],
    )


class _Core:
    """Proxy collection plus the HTTP API; everything runs on one event loop."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.proxies: dict[str, _Proxy] = {}
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()
        self._api_server: asyncio.Server | None = None
        self._api_tasks: set[asyncio.Task[Any]] = set()
        self._api_writers: set[asyncio.StreamWriter] = set()
        self.api_address = ""

    # ---- lifecycle ----------------------------------------------------------------------

    async def start_api(self, host: str, port: int) -> str:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        sock = await _bind(address)
        self.api_address = _format_sockname(sock.getsockname())
        self._api_server = await asyncio.start_server(self._handle_http, sock=sock)
        LOG.info("api.started address=%s version=%s", self.api_address, VERSION)
        return self.api_address

    async def shutdown(self) -> None:
        if self._api_server is not None:
            self._api_server.close()
            self._api_server = None
        # Closing the transports ends each handler at its next read (EOF); cancelling them
        # instead makes asyncio's stream callback log the CancelledError.
        for writer in list(self._api_writers):
            writer.close()
        if self._api_tasks:
            _, stuck = await asyncio.wait(set(self._api_tasks), timeout=2.0)
            for task in stuck:
                task.cancel()
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        self.proxies.clear()
        LOG.info("api.stopped address=%s", self.api_address)

    # ---- HTTP ---------------------------------------------------------------------------

    async def _handle_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._api_tasks.add(task)
        self._api_writers.add(writer)
        try:
            while await self._serve_one(reader, writer):
                pass
        except (ConnectionError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:  # shutdown; 3.11's stream callback would log a re-raise
            pass
        finally:
            self._api_writers.discard(writer)
            if task is not None:
                self._api_tasks.discard(task)
            writer.close()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; return whether the connection stays open.

        Reading is time-bounded like Go's http.Server (idle / read timeouts); running the
        handler is not, so an API call is never cancelled half-way through a change."""
        try:
            line = await asyncio.wait_for(self._read_request_line(reader), API_IDLE_TIMEOUT_S)
            if not line:
                return False
            request = await asyncio.wait_for(self._read_request(line, reader, writer), API_READ_TIMEOUT_S)
        except TimeoutError:
            return False
        if isinstance(request, _Response):
            await self._send(writer, request, False)
            return False
        method, target, headers, body, keep_alive = request
        response = await self._dispatch(method, target, headers, body)
        LOG.debug("api.request method=%s path=%s status=%d", method, target, response.status)
        await self._send(writer, response, keep_alive)
        return keep_alive

    @staticmethod
    async def _read_request_line(reader: asyncio.StreamReader) -> bytes:
        line = await reader.readline()
        while line in (b"\r\n", b"\n"):  # tolerate stray CRLFs between requests (RFC 9112)
            line = await reader.readline()
        return line

    async def _read_request(
        self, line: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> _Response | tuple[str, str, dict[str, str], bytes, bool]:
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _Response(400, b"400 Bad Request", "text/plain; charset=utf-8")
        method, target, version = parts
        headers: dict[str, str] = {}
        while True:
            raw = await reader.readline()
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await self._read_body(reader, headers)
        if body is None:
            return _Response(413, b"", None)
        return method, target, headers, body, keep_alive

    @staticmethod
    async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes | None:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks: list[bytes] = []
            total = 0
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY_BYTES:
                    return None
                chunks.append(await reader.readexactly(size))
                await reader.readline()
        length = int(headers.get("content-length", "0") or "0")
        if length > MAX_BODY_BYTES:
            return None
        return await reader.readexactly(length) if length > 0 else b""

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, response: _Response, keep_alive: bool) -> None:
        reason = _HTTP_REASONS.get(response.status, "Unknown")
        lines = [f"HTTP/1.1 {response.status} {reason}", f"Date: {email.utils.formatdate(usegmt=True)}"]
        if response.content_type is not None:
            lines.append(f"Content-Type: {response.content_type}")
        lines.extend(f"{name}: {value}" for name, value in response.headers)
        if response.status != 204:
            lines.append(f"Content-Length: {len(response.body)}")
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        writer.write(head + (response.body if response.status != 204 else b""))
        await writer.drain()

    async def _dispatch(self, method: str, target: str, headers: dict[str, str], body: bytes) -> _Response:
        if headers.get("user-agent", "").startswith("Mozilla/"):
            return _Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        path = unquote(urlsplit(target).path)
        segments = path.split("/")[1:] if path.startswith("/") else []
        route = self._route(segments)
        if route is None:
            return _Response(
                404,
                b"404 page not found\n",
                "text/plain; charset=utf-8",
                [("X-Content-Type-Options", "nosniff")],
            )
        handlers, args = route
        handler = handlers.get(method)
        if handler is None:
            return _Response(405, b"", None)
        async with self._lock:
            try:
                return await handler(body, *args)
            except ApiError as err:
                return _error_response(err)
            except Exception as exc:  # noqa: BLE001 - any failure must become a 500 body
                LOG.exception("api.handler_failed method=%s path=%s", method, path)
                return _error_response(ApiError(str(exc) or type(exc).__name__, 500))

    def _route(self, seg: list[str]) -> tuple[dict[str, Callable[..., Any]], tuple[str, ...]] | None:
        if any(not part for part in seg):
            return None
        if seg == ["version"]:
            return {"GET": self._version}, ()
        if seg == ["reset"]:
            return {"POST": self._reset}, ()
        if seg == ["populate"]:
            return {"POST": self._populate}, ()
        if seg == ["proxies"]:
            return {"GET": self._proxy_index, "POST": self._proxy_create}, ()
        if len(seg) >= 2 and seg[0] == "proxies":
            if len(seg) == 2:
                update: Callable[..., Any] = self._proxy_update
                methods: dict[str, Callable[..., Any]] = {
                    "GET": self._proxy_show,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self._proxy_delete,
                }
                return methods, (seg[1],)
            if len(seg) == 3 and seg[2] == "toxics":
                return {"GET": self._toxic_index, "POST": self._toxic_create}, (seg[1],)
            if len(seg) == 4 and seg[2] == "toxics":
                update = self._toxic_update
                methods = {  # same type as above
                    "GET": self._toxic_show,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self._toxic_delete,
                }
                return methods, (seg[1], seg[3])
        return None

    def _get_proxy(self, name: str) -> _Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise _err_proxy_not_found()
        return proxy

    # ---- handlers -------------------------------------------------------------------------

    async def _version(self, _body: bytes) -> _Response:
        return _Response(200, f'{{"version": "{VERSION}"}}\n'.encode(), "application/json;charset=utf-8")

    async def _reset(self, _body: bytes) -> _Response:
        for proxy in list(self.proxies.values()):
            try:
                await proxy.start()
            except _AlreadyStarted:
                pass
            for toxic in list(proxy.toxics):
                proxy.remove_toxic(toxic)
        LOG.info("api.reset proxies=%d", len(self.proxies))
        return _Response(204, b"", None)

    async def _proxy_index(self, _body: bytes) -> _Response:
        return _json_response({name: self.proxies[name].to_json() for name in sorted(self.proxies)})

    async def _proxy_create(self, body: bytes) -> _Response:
        obj = _as_object(_decode_json(body), "toxiproxy.Proxy") or {}
        name = _get_str(obj, "name", "", "Proxy")
        listen = _get_str(obj, "listen", "", "Proxy")
        upstream = _get_str(obj, "upstream", "", "Proxy")
        enabled = _get_bool(obj, "enabled", True, "Proxy")
        if not name:
            raise _missing("name")
        if not upstream:
            raise _missing("upstream")
        if name in self.proxies:
            raise ApiError("proxy already exists", 409)
        proxy = _Proxy(self, name, listen, upstream)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return _json_response(proxy.to_json(), 201)

    async def _populate(self, body: bytes) -> _Response:
        proxies: list[_Proxy] = []
        error: ApiError | None = None
        try:
            proxies = await self._populate_proxies(body, proxies)
        except ApiError as err:
            error = err
        payload: dict[str, Any] = error.to_json() if error is not None else {}
        payload["proxies"] = [proxy.to_json() for proxy in proxies] or None
        return _json_response(payload, error.status if error is not None else 201)

    async def _populate_proxies(self, body: bytes, done: list[_Proxy]) -> list[_Proxy]:
        value = _decode_json(body)
        if value is None:
            value = []
        if not isinstance(value, list):
            kind = _json_kind(value)
            raise _bad_body(f"json: cannot unmarshal {kind} into Go value of type []toxiproxy.Proxy")
        specs: list[tuple[str, str, str, bool]] = []
        for item in value:
            obj = _as_object(item, "toxiproxy.Proxy") or {}
            name = _get_str(obj, "name", "", "")
            listen = _get_str(obj, "listen", "", "")
            upstream = _get_str(obj, "upstream", "", "")
            enabled = _get_bool(obj, "enabled", True, "")
            specs.append((name, listen, upstream, enabled))
        for index, (name, _listen, upstream, _enabled) in enumerate(specs, start=1):
            if not name:
                raise _missing(f"name at proxy {index}")
            if not upstream:
                raise _missing(f"upstream at proxy {index}")
        for name, listen, upstream, enabled in specs:
            existing = self.proxies.get(name)
            if existing is not None:
                try:
                    canonical = await _canonical_listen(listen)
                except (OSError, ValueError) as exc:
                    raise ApiError(str(exc), 500) from None
                if canonical == existing.listen and upstream == existing.upstream:
                    done.append(existing)
                    continue
                # Like Toxiproxy's AddOrReplace: the old proxy is stopped first (it may hold
                # the port) and stays registered, stopped, if the replacement fails to start.
                await existing.stop()
            proxy = _Proxy(self, name, listen, upstream)
            if enabled:
                await proxy.start()
            self.proxies[name] = proxy
            done.append(proxy)
        LOG.info("api.populate proxies=%d", len(done))
        return done

    async def _proxy_show(self, _body: bytes, name: str) -> _Response:
        return _json_response(self._get_proxy(name).to_json())

    async def _proxy_update(self, body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        obj = _as_object(_decode_json(body), "toxiproxy.Proxy") or {}
        listen = _get_str(obj, "listen", proxy.listen, "Proxy")
        upstream = _get_str(obj, "upstream", proxy.upstream, "Proxy")
        enabled = _get_bool(obj, "enabled", proxy.enabled, "Proxy")
        try:
            canonical = await _canonical_listen(listen)
        except (OSError, ValueError) as exc:
            raise ApiError(str(exc), 500) from None
        if canonical != proxy.listen or upstream != proxy.upstream:
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled != proxy.enabled:
            if enabled:
                await proxy.start()
            else:
                await proxy.stop()
        return _json_response(proxy.to_json())

    async def _proxy_delete(self, _body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        await proxy.stop()
        del self.proxies[name]
        LOG.info("proxy.deleted name=%s", name)
        return _Response(204, b"", None)

    async def _toxic_index(self, _body: bytes, name: str) -> _Response:
        return _json_response(self._get_proxy(name).toxics_json())

    async def _toxic_create(self, body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        obj = _as_object(_decode_json(body), "toxics.ToxicWrapper") or {}
        toxic_name = _get_str(obj, "name", "", "ToxicWrapper")
        toxic_type = _get_str(obj, "type", "", "ToxicWrapper")
        stream = _get_str(obj, "stream", "downstream", "ToxicWrapper")
        toxicity = _get_float32(obj, "toxicity", 1.0, "ToxicWrapper")
        raw_attrs = obj.get("attributes")
        if raw_attrs is not None and not isinstance(raw_attrs, dict):
            raise _type_error(raw_attrs, "ToxicWrapper.attributes", "toxics.Toxic")
        direction = stream.lower()
        if direction not in _DIRECTIONS:
            raise ApiError("stream was invalid, can be either upstream or downstream", 400)
        if not toxic_name:
            toxic_name = f"{toxic_type}_{stream}"
        if toxic_type not in _TOXIC_ATTRS:
            raise ApiError("invalid toxic type", 400)
        if proxy.find_toxic(toxic_name) is not None:
            raise ApiError("toxic already exists", 409)
        attributes = {attr: 0 for attr, _ in _TOXIC_ATTRS[toxic_type]}
        attributes.update(_parse_attributes(toxic_type, raw_attrs, attributes))
        toxic = _Toxic(toxic_name, toxic_type, stream, direction, toxicity, attributes, next(self._seq))
        proxy.add_toxic(toxic)
        LOG.info(
            "toxic.added proxy=%s toxic=%s type=%s stream=%s toxicity=%s attributes=%s",
            proxy.name,
            toxic.name,
            toxic.type,
            toxic.stream,
            toxic.toxicity,
            toxic.attributes,
        )
        return _json_response(toxic.to_json())

    async def _toxic_show(self, _body: bytes, name: str, toxic_name: str) -> _Response:
        toxic = self._get_proxy(name).find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        return _json_response(toxic.to_json())

    async def _toxic_update(self, body: bytes, name: str, toxic_name: str) -> _Response:
        proxy = self._get_proxy(name)
        toxic = proxy.find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        obj = _as_object(_decode_json(body), "struct { Attributes interface {}; Toxicity float32 }") or {}
        raw_attrs = obj.get("attributes")
        if raw_attrs is not None and not isinstance(raw_attrs, dict):
            raise _type_error(raw_attrs, ".attributes", "toxics.Toxic")
        toxicity = _get_float32(obj, "toxicity", toxic.toxicity, "")
        attributes = _parse_attributes(toxic.type, raw_attrs, toxic.attributes)
        toxic.attributes.update(attributes)
        toxic.toxicity = toxicity
        proxy.update_toxic(toxic)
        LOG.info("toxic.updated proxy=%s toxic=%s attributes=%s", proxy.name, toxic.name, toxic.attributes)
        return _json_response(toxic.to_json())

    async def _toxic_delete(self, _body: bytes, name: str, toxic_name: str) -> _Response:
        proxy = self._get_proxy(name)
        toxic = proxy.find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        proxy.remove_toxic(toxic)
        LOG.info("toxic.removed proxy=%s toxic=%s", proxy.name, toxic.name)
        return _Response(204, b"", None)


def _parse_attributes(toxic_type: str, raw: dict[str, Any] | None, current: dict[str, int]) -> dict[str, int]:
    """Validate toxic attributes against the Go struct (unknown keys ignored, ints only)."""
    if raw is None:
        return {}
    folded = _fold_keys(raw)
    where = f"{_TOXIC_STRUCTS[toxic_type]}.attributes"
    return {
        attr: _get_int(folded, attr, current.get(attr, 0), where, gotype)
        for attr, gotype in _TOXIC_ATTRS[toxic_type]
        if attr in folded
    }


# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


class EmbeddedToxiproxy:
    """A Toxiproxy-compatible server running on an asyncio loop in a daemon thread.

    >>> with EmbeddedToxiproxy(seed=1) as server:   # doctest: +SKIP
    ...     toxiproxy.Toxiproxy().update_api_consumer("127.0.0.1", server.port)
    """

    START_TIMEOUT_S = 10.0
    STOP_TIMEOUT_S = 10.0

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> None:
        self._host = host
        self._port = port
        self._seed = seed
        self._address = ""
        self._core: _Core | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API, e.g. ``http://127.0.0.1:8474``."""
        if not self._address:
            raise RuntimeError("EmbeddedToxiproxy is not running")
        return f"http://{self._address}"

    @property
    def port(self) -> int:
        """Port of the HTTP API (the real one when constructed with ``port=0``)."""
        return _split_hostport(self._address)[1] if self._address else self._port

    def start(self) -> None:
        """Start the loop thread and return once the API socket is listening."""
        if self._thread is not None:
            raise RuntimeError("EmbeddedToxiproxy already started")
        self._ready.clear()
        self._start_error = None
        self._thread = threading.Thread(target=self._run, name="embedded-toxiproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.START_TIMEOUT_S):
            raise TimeoutError(f"toxiproxy API did not start within {self.START_TIMEOUT_S}s")
        if self._start_error is not None:
            self._thread.join(self.STOP_TIMEOUT_S)
            self._thread = None
            raise self._start_error

    def stop(self) -> None:
        """Close every proxy, connection and the API listener, then end the loop thread."""
        loop, core, thread = self._loop, self._core, self._thread
        if loop is None or core is None or thread is None:
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(core.shutdown(), loop)
            try:
                future.result(self.STOP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - shutdown must not raise past stop()
                LOG.warning("embedded.shutdown_failed error=%r", exc)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(self.STOP_TIMEOUT_S)
        if thread.is_alive():
            LOG.warning("embedded.thread_still_alive after=%ss", self.STOP_TIMEOUT_S)
        self._thread = None
        self._loop = None
        self._core = None
        self._address = ""

    def __enter__(self) -> EmbeddedToxiproxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._core = _Core(self._seed)
            self._address = loop.run_until_complete(self._core.start_api(self._host, self._port))
        except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
            self._start_error = exc
            self._ready.set()
            loop.close()
            self._loop = None
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            _cancel_pending(loop)
            loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


async def _serve_forever(host: str, port: int, seed: int) -> None:
    core = _Core(seed)
    await core.start_api(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        LOG.info("api.signal_received shutting_down=1")
        await core.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description="Embedded Toxiproxy-compatible server")
    parser.add_argument("--host", default="127.0.0.1", help="API listen host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8474, help="API listen port (default 8474)")
    parser.add_argument("--seed", type=int, default=0, help="seed for jitter/toxicity/slicer randomness")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(_serve_forever(args.host, args.port, args.seed))
    except OSError as exc:
        LOG.error("api.start_failed host=%s port=%d error=%s", args.host, args.port, exc)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
