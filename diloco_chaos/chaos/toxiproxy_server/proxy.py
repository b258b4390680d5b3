"""Proxies and connections of the embedded Toxiproxy server: a named listener, the
upstream dial, and the pair of links (upstream, downstream) of every accepted connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import TYPE_CHECKING, Any

from .common import (
    _DIRECTIONS,
    CHUNK_SIZE,
    UPSTREAM_CONNECT_TIMEOUT_S,
    ApiError,
    _AlreadyStarted,
    _bind,
    _format_sockname,
    _split_hostport,
)
from .link import _Link, _Toxic

if TYPE_CHECKING:
    from .api import _Core

LOG = logging.getLogger(__name__)

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


