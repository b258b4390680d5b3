"""Minimal HTTP/1.1 server under the embedded Toxiproxy API: request reading with Go
``net/http``-like limits and timeouts, response writing, and dispatch to a route table that
the API class supplies.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from .common import (
    _HTTP_REASONS,
    API_IDLE_TIMEOUT_S,
    API_READ_TIMEOUT_S,
    MAX_BODY_BYTES,
    VERSION,
    ApiError,
    _bind,
    _dumps,
    _format_sockname,
)

LOG = logging.getLogger(__name__)

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


class _HttpServer:
    """The API's HTTP listener; subclasses supply ``_route`` and ``stop_proxies``."""

    def __init__(self) -> None:
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
        await self.stop_proxies()
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


    async def stop_proxies(self) -> None:
        """Stop everything the API created (called by ``shutdown`` after the listener)."""
        raise NotImplementedError

    def _route(self, seg: list[str]) -> tuple[dict[str, Callable[..., Any]], tuple[str, ...]] | None:
        """Map path segments to ``({method: handler}, args)``, or ``None`` for a 404."""
        raise NotImplementedError
