"""A learner host's TCP link to the synchronizer: the only path between learners.

The training loop never blocks on it (Decoupled DiLoCo): `push` only queues,
and a newer push of a fragment replaces an unsent older one; `poll` only
drains what the reader thread already received. Two background threads do
the I/O: the manager connects (with exponential backoff), authenticates
(HMAC over the syncer's nonce with the run's secret) and reads frames; the
writer sends queued frames and, every `heartbeat_s` whatever else is queued,
a PING stamped with its send time; the syncer echoes it as a PONG, which
gives the link's round-trip time as this learner sees it (an `rtt` event)
and doubles as the heartbeat. Any socket error, timeout or rejected frame closes the
connection and the manager reconnects; on every (re)connect the syncer sends
the current global fragments, which is how a rejoining learner pulls state.

The synchronous baselines use `exchange_grads` / `exchange_params`, which do
block, for at most `barrier_s`, and re-send their request after a reconnect.
"""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from torch import Tensor

from diloco_chaos.harness.config.sections import Timeouts
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.learner import (
    FinalPushesGivenUp,
    FrameRejected,
    LinkConnectFailed,
    LinkDown,
    LinkFlushTimeout,
    LinkUp,
    PushSent,
    PushSupersededLocally,
    Rtt,
    StopReceived,
)
from diloco_chaos.harness.record.learner import LinkFatal as LinkFatalEvent
from diloco_chaos.harness.wire.convert import (
    exchange_id,
    grads_request,
    message_to_merged,
    params_request,
    push_to_message,
)
from diloco_chaos.harness.wire.frame_auth import FrameAuth
from diloco_chaos.harness.wire.framing import (
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    recv_message,
    send_message,
)
from diloco_chaos.harness.wire.handshake import sign_challenge
from diloco_chaos.harness.wire.precision import DOWN, WireCodec, WireDecodeError
from diloco_chaos.trainers.messages import FragmentPush, MergedFragment, Snapshot

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


class LinkFatal(RuntimeError):
    """The syncer refused this learner (bad secret): retrying cannot help."""


class SyncerLink:
    """Non-blocking (push/poll) and blocking (exchange_*) access to the syncer over one TCP link."""

    def __init__(self, host: str, port: int, learner: int, secret: bytes, timeouts: Timeouts,
                 max_frame_bytes: int, events: EventLog, forward: Callable[[Message], None] | None = None,
                 wire_dtype: str = "fp32") -> None:
        self.addr = (host, port)
        self.learner = learner
        self.secret = secret
        self.t = timeouts
        self.max_frame_bytes = max_frame_bytes
        self.events = events
        self.forward = forward
        """If set, what the training side must see is handed to it instead of kept here
        (diloco_chaos/harness/learner/link_process.py):
        FRAGMENT, STOP and RESUME as received, WELCOME on every connect, REJECT when refused."""
        self._cv = threading.Condition()
        self._outbox: collections.OrderedDict[Any, Message] = collections.OrderedDict()
        self._inbox: list[MergedFragment] = []
        self._replies: dict[tuple[str, int], dict[str, Tensor]] = {}
        self._request: tuple[Any, Message] | None = None
        self._snapshot: tuple[Snapshot, list[list[str]]] | None = None
        self._pulled: dict[int, int] = {}
        """Fragment -> the step of the snapshot its last pull was answered from with work."""
        self._wsock: socket.socket | None = None
        self._rsock: socket.socket | None = None
        self.wire_dtype = wire_dtype
        self._codec = WireCodec(wire_dtype)
        """The connection's wire codec (diloco_chaos/harness/wire/precision.py): new, empty, on every connect."""
        self.bytes_up = 0
        self.bytes_down = 0
        """Frame bytes this link sent and received, over all its connections."""
        self._auth: FrameAuth | None = None
        """The connection's frame keys (diloco_chaos/harness/wire/frame_auth.py): every frame after the handshake is
        signed."""
        self._closed = False
        self._bye_queued = False
        """close() queued the BYE: pulls that come in now go unanswered."""
        self._finishing = False
        """The BYE is on the wire: nothing more is sent on this connection; read until the syncer closes it."""
        self._bye_acked = False
        """The syncer answered our BYE with its own: it has taken in everything we sent before it."""
        self._final_pushes: dict[Any, Message] = {}
        """The final pushes queued (per fragment, the newest), whether or not already sent."""
        self._finals: list[tuple[Any, Message]] = []
        """What close() queued last (final pushes, then the BYE): sent again on a new connection if one ends
        before the syncer acknowledged the BYE (it may have died holding them; a restored syncer merges them
        or, if its checkpoint already holds their work, declines them as stale)."""
        self.fatal: str | None = None
        self.stop_requested = False
        """The syncer said the run's total step budget is reached (train.budget = total): finish and push."""
        self.connects = 0
        self.frames_rejected = 0
        self._ping_seq = 0
        self._resume: tuple[int, dict[str, Tensor]] | None = None
        self.thread_cpu_s: dict[str, float] = {}
        """CPU seconds each link thread used, filled in as it exits (what the link costs the host)."""
        self._threads = [threading.Thread(target=self._timed, args=(self._manage,), name=f"link{learner}-mgr",
                                          daemon=True),
                         threading.Thread(target=self._timed, args=(self._write,), name=f"link{learner}-wr",
                                          daemon=True)]

    # -- public -----------------------------------------------------------------------------------
    def start(self) -> SyncerLink:
        for th in self._threads:
            th.start()
        return self

    def wait_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._wsock is None and self.fatal is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return self._wsock is not None

    def wait_resume(self, timeout_s: float) -> tuple[int, dict[str, Tensor]] | None:
        """Synchronous baselines: the (step, state) the syncer sends on (re)connect; None on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._resume is None:
                left = deadline - time.monotonic()
                if left <= 0 or self.fatal is not None:
                    return None
                self._cv.wait(left)
            return self._resume

    def wait_inbox(self, timeout_s: float) -> bool:
        """Wait (bounded) until a merged fragment is waiting to be polled; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not self._inbox:
                left = deadline - time.monotonic()
                if left <= 0 or self.fatal is not None:
                    return False
                self._cv.wait(left)
        return True

    def publish(self, snapshot: Snapshot, partition: list[list[str]]) -> None:
        """Keep the newest host-RAM snapshot for pulls and queue the step's metadata. Never blocks.

        A trainers `Snapshot` may hold the live parameters, so it is copied; anything else that has its
        interface (the link process's `SharedSnapshot`) is kept as it is and read when a pull comes."""
        if isinstance(snapshot, Snapshot):
            snapshot = snapshot.copy()
        with self._cv:
            self._snapshot = (snapshot, partition)
            self._outbox[("meta", 0)] = Message(MsgType.META, {"learner": self.learner, "step": snapshot.step,
                                                                "step_time_s": snapshot.step_time_s})
            self._cv.notify_all()

    def push(self, push: FragmentPush) -> None:
        """Queue a fragment push; replaces an unsent push of the same fragment. Never blocks."""
        self._check_fatal()
        with self._cv:
            key = ("push", push.fragment)
            if key in self._outbox:
                self.events.write(PushSupersededLocally(learner=self.learner, fragment=push.fragment))
                del self._outbox[key]
            self._outbox[key] = push_to_message(push)
            if push.final:
                self._final_pushes[key] = self._outbox[key]
            self._cv.notify_all()

    def pulled_step(self, p: int) -> int | None:
        """The step of the snapshot this link last answered a pull of fragment p from with work (None: never)."""
        return self._pulled.get(p)

    def poll(self) -> list[MergedFragment]:
        with self._cv:
            out, self._inbox = self._inbox, []
        return out

    def exchange_grads(self, step: int, tokens: int, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.exchange(grads_request(self.learner, step, tokens, grads))

    def exchange_params(self, round_: int, step: int, tokens: int, params: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.exchange(params_request(self.learner, round_, step, tokens, params))

    def close(self, flush_timeout_s: float, bye: bool = True) -> None:
        """Send what is queued (bounded), say BYE, and stop the threads. `bye=False` (the training process
        died or failed) drops the connection at once instead: the syncer must see a loss, not a finished
        learner, or it would stop waiting for the learner's restart.

        With BYE, it returns once the syncer answered the BYE with its own and closed the connection, which it
        does once it has taken in everything before it. Until then it reads: closing first, with unread bytes
        in the receive buffer (fragments the syncer sent meanwhile), makes the kernel reset the connection and
        drop what is still in our send buffer; and a half-close does not help through a proxy, which closes its
        upstream connection whole on our FIN, with the same loss there. A connection that ends without that
        answer (the syncer, or the proxy's upstream, died: a proxy can outlive the syncer and swallow what we
        sent) is replaced and the final pushes and BYE sent again, until `flush_timeout_s`; past it, the pushes
        given up are logged (`final_pushes_given_up`)."""
        deadline = time.monotonic() + flush_timeout_s
        with self._cv:
            if not bye:
                self._outbox.clear()
            else:
                self._bye_queued = True
                self._outbox[("bye", 0)] = Message(MsgType.BYE, {"learner": self.learner})
                queued = {k: m for k, m in self._outbox.items() if k[0] == "push"}
                self._finals = [*({**self._final_pushes, **queued}).items(), (("bye", 0), self._outbox[("bye", 0)])]
            self._cv.notify_all()
            # bye: until the syncer acknowledged the BYE and closed the connection (a connection that ends before
            # the acknowledgement is replaced, and the final pushes and BYE sent again: `_manage`)
            while (self._outbox or (bye and not (self._bye_acked and self._rsock is None))) and self.fatal is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.events.write(LinkFlushTimeout(learner=self.learner, unsent=len(self._outbox)))
                    if bye and not self._bye_acked:
                        self._log_given_up(flush_timeout_s)
                    break
                self._cv.wait(left)
            self._closed = True
            self._cv.notify_all()
        self._drop_connection("closed")
        for th in self._threads:
            th.join(timeout=max(0.1, deadline - time.monotonic()) + self.t.socket_op_s)

    def _log_given_up(self, waited_s: float) -> None:
        """With self._cv held, closing past the flush bound: say which pushes are given up (the syncer, or this
        link's shard of it, stayed unreachable), so the work they hold is accounted as discarded by a cause."""
        queued = self._outbox.values() if self._outbox else [m for _, m in self._finals]  # else: sent, unacked
        pushes = [m.meta for m in queued if m.type is MsgType.PUSH]
        if pushes:
            self.events.write(FinalPushesGivenUp(
                learner=self.learner, fragments=[int(m["fragment"]) for m in pushes],
                step_ranges=[[int(m["first_step"]), int(m["last_step"])] for m in pushes],
                c_steps=[int(m["c_steps"]) for m in pushes], final=[bool(m.get("final")) for m in pushes],
                waited_s=round(waited_s, 3)))

    # -- internals --------------------------------------------------------------------------------
    def _timed(self, body: Any) -> None:
        try:
            body()
        finally:
            self.thread_cpu_s[threading.current_thread().name] = round(time.thread_time(), 4)

    def _check_fatal(self) -> None:
        if self.fatal is not None:
            raise LinkFatal(self.fatal)

    def exchange(self, msg: Message) -> dict[str, Tensor]:
        """Send a GRADS or PARAMS request (wire/convert.py grads_request / params_request) and block, at most
        barrier_s, for its answer's tensors; the request is sent again after a reconnect."""
        self._check_fatal()
        key = exchange_id(msg)
        deadline = time.monotonic() + self.t.barrier_s
        with self._cv:
            self._request = (key, msg)
            self._outbox[key] = msg
            self._cv.notify_all()
            while key not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or self.fatal is not None:
                    self._request = None
                    self._check_fatal()
                    raise TimeoutError(f"learner {self.learner}: no syncer reply to {key} within "
                                       f"timeouts.barrier_s = {self.t.barrier_s}s")
                self._cv.wait(min(left, 1.0))
            self._request = None
            return self._replies.pop(key)

    def _drop_connection(self, reason: str) -> None:
        with self._cv:
            socks = [s for s in (self._wsock, self._rsock) if s is not None]
            had = self._wsock is not None
            self._wsock = self._rsock = None
            self._auth = None
            self._cv.notify_all()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass
        if had:
            self.events.write(LinkDown(learner=self.learner, reason=reason))

    def _connect_once(self) -> tuple[socket.socket, FrameAuth]:
        sock = socket.create_connection(self.addr, timeout=self.t.connect_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        deadline = time.monotonic() + self.t.connect_s
        send_message(sock, Message(MsgType.HELLO, {"learner": self.learner, "proto": 1}), self.t.connect_s)
        ch = recv_message(sock, 4096, max(0.01, deadline - time.monotonic()))
        if ch.type is not MsgType.CHALLENGE:
            raise ConnectionError(f"expected CHALLENGE, got {ch.type.name}")
        nonce = bytes.fromhex(ch.meta["nonce"])
        sig = sign_challenge(self.secret, nonce, self.learner)
        send_message(sock, Message(MsgType.AUTH, {"learner": self.learner, "sig": sig}),
                     max(0.01, deadline - time.monotonic()))
        reply = recv_message(sock, 4096, max(0.01, deadline - time.monotonic()))
        if reply.type is MsgType.REJECT:
            raise LinkFatal(f"syncer rejected learner {self.learner}: {reply.meta.get('reason')}")
        if reply.type is not MsgType.WELCOME:
            raise ConnectionError(f"expected WELCOME, got {reply.type.name}")
        return sock, FrameAuth.for_learner(self.secret, nonce, self.learner)

    def _manage(self) -> None:
        backoff = BACKOFF_MIN_S
        while not self._closed and not (self._finishing and self._bye_acked):
            try:
                sock, auth = self._connect_once()
            except LinkFatal as e:
                with self._cv:
                    self.fatal = str(e)
                    self._cv.notify_all()
                self.events.write(LinkFatalEvent(learner=self.learner, error=str(e)))
                if self.forward is not None:
                    self.forward(Message(MsgType.REJECT, {"reason": str(e)}))
                return
            except (OSError, FrameError, ConnectionClosed, ConnectionError, KeyError, ValueError) as e:
                self.events.write(LinkConnectFailed(learner=self.learner, error=f"{type(e).__name__}: {e}",
                                                    backoff_s=backoff))
                with self._cv:
                    self._cv.wait_for(lambda: self._closed, timeout=backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            backoff = BACKOFF_MIN_S
            self.connects += 1
            with self._cv:
                self._rsock, self._wsock, self._auth = sock, sock.dup(), auth
                self._codec = WireCodec(self.wire_dtype)
                if self._request is not None and self._request[0] not in self._outbox:
                    self._outbox[self._request[0]] = self._request[1]
                self._cv.notify_all()
            self.events.write(LinkUp(learner=self.learner, connects=self.connects))
            if self.forward is not None:
                self.forward(Message(MsgType.WELCOME, {"connects": self.connects}))
            self._read(sock, auth)
            with self._cv:
                if self._bye_queued and not self._bye_acked and not self._closed:
                    # the connection ended after close() and before the syncer acknowledged our BYE, sent or still
                    # queued: it may have died holding final pushes, or taken one our writer had just written into
                    # it (found by explore: a limit_data cut truncated one final push and swallowed the next, and
                    # the BYE, still queued, went out alone on the next connection); send them all, then the BYE,
                    # again on the next connection (the syncer declines a copy of work it has)
                    self._finishing = False
                    for key, msg in self._finals:
                        self._outbox.setdefault(key, msg)
                    if ("bye", 0) in self._outbox:
                        self._outbox.move_to_end(("bye", 0))
                    self._cv.notify_all()

    def _read(self, sock: socket.socket, auth: FrameAuth) -> None:
        codec = self._codec
        timing: dict[str, float] = {}
        while not self._closed:
            try:
                msg = recv_message(sock, self.max_frame_bytes, self.t.liveness_s, timing, auth=auth)
                self.bytes_down += int(timing.get("bytes", 0))
                if msg.type in DOWN:
                    msg = codec.decode(msg)
            except (FrameError, WireDecodeError) as e:
                self.frames_rejected += 1
                kind = e.kind if isinstance(e, FrameError) else "bad_wire_encoding"
                self.events.write(FrameRejected(learner=self.learner, side="learner", kind=kind, error=str(e)))
                self._drop_connection(f"rejected frame: {kind}")
                return
            except (OSError, ConnectionClosed) as e:  # TimeoutError is an OSError
                self._drop_connection(f"{type(e).__name__}: {e}")
                return
            if msg.type is MsgType.PULL:
                self._answer_pull(msg.meta["fragment"], msg.meta["round"])  # ints >= 0 (wire_messages.py)
            elif msg.type is MsgType.BYE:  # the syncer took in our BYE and everything before it; it closes now
                with self._cv:
                    self._bye_acked = True
                    self._cv.notify_all()
            elif msg.type is MsgType.PONG:
                if int(msg.meta.get("learner", -1)) == self.learner:
                    rtt = time.monotonic() - float(msg.meta["t"])
                    self.events.write(Rtt(learner=self.learner, seq=int(msg.meta["seq"]), ms=round(rtt * 1e3, 3)))
            elif msg.type is MsgType.STOP:
                if not self.stop_requested:
                    self.events.write(StopReceived(learner=self.learner, total=msg.meta.get("total")))
                self.stop_requested = True
                if self.forward is not None:
                    self.forward(msg)
            elif msg.type in (MsgType.RESUME, MsgType.FRAGMENT) and self.forward is not None:
                self.forward(msg)
            elif msg.type is MsgType.RESUME:
                with self._cv:
                    self._resume = (int(msg.meta["step"]), msg.tensors)
                    self._cv.notify_all()
            elif msg.type is MsgType.FRAGMENT:
                merged = message_to_merged(msg)
                with self._cv:
                    self._inbox.append(merged)
                    self._cv.notify_all()
            elif msg.type in (MsgType.GRADS_AVG, MsgType.PARAMS_MERGED):
                with self._cv:
                    self._replies[exchange_id(msg)] = msg.tensors
                    self._cv.notify_all()

    def _answer_pull(self, p: int, round_id: int) -> None:
        """Answer a pull from the latest snapshot, without touching the training loop."""
        with self._cv:
            if self._bye_queued:  # closing: its final pushes, queued before the BYE, hold these steps
                return
            # no step yet, or no such fragment: decline, so the syncer does not wait for us
            if self._snapshot is None or p >= len(self._snapshot[1]):
                push = FragmentPush(self.learner, p, 0, 0, 0, 1, 0, 0.0, {})
            else:
                snap, partition = self._snapshot
                push = snap.push_for(p, partition[p])
                if push.c_steps > 0:
                    self._pulled[p] = push.last_step
            self._outbox[("push", p)] = push_to_message(push, round_id)
            self._cv.notify_all()

    def _write(self) -> None:
        last_ping = time.monotonic()
        while True:
            with self._cv:
                while not self._closed:
                    if self._finishing:  # BYE sent: nothing more on this connection (another may follow)
                        self._cv.wait()
                        continue
                    if self._wsock is not None and self._outbox:
                        break
                    left = last_ping + self.t.heartbeat_s - time.monotonic()
                    if self._wsock is not None and left <= 0:
                        break
                    self._cv.wait(max(0.001, left) if self._wsock is not None else None)
                if self._closed and not self._outbox:
                    return
                sock, auth, codec = self._wsock, self._auth, self._codec
                if sock is None or auth is None:
                    if self._closed:
                        return
                    continue
                if self._closed or time.monotonic() - last_ping < self.t.heartbeat_s:
                    key, msg = self._outbox.popitem(last=False)
                    if msg.type is MsgType.BYE:  # nothing after it, not even a PING: the syncer closes on it, and
                        self._finishing = True   # drops the rest; set before the send, so that a connection
                        self._outbox.clear()     # ending at once is seen as ending after the BYE (`_manage`)
                else:  # a ping goes first: stamped now, so its round trip excludes our own queue
                    self._ping_seq += 1
                    last_ping = time.monotonic()
                    key, msg = None, Message(MsgType.PING, {"learner": self.learner, "seq": self._ping_seq,
                                                            "t": last_ping})
            t0 = time.monotonic()
            try:
                n = send_message(sock, codec.encode(msg), self.t.socket_op_s, auth)
                self.bytes_up += n
            except OSError as e:
                if key is not None:
                    with self._cv:  # keep it for the next connection unless something newer replaced it
                        self._outbox.setdefault(key, msg)
                        self._outbox.move_to_end(key, last=False)
                        if self._bye_queued:  # closing: what went before it on this connection may be lost too
                            for k, m in self._finals:
                                self._outbox.setdefault(k, m)
                            if ("bye", 0) in self._outbox:
                                self._outbox.move_to_end(("bye", 0))
                self._drop_connection(f"send failed: {type(e).__name__}: {e}")
                continue
            last_sent = time.monotonic()
            if msg.type is MsgType.PUSH:
                self.events.write(PushSent(learner=self.learner, fragment=msg.meta["fragment"], bytes=n,
                                           seconds=last_sent - t0, first_step=msg.meta["first_step"],
                                           last_step=msg.meta["last_step"], c_steps=msg.meta["c_steps"],
                                           round=msg.meta.get("round")))
            with self._cv:
                self._cv.notify_all()
