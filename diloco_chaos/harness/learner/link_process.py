"""The learner host's link to the syncer, run in a process of its own next to the training process.

Why: the link (`diloco_chaos/harness/learner/syncer_link.py`) does its I/O in threads, and those threads need
Python's GIL to encode pushes, decode merged fragments and answer pulls. Inside
the training process every message made the training thread hand the GIL over
mid-step and wait to get it back, a cross-core wake-up each time. With the
link's threads in the training process the host ran 33-47 inner steps/s in
three interleaved runs; with this process, 42-44 (P = H = 8, one merge per
step; bench/harness_overhead.py's harness run). Here the training process has
no busy thread but its own, and all the link costs it per step is one copy of
the parameters into shared memory, a doorbell, and a counter read.

    training process (host chip)                   link process                    syncer
      LinkProcess  --- shared memory: the latest snapshot, bell -->  SyncerLink  <--- TCP --->
                   <-- shared memory: merged fragments, bell -----   (pulls answered from the snapshot)
                   <-> AF_UNIX socketpair: wire frames (control) ->

* **Shared memory** (`diloco_chaos/harness/learner/shared_state.py`): the training process writes each
  step's snapshot and rings the link's doorbell; the link process then sends the
  step's META (the newest step only, if it fell behind) and answers pulls from
  that snapshot at once, never waiting for the training loop. Merged fragments
  from the syncer go the other way into a per-fragment inbox, which the training
  loop checks with one memory read per step.
* **Frames on the socketpair** carry the rest, in the wire format and its message
  types: training -> link: HELLO (connect now), PUSH (a final push), GRADS /
  PARAMS (a synchronous baseline's exchange), BYE (close, flush bounded);
  link -> training: WELCOME (connected), REJECT (refused: fatal), STOP, RESUME,
  GRADS_AVG / PARAMS_MERGED or ERROR (an exchange's answer), BYE (closed, with
  the link's CPU use). The training process reads them only when it polls or
  waits, so it never blocks on the link. Before it handles a frame, the link
  process sends the META of any newer snapshot, so the syncer sees a step
  before anything the training process sent after it (a final push).
* **Lifetime**: the link process is forked by the host before it joins its Gloo
  group (no Gloo or autograd threads exist yet) and connects to the syncer when
  the host sends HELLO, once its group has formed (so the syncer never counts a
  learner that is still starting). The kernel SIGKILLs it when the host dies
  (PR_SET_PDEATHSIG), and it ends when the socketpair closes. A killed host
  therefore drops its TCP link at once, as before. Process faults
  that stop a host (`freeze`, `slow`) stop its link process with it
  (`diloco_chaos/chaos/processes.py`), so a frozen host is silent, as a frozen machine is.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from diloco_chaos.harness.config.sections import Timeouts
from diloco_chaos.harness.hosts.link_shards import ShardedLink
from diloco_chaos.harness.learner.shared_state import Doorbell, SharedInbox, SharedSnapshot
from diloco_chaos.harness.learner.syncer_link import LinkFatal, SyncerLink
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.learner import FragmentRefused, LinkCpu, LinkProcessStart
from diloco_chaos.harness.run.procutil import cpu_seconds, die_with_parent, reset_compute_pool, stderr_to_file
from diloco_chaos.harness.wire.convert import (
    exchange_id,
    grads_request,
    message_to_merged,
    message_to_push,
    params_request,
    push_to_message,
)
from diloco_chaos.harness.wire.framing import (
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    frame_waiting,
    recv_message,
    send_message,
)
from diloco_chaos.trainers.messages import FragmentPush, MergedFragment, Snapshot

log = logging.getLogger(__name__)

POLL_S = 1.0
"""The link process's waits on the training process wake at least this often (to notice a close)."""

SOCKET_BUFFER_BYTES = 4 << 20
"""Send and receive buffers of the local socketpair (the kernel caps them at net.core.[rw]mem_max)."""

class LinkProcess:
    """`SyncerLink`'s interface for the training process, with the link itself in a child process.

    Nothing here uses a thread: frames from the link process are read when the training loop polls or waits,
    and every wait is bounded by the caller's timeout."""

    def __init__(self, host: str, port: int, learner: int, secret: bytes, timeouts: Timeouts,
                 max_frame_bytes: int, events_path: str, shapes: dict[str, torch.Size],
                 partition: list[list[str]], wire_dtype: str = "fp32", shard_ports: tuple[int, ...] = (),
                 owners: tuple[int, ...] = ()) -> None:
        """`port`: the syncer's (shard 0's); `shard_ports`: shards 1..S-1's, and `owners` the owning shard of each
        fragment, for a sharded synchronizer (diloco_chaos/harness/hosts/link_shards.py)."""
        self.learner = learner
        self.t = timeouts
        self.max_frame_bytes = max_frame_bytes
        self.shared = SharedSnapshot(learner, shapes, len(partition))
        self.shared_inbox = SharedInbox(shapes, partition)
        self.to_link = Doorbell()
        """Rung after each snapshot: the link process sends its META."""
        self.to_training = Doorbell()
        """Rung after each merged fragment put in the inbox: wakes a training process waiting for one."""
        self._sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (self._sock, child):  # room for whole frames, so that a poll finds them complete
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
        self._proc = mp.get_context("fork").Process(
            target=_serve, name=f"learner{learner}.link", daemon=True,
            args=(child, self._sock, os.getpid(),
                  _Shared(self.shared, self.shared_inbox, self.to_link, self.to_training), partition,
                  [(host, p) for p in (port, *shard_ports)], owners,
                  learner, secret, timeouts, max_frame_bytes, events_path, wire_dtype))
        self._child = child
        self._inbox: list[MergedFragment] = []
        self._replies: dict[tuple[str, int], Message] = {}
        self._resume: tuple[int, dict[str, Tensor]] | None = None
        self._bye: dict[str, Any] | None = None
        self._eof = False
        self.connected = False
        self.connects = 0
        self.fatal: str | None = None
        self.stop_requested = False
        """The syncer said the run's total step budget is reached (train.budget = total): finish and push."""
        self.thread_cpu_s: dict[str, float] = {}
        """CPU seconds of the link process's threads, as it reported them on close."""
        self.pid: int | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LinkProcess:
        self._proc.start()
        self._child.close()
        self.pid = self._proc.pid
        return self

    def connect(self) -> None:
        """Let the link process connect to the syncer (the host calls this once its learner's group has formed,
        so the syncer never counts a learner that is still starting up)."""
        self._send(Message(MsgType.HELLO, {"learner": self.learner}))

    def close(self, flush_timeout_s: float, finished: bool = True) -> None:
        """Ask the link to send what it holds (bounded), say BYE and exit; the process is reaped (bounded).
        `finished=False` (the training failed) closes without BYE: the syncer sees the learner lost."""
        deadline = time.monotonic() + flush_timeout_s + self.t.socket_op_s
        try:
            if finished:
                send_message(self._sock, Message(MsgType.BYE, {"flush_timeout_s": flush_timeout_s}),
                             self.t.socket_op_s)
            else:
                self._sock.shutdown(socket.SHUT_WR)  # the link process sees the training process's end
            self._wait(lambda: self._bye is not None, deadline)
        except (OSError, LinkFatal):
            pass
        self._sock.close()
        self._proc.join(timeout=max(0.1, deadline - time.monotonic()))
        self.to_link.close()
        self.to_training.close()
        if self._proc.is_alive():
            log.warning("learner %d: link process %s did not exit; killing it", self.learner, self._proc.pid)
            self._proc.kill()
            self._proc.join(timeout=self.t.socket_op_s)

    # -- Decoupled DiLoCo ------------------------------------------------------------------------
    def publish(self, snapshot: Snapshot, partition: list[list[str]]) -> None:
        """Make `snapshot` the one pulls are answered from, and ring the link (it sends the step's META)."""
        self.shared.write(snapshot)
        self.to_link.ring()

    def push(self, push: FragmentPush) -> None:
        self._check_fatal()
        self._send(push_to_message(push))

    def pulled_step(self, p: int) -> int | None:
        """The step of the snapshot the link process last answered a pull of fragment p from (None: never)."""
        return self.shared.pulled_step(p)

    def poll(self) -> list[MergedFragment]:
        self._drain(0.0)
        out, self._inbox = self._inbox + self.shared_inbox.take(), []
        return out

    # -- waits (bounded) -------------------------------------------------------------------------
    def wait_connected(self, timeout_s: float) -> bool:
        self._wait(lambda: self.connected or self.fatal is not None, time.monotonic() + timeout_s)
        return self.connected

    def wait_inbox(self, timeout_s: float) -> bool:
        return self._wait(lambda: bool(self._inbox) or self.fatal is not None, time.monotonic() + timeout_s) \
            and bool(self._inbox)

    def wait_resume(self, timeout_s: float) -> tuple[int, dict[str, Tensor]] | None:
        self._wait(lambda: self._resume is not None or self.fatal is not None, time.monotonic() + timeout_s)
        return self._resume

    # -- synchronous baselines -------------------------------------------------------------------
    def exchange_grads(self, step: int, tokens: int, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        return self._exchange(grads_request(self.learner, step, tokens, grads))

    def exchange_params(self, round_: int, step: int, tokens: int, params: dict[str, Tensor]) -> dict[str, Tensor]:
        return self._exchange(params_request(self.learner, round_, step, tokens, params))

    def _exchange(self, msg: Message) -> dict[str, Tensor]:
        self._check_fatal()
        key = exchange_id(msg)
        self._send(msg)
        # The link process answers within barrier_s (with ERROR on its own timeout); the margin covers the hop.
        deadline = time.monotonic() + self.t.barrier_s + self.t.socket_op_s
        self._wait(lambda: key in self._replies or self.fatal is not None, deadline)
        self._check_fatal()
        reply = self._replies.pop(key, None)
        if reply is None or reply.type is MsgType.ERROR:
            detail = reply.meta.get("detail") if reply is not None else "no answer from the link process"
            raise TimeoutError(f"learner {self.learner}: {detail}")
        return reply.tensors

    # -- internals -------------------------------------------------------------------------------
    def _check_fatal(self) -> None:
        if self.fatal is not None:
            raise LinkFatal(self.fatal)

    def _send(self, msg: Message) -> None:
        try:
            send_message(self._sock, msg, self.t.socket_op_s)
        except OSError as e:
            self.fatal = self.fatal or f"link process gone: {type(e).__name__}: {e}"
            raise LinkFatal(self.fatal) from e

    def _wait(self, done: Any, deadline: float) -> bool:
        while True:
            self._inbox += self.shared_inbox.take()
            if done():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or self._eof:  # past the deadline, or nothing more can come
                return bool(done())
            self._drain(left, bell=True)

    def _drain(self, timeout_s: float, bell: bool = False) -> None:
        """Handle every frame the link process has sent; wait up to `timeout_s` for the first, or (`bell`) for
        the link's doorbell (a merged fragment in the shared inbox)."""
        wait = timeout_s
        watch: list[Any] = [self._sock, self.to_training] if bell else [self._sock]
        while not self._eof:
            try:
                readable, _, _ = select.select(watch, [], [], wait)
            except (OSError, ValueError):  # closed
                return
            if self.to_training in readable:
                self.to_training.clear()
                wait = 0.0  # take the frames already there, without waiting again
            if self._sock not in readable:
                return
            try:
                if timeout_s == 0.0 and not frame_waiting(self._sock):  # the training loop's poll never waits
                    return
            except OSError:
                pass  # read it and find out
            wait = 0.0
            try:  # the link process writes whole frames: once one has begun, the rest follows at once
                msg = recv_message(self._sock, self.max_frame_bytes, self.t.socket_op_s)
            except (ConnectionClosed, FrameError, OSError) as e:
                self._eof = True
                if self._bye is None:
                    self.fatal = self.fatal or f"link process gone: {type(e).__name__}: {e}"
                    self._bye = {}
                return
            self._handle(msg)

    def _handle(self, msg: Message) -> None:
        if msg.type is MsgType.WELCOME:
            self.connected = True
            self.connects = int(msg.meta.get("connects", self.connects + 1))
        elif msg.type is MsgType.STOP:
            self.stop_requested = True
        elif msg.type is MsgType.REJECT:
            self.fatal = str(msg.meta.get("reason", "refused"))
        elif msg.type is MsgType.RESUME:
            self._resume = (int(msg.meta["step"]), msg.tensors)
        elif msg.type in (MsgType.GRADS_AVG, MsgType.PARAMS_MERGED, MsgType.ERROR):
            self._replies[exchange_id(msg)] = msg
        elif msg.type is MsgType.BYE:
            self._bye = msg.meta
            self.thread_cpu_s = dict(msg.meta.get("threads", {}))


# ------------------------------------------------------------------------------------ the link process


class _ToTraining:
    """The link process's frames to the training process, sent in order by one thread so that the syncer-
    facing reader never blocks on a training process that is busy in a step."""

    def __init__(self, sock: socket.socket, send_timeout_s: float) -> None:
        self.sock = sock
        self.send_timeout_s = send_timeout_s
        self._q: collections.deque[Message] = collections.deque()
        self._cv = threading.Condition()
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="link-to-training", daemon=True)
        self.thread.start()

    def put(self, msg: Message) -> None:
        with self._cv:
            self._q.append(msg)
            self._cv.notify()

    def close(self, timeout_s: float) -> None:
        """Send what is queued (bounded), then stop."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self.thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._closed:
                    self._cv.wait(POLL_S)
                if not self._q:
                    return
                msg = self._q.popleft()
            try:  # the training process reads between steps, or after a long collective: bounded by the run's end
                send_message(self.sock, msg, self.send_timeout_s)
            except OSError:  # it is gone: nothing left to deliver to
                return


@dataclass(frozen=True)
class _Shared:
    """What the training process shares with its link process in memory
    (diloco_chaos/harness/learner/shared_state.py)."""

    snapshot: SharedSnapshot
    inbox: SharedInbox
    to_link: Doorbell
    to_training: Doorbell


def _serve(sock: socket.socket, training_end: socket.socket, parent_pid: int, shared: _Shared,
           partition: list[list[str]], addrs: list[tuple[str, int]], owners: tuple[int, ...],
           learner: int, secret: bytes, t: Timeouts, max_frame_bytes: int, events_path: str,
           wire_dtype: str) -> None:
    """The link process: wait for the host's HELLO, connect, then relay until BYE or the host's end."""
    die_with_parent(parent_pid)
    stderr_to_file(os.path.dirname(events_path), f"learner{learner}.link")
    reset_compute_pool()  # before any thread of ours runs a tensor op
    training_end.close()  # or the training process's end would never see EOF when we exit, nor we when it does
    events = EventLog(events_path, f"learner{learner}.link")
    events.write(LinkProcessStart(learner=learner))
    out = _ToTraining(sock.dup(), t.run_s)

    one_writer = threading.Lock()  # the shared inbox has one writer: with shards, several links' readers take turns

    def forward(msg: Message) -> None:
        """What the syncer sent for the training process: merged fragments into the shared inbox, the rest
        as frames."""
        if msg.type is not MsgType.FRAGMENT:
            out.put(msg)
            return
        try:
            with one_writer:
                shared.inbox.put(message_to_merged(msg))
        except (ValueError, KeyError) as e:  # not this model's fragment: never applied
            events.write(FragmentRefused(learner=learner, fragment=msg.meta.get("fragment"), error=str(e)))
            return
        shared.to_training.ring()

    try:
        first = _next_frame(sock, None, max_frame_bytes, t)
        if first is not None and first.type is MsgType.HELLO:
            links = [SyncerLink(host, port, learner, secret, t, max_frame_bytes, events, forward=forward,
                                wire_dtype=wire_dtype) for host, port in addrs]
            link: SyncerLink | ShardedLink = (links[0] if len(links) == 1
                                              else ShardedLink(links, owners)).start()
            flush_s = _relay(sock, link, shared, partition, out, max_frame_bytes, t)
            link.close(flush_timeout_s=flush_s or 0.0, bye=flush_s is not None)
            threads = dict(link.thread_cpu_s)
            threads["relay"] = round(time.thread_time(), 4)
            events.write(LinkCpu(learner=learner, threads=threads, cpu_s=cpu_seconds(), wire_bytes_up=link.bytes_up,
                                 wire_bytes_down=link.bytes_down))
            out.put(Message(MsgType.BYE, {"threads": threads, "cpu_s": cpu_seconds()}))
        else:  # closed (or told to close) before it ever connected
            out.put(Message(MsgType.BYE, {"threads": {}, "cpu_s": cpu_seconds()}))
    finally:
        out.close(timeout_s=t.socket_op_s)
        events.close()


def _next_frame(sock: socket.socket, bell: Doorbell | None, max_frame_bytes: int, t: Timeouts,
                on_bell: Any = None) -> Message | None:
    """The training process's next frame; None once it has closed its end (or died). Wakes every POLL_S, and
    calls `on_bell` whenever the training process rang `bell`."""
    watch: list[Any] = [sock] if bell is None else [sock, bell]
    while True:
        readable, _, _ = select.select(watch, [], [], POLL_S)
        if bell is not None and bell in readable:
            bell.clear()
            on_bell()
        if sock not in readable:
            continue
        try:
            return recv_message(sock, max_frame_bytes, t.liveness_s)
        except (ConnectionClosed, FrameError, OSError):
            return None


def _relay(sock: socket.socket, link: SyncerLink | ShardedLink, shared: _Shared, partition: list[list[str]],
           out: _ToTraining, max_frame_bytes: int, t: Timeouts) -> float | None:
    """Send the META of each new snapshot, and hand the training process's frames to the link, until BYE
    (returns its flush bound) or the training process's end without one (None: it died or failed)."""
    published = -1

    def publish() -> None:
        """The newest snapshot's META, if it is newer than the last sent: the link queues it (never blocks)."""
        nonlocal published
        step = shared.snapshot.step
        if step != published:
            published = step
            link.publish(shared.snapshot, partition)  # type: ignore[arg-type]  # duck-typed Snapshot

    def exchange(msg: Message) -> None:
        meta = dict([exchange_id(msg)])  # what the syncer's own answer carries: {"step"} or {"round"}
        answer = MsgType.GRADS_AVG if msg.type is MsgType.GRADS else MsgType.PARAMS_MERGED
        try:
            out.put(Message(answer, meta, link.exchange(msg)))
        except (TimeoutError, LinkFatal) as e:
            out.put(Message(MsgType.ERROR, {**meta, "detail": str(e)}))

    while (msg := _next_frame(sock, shared.to_link, max_frame_bytes, t, publish)) is not None:
        try:
            publish()  # a step published before this frame was sent reaches the syncer before it
            if msg.type is MsgType.PUSH:
                link.push(message_to_push(msg))
            elif msg.type in (MsgType.GRADS, MsgType.PARAMS):
                # in a thread: the relay keeps reading (a BYE, or the training process's end) meanwhile
                threading.Thread(target=exchange, args=(msg,), name="link-exchange", daemon=True).start()
            elif msg.type is MsgType.BYE:
                return float(msg.meta.get("flush_timeout_s", 0.0))
        except LinkFatal:  # refused: the REJECT already went to the training process, which stops
            pass
    return None
