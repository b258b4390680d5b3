"""The syncer's sockets and threads: listener, handshake, one reader and one writer per learner connection.

Readers put `InboxItem`s ("join", "msg", "leave") into one inbox queue that only the service's main loop
takes from; writers drain their connection's bounded queue (heartbeats when idle). Nothing the main loop
does waits on a socket: a slow or dead link only fills its own queue (the oldest frames are dropped first;
a fragment's newest value replaces an older one still waiting) and is cut after `timeouts.liveness_s` of
silence. Every frame that fails its checks, or whose type learners never send, is counted, logged and ends
that connection; a closed connection is forgotten. Kept apart from the algorithms
(diloco_chaos/harness/syncer/decoupled.py, diloco_chaos/harness/syncer/barrier.py) so they only ever see typed frames.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.learner import FrameRejected
from diloco_chaos.harness.record.syncer import (
    AuthFailed,
    ConnClosed,
    LinkStats,
    ReaderError,
    SendCoalesced,
    SendDropped,
)
from diloco_chaos.harness.wire.frame_auth import FrameAuth
from diloco_chaos.harness.wire.frame_limit import max_frame_bytes
from diloco_chaos.harness.wire.framing import (
    HEADER,
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    recv_message,
    send_message,
)
from diloco_chaos.harness.wire.handshake import new_nonce, verify_challenge
from diloco_chaos.harness.wire.precision import UP, WireCodec, WireDecodeError, wire_dtype_for

OUTQ_MAX = 256
DATA_FRAMES = frozenset({MsgType.PUSH, MsgType.GRADS, MsgType.PARAMS})
FROM_LEARNERS = DATA_FRAMES | {MsgType.META, MsgType.PING, MsgType.HEARTBEAT, MsgType.BYE}
"""What a learner's link sends after the handshake (diloco_chaos/harness/learner/syncer_link.py). Any other type (a
WELCOME, a FRAGMENT, a second HELLO) is only ever sent the other way or before: a peer sending it is broken or hostile,
and is cut off like one whose frame fails a check (kind "wrong_direction")."""


@dataclass
class Conn:
    """One learner connection: its socket, outbound queue and liveness."""

    cid: int
    sock: socket.socket
    peer: str
    learner: int | None = None
    outq: queue.Queue = field(default_factory=lambda: queue.Queue(OUTQ_MAX))
    latest: dict[int, Message] = field(default_factory=dict)
    """Fragment -> the newest merged value not yet sent; `outq` holds one ("latest", p) marker for it, so a slow
    link carries each fragment's newest version once instead of queueing every version behind the others."""
    latest_lock: threading.Lock = field(default_factory=threading.Lock)
    closed: threading.Event = field(default_factory=threading.Event)
    bytes_in: int = 0
    bytes_out: int = 0
    data_frames: int = 0
    data_bytes: int = 0
    data_late_bytes: int = 0
    data_rx_s: float = 0.0
    opened_at: float = field(default_factory=time.monotonic)
    stats_logged: bool = False
    closing: bool = False
    """A close is queued behind what was sent before it (`close_after_sent`: the answer to a learner's BYE)."""
    auth: FrameAuth | None = None
    """The connection's frame keys once the handshake has passed: every frame after it is signed."""
    codec: WireCodec = field(default_factory=lambda: WireCodec("fp32"))
    """The connection's wire codec (diloco_chaos/harness/wire/precision.py): encodes what the writer sends, decodes
    pushes."""


@dataclass(frozen=True)
class InboxItem:
    """What a reader hands the main loop."""

    kind: Literal["join", "msg", "leave"]
    conn: Conn
    msg: Message | None = None
    """The frame, for kind "msg"."""


class Transport:
    """The listener and every learner connection; who is connected (`by_learner`) and who said BYE."""

    def __init__(self, sc: Scenario, secret: bytes, events: EventLog, port: int = 0, host: str = "127.0.0.1") -> None:
        self.sc = sc
        self.secret = secret
        self.events = events
        self.t = sc.timeouts
        self.max_frame = max_frame_bytes(sc)
        self.inbox: queue.Queue[InboxItem] = queue.Queue()
        self.conns: dict[int, Conn] = {}
        """Open connections by id (a closed one is removed: `close`)."""
        self.by_learner: dict[int, Conn] = {}
        self.finished: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.frames_rejected = 0
        self.listener = socket.create_server((host, port))  # SO_REUSEADDR: a restart rebinds at once
        self.listener.settimeout(0.2)
        self.port: int = self.listener.getsockname()[1]
        self._cids = itertools.count(1)

    # -- membership --------------------------------------------------------------------------------
    def alive(self) -> frozenset[int]:
        """Learners with an authenticated connection that have not said BYE."""
        with self.lock:
            return frozenset(m for m in self.by_learner if m not in self.finished)

    def register(self, conn: Conn) -> Conn | None:
        """`conn` is now its learner's connection; returns the one it replaces, if any."""
        assert conn.learner is not None
        with self.lock:
            old = self.by_learner.get(conn.learner)
            self.by_learner[conn.learner] = conn
            self.finished.discard(conn.learner)
        return old if old is not conn else None

    def unregister(self, conn: Conn) -> None:
        """`conn` closed: forget it, unless a newer connection of its learner replaced it already."""
        assert conn.learner is not None
        with self.lock:
            if self.by_learner.get(conn.learner) is conn:
                del self.by_learner[conn.learner]

    def connection(self, learner: int) -> Conn | None:
        with self.lock:
            return self.by_learner.get(learner)

    def connections(self, learners: Iterable[int] | None = None) -> dict[int, Conn]:
        """Learner -> connection of those of `learners` (in their order; None: every learner) connected."""
        with self.lock:
            if learners is None:
                return dict(self.by_learner)
            return {m: self.by_learner[m] for m in learners if m in self.by_learner}

    # -- threads ---------------------------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self._accept, name="accept", daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(next(self._cids), sock, f"{peer[0]}:{peer[1]}",
                        codec=WireCodec(wire_dtype_for(self.sc.algorithm, self.sc.diloco.wire_dtype)))
            with self.lock:
                self.conns[conn.cid] = conn
            threading.Thread(target=self._reader, args=(conn,), name=f"rd{conn.cid}", daemon=True).start()

    def _handshake(self, conn: Conn) -> tuple[int, FrameAuth]:
        deadline = time.monotonic() + self.t.connect_s
        hello = recv_message(conn.sock, 4096, self.t.connect_s)
        if hello.type is not MsgType.HELLO:
            raise ConnectionError(f"expected HELLO, got {hello.type.name}")
        learner: int = hello.meta["learner"]  # a non-negative int: checked on decode (wire_messages.py)
        nonce = new_nonce()
        send_message(conn.sock, Message(MsgType.CHALLENGE, {"nonce": nonce.hex()}), self.t.socket_op_s)
        auth = recv_message(conn.sock, 4096, max(0.01, deadline - time.monotonic()))
        ok = (auth.type is MsgType.AUTH and auth.meta["learner"] == learner and learner < self.sc.topology.learners
              and verify_challenge(self.secret, nonce, learner, auth.meta["sig"]))
        if not ok:
            send_message(conn.sock, Message(MsgType.REJECT, {"reason": "bad credentials"}), self.t.socket_op_s)
            raise PermissionError(f"learner {learner} failed authentication")
        send_message(conn.sock, Message(MsgType.WELCOME, {"algorithm": self.sc.algorithm}), self.t.socket_op_s)
        return learner, FrameAuth.for_syncer(self.secret, nonce, learner)

    def _reader(self, conn: Conn) -> None:
        """One connection's reader thread. However it ends, the connection is closed with the reason logged:
        an unforeseen error on one connection's path (a bug) must neither leak its socket nor leave its
        learner counted alive, and it is raised on (the thread's traceback) rather than hidden."""
        try:
            self._read(conn)
        except BaseException as e:
            # logged even when the connection was closed already (replaced, or the run ending): a bug all the same
            self.events.write(ReaderError(learner=conn.learner, peer=conn.peer, error=f"{type(e).__name__}: {e}"))
            self.close(conn, f"reader failed: {type(e).__name__}: {e}")
            if conn.learner is not None:
                self.log_link_stats(conn)
                self.inbox.put(InboxItem("leave", conn))
            raise

    def _read(self, conn: Conn) -> None:
        try:
            learner, conn.auth = self._handshake(conn)
        except (OSError, FrameError, ConnectionClosed, ConnectionError, KeyError, ValueError) as e:
            self.events.write(AuthFailed(peer=conn.peer, error=f"{type(e).__name__}: {e}",
                                         kind=e.kind if isinstance(e, FrameError) else None))
            self.close(conn, "handshake failed")
            return
        conn.learner = learner
        self.inbox.put(InboxItem("join", conn))
        threading.Thread(target=self._writer, args=(conn,), name=f"wr{conn.cid}", daemon=True).start()
        timing: dict[str, float] = {}
        while not conn.closed.is_set():
            try:
                msg = recv_message(conn.sock, self.max_frame, self.t.liveness_s, timing, conn.auth)
            except FrameError as e:
                if conn.closed.is_set():  # closed under the read (replaced, or the run ending): cut short, not bad
                    break
                self.frames_rejected += 1
                self.events.write(FrameRejected(learner=learner, side="syncer", peer=conn.peer, kind=e.kind,
                                                error=str(e)))
                self.close(conn, f"rejected frame: {e.kind}")
                break
            except (OSError, ConnectionClosed) as e:
                self.close(conn, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                break
            conn.bytes_in += int(timing["bytes"])
            if msg.type in UP:
                try:
                    msg = conn.codec.decode(msg)
                except WireDecodeError as e:
                    self.frames_rejected += 1
                    self.events.write(FrameRejected(learner=learner, side="syncer", peer=conn.peer,
                                                    kind="bad_wire_encoding", error=str(e)))
                    self.close(conn, "rejected frame: bad_wire_encoding")
                    break
            if msg.type not in FROM_LEARNERS:
                self.frames_rejected += 1
                self.events.write(FrameRejected(learner=learner, side="syncer", peer=conn.peer, kind="wrong_direction",
                                                error=f"a {msg.type.name}, which learners never send"))
                self.close(conn, "rejected frame: wrong_direction")
                break
            if msg.type is MsgType.PING:
                self.send(conn, Message(MsgType.PONG, msg.meta))
                continue
            if msg.type in DATA_FRAMES:  # what the link's bandwidth is measured on, as the syncer receives it
                conn.data_frames += 1
                conn.data_bytes += int(timing["bytes"])
                late = int(timing["bytes"]) - HEADER.size - int(timing["ready_bytes"])
                if late > 0:  # bytes that arrived after the header: what the link's rate is measured on
                    conn.data_late_bytes += late
                    conn.data_rx_s += timing["end_t"] - timing["header_t"]
            if msg.type is not MsgType.HEARTBEAT:
                self.inbox.put(InboxItem("msg", conn, msg))
        self.log_link_stats(conn)
        self.inbox.put(InboxItem("leave", conn))

    def log_link_stats(self, conn: Conn) -> None:
        """Once per connection: what crossed it, and how long its data frames took to arrive."""
        with self.lock:
            if conn.stats_logged or conn.learner is None:
                return
            conn.stats_logged = True
        self.events.write(LinkStats(learner=conn.learner, peer=conn.peer,
                                    seconds=round(time.monotonic() - conn.opened_at, 6), bytes_in=conn.bytes_in,
                                    bytes_out=conn.bytes_out, data_frames=conn.data_frames, data_bytes=conn.data_bytes,
                                    data_late_bytes=conn.data_late_bytes, data_rx_s=round(conn.data_rx_s, 6)))

    def _writer(self, conn: Conn) -> None:
        try:
            wsock = conn.sock.dup()
        except OSError:  # the reader closed the connection (the peer left) before this thread started
            return
        try:
            while not conn.closed.is_set():
                try:
                    msg = conn.outq.get(timeout=self.t.heartbeat_s)
                except queue.Empty:
                    msg = Message(MsgType.HEARTBEAT, {})
                if msg is None:
                    break
                if isinstance(msg, tuple) and msg[0] == "close":  # ("close", reason): all before it is sent
                    self.close(conn, str(msg[1]))
                    break
                if isinstance(msg, tuple):  # ("latest", p): the newest value of fragment p, taken now
                    with conn.latest_lock:
                        msg = conn.latest.pop(msg[1], None)
                    if msg is None:
                        continue
                try:
                    conn.bytes_out += send_message(wsock, conn.codec.encode(msg), self.t.socket_op_s, conn.auth)
                except OSError as e:
                    self.close(conn, f"send failed: {type(e).__name__}: {e}")
                    break
        finally:
            wsock.close()

    def close(self, conn: Conn, reason: str) -> None:
        with self.lock:  # once, whichever thread closes it first (its reader, its writer, the main loop)
            if conn.closed.is_set():
                return
            conn.closed.set()
            # forgotten once closed: a long run's hostile or flapping peers must not pile up here, each with the
            self.conns.pop(conn.cid, None)  # frames (model-sized tensors) it never sent
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()
        self.events.write(ConnClosed(learner=conn.learner, peer=conn.peer, reason=reason))
        # here, not only when its reader thread ends: the syncer may exit before a closed connection's
        # reader wakes, and the link's bytes must still reach the run's record
        self.log_link_stats(conn)

    def shutdown(self) -> None:
        """Stop accepting and close every connection (each logs its link stats once). A connection whose close
        is queued (the answer to a learner's BYE, `close_after_sent`) gets up to 2 x socket_op_s first (the frame
        its writer is sending, then the answer): without the answer the learner's link cannot tell a finished
        syncer from a crashed one, and sends its final pushes again until timeouts.final_flush_s."""
        self.stop.set()
        self.listener.close()
        with self.lock:
            conns = list(self.conns.values())
        deadline = time.monotonic() + 2 * self.t.socket_op_s
        for conn in conns:
            if conn.closing:
                conn.closed.wait(max(0.0, deadline - time.monotonic()))
        for conn in conns:
            self.close(conn, "syncer finished")

    # -- sending (main loop) ---------------------------------------------------------------------
    def drop_fragments(self, conn: Conn) -> None:
        """Forget the fragment values still waiting to go to this connection (its learner said BYE: it applies
        nothing more), so what is queued after them (the answer to its BYE) is not held behind them on a slow
        link; their markers in `outq` find nothing and are skipped."""
        with conn.latest_lock:
            conn.latest.clear()

    def send_fragment(self, conn: Conn, p: int, msg: Message) -> None:
        """Queue fragment p's newest merged value: replaces an older one still waiting on this connection."""
        with conn.latest_lock:
            waiting = p in conn.latest
            if waiting:
                assert conn.learner is not None  # queued sends go to authenticated connections only
                self.events.write(SendCoalesced(learner=conn.learner, fragment=p))
            conn.latest[p] = msg
        if not waiting:
            self.send(conn, ("latest", p))  # type: ignore[arg-type]

    def close_after_sent(self, conn: Conn, reason: str) -> None:
        """Close the connection once its writer has sent everything queued before this call."""
        if conn.closed.is_set():
            return
        conn.closing = True
        try:
            conn.outq.put(("close", reason), timeout=self.t.socket_op_s)
        except queue.Full:  # a stalled writer: close now
            self.close(conn, reason)

    def send(self, conn: Conn, msg: Message) -> None:
        if conn.closed.is_set():
            return
        try:
            conn.outq.put_nowait(msg)
        except queue.Full:  # a stalled link: drop its oldest queued frame, keep the newest
            try:
                conn.outq.get_nowait()
            except queue.Empty:
                pass
            assert conn.learner is not None  # queued sends go to authenticated connections (the handshake's are direct)
            self.events.write(SendDropped(learner=conn.learner, reason="outbound queue full"))
            conn.outq.put_nowait(msg)
