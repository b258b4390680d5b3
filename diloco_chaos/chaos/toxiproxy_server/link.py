"""One direction of a proxied connection and the toxics acting on it.

A link is a reader task that time-stamps chunks into a bounded buffer plus a processor task
that pushes each chunk through the link's toxic chain (ordered by creation, like Toxiproxy's
chain) and writes it out.  Adding, updating or removing a toxic re-links live connections: a
toxic sleeping on a chunk is interrupted and the chunk continues down the chain, as
Toxiproxy's ``InterruptToxic`` does.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .common import _CLOSED, _DONE, _REMOVED, CHUNK_SIZE, LINK_BUFFER_BYTES, _float32_json
from .toxic import TOXICS

if TYPE_CHECKING:
    from .proxy import _Connection

LOG = logging.getLogger(__name__)

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
    attributes: dict[str, float]
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
        self.loop = asyncio.get_running_loop()
        self.rng = conn.proxy.core.rng
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
        state = _ToxicState(toxic, active=self.rng.random() < toxic.toxicity)
        self._states[toxic.seq] = state
        self._order.append(state)
        self._order.sort(key=lambda st: st.toxic.seq)
        TOXICS[toxic.type].attached(self, state)
        self._wake(idle_only=False)

    def update(self, toxic: _Toxic) -> None:
        state = self._states.get(toxic.seq)
        if state is None:
            return
        state.active = self.rng.random() < toxic.toxicity
        TOXICS[toxic.type].attached(self, state)
        self._wake(idle_only=False)

    def detach(self, toxic: _Toxic) -> None:
        state = self._states.pop(toxic.seq, None)
        if state is None:
            return
        self._order.remove(state)
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        TOXICS[toxic.type].detached(self, state)
        self._wake(idle_only=False)

    def tear_down(self) -> None:
        self._torn_down = True
        self._space.set()
        for state in self._order:
            if state.timer is not None:
                state.timer.cancel()
        self._wake(idle_only=False)

    # ---- timers / wakeups ---------------------------------------------------------------

    def cancel_timer(self, state: _ToxicState) -> None:
        """Cancel the toxic's pending timer on this link, if any."""
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None

    def set_timer(self, state: _ToxicState, delay: float) -> None:
        """Close the link as the toxic does after ``delay`` seconds (unless cancelled first)."""
        self.cancel_timer(state)
        state.timer = self.loop.call_later(delay, self._timer_fired, state)

    def _timer_fired(self, state: _ToxicState) -> None:
        state.timer = None
        if self._states.get(state.toxic.seq) is state:
            LOG.debug("toxic.timeout.fired toxic=%s link=%s", state.toxic.name, self.direction)
            self.request_close(state.toxic.seq)

    def request_close(self, seq: int) -> None:
        """Close the link's output as the toxic at ``seq`` does (later toxics see EOF)."""
        if self._close_from is None or seq < self._close_from:
            self._close_from = seq
        self._wake(idle_only=False)

    def _wake(self, idle_only: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (self._waiter_idle or not idle_only):
            waiter.set_result(None)

    async def _idle_wait(self) -> None:
        fut = self.loop.create_future()
        self._waiter, self._waiter_idle = fut, True
        try:
            await fut
        finally:
            self._waiter = None

    async def sleep(self, seconds: float, seq: int | None, closing_ok: bool = False) -> int:
        """Sleep, returning early with ``_REMOVED`` if toxic ``seq`` leaves the chain or with
        ``_CLOSED`` if the link is torn down (or closed, unless ``closing_ok``)."""
        deadline = self.loop.time() + seconds
        while True:
            if self._torn_down or (self._close_from is not None and not closing_ok):
                return _CLOSED
            if seq is not None and seq not in self._states:
                return _REMOVED
            remaining = deadline - self.loop.time()
            if remaining <= 0:
                return _DONE
            fut = self.loop.create_future()
            self._waiter, self._waiter_idle = fut, False
            handle = self.loop.call_later(remaining, _resolve_future, fut)
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
                self._buf.append((data, self.loop.time()))
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
                        await self.emit(data, stamp, 0)
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

    async def emit(self, data: bytes, stamp: float, after: int) -> None:
        """Hand ``data`` to the first applicable toxic after position ``after`` (or write it)."""
        if self._close_from is not None or self._torn_down:
            return
        state = self._next_state(after)
        if state is None:
            await self._write(data)
            return
        await TOXICS[state.toxic.type].pipe(self, state, data, stamp)

    async def _finish(self, after: int) -> None:
        """Propagate EOF through the toxics after ``after`` (slow_close / reset_peer act)."""
        seq = after
        while (state := self._next_state(seq)) is not None:
            seq = state.toxic.seq
            if not await TOXICS[state.toxic.type].close(self, state):
                return


