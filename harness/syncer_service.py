"""The synchronizer process: sockets and threads around the trainers' syncer logic.

Threads: one acceptor; per connection a reader (handshake, then frames into
one inbox queue) and a writer (its own queue, heartbeats when idle); one
evaluator (eval loss of a snapshot of the global model, off the merge path);
and the main loop, the only thread that touches the algorithm's state. The
main loop takes inbox items, feeds pushes / gradients / parameters to the
algorithm's core, asks it to merge, and broadcasts results. Nothing it does
waits on a socket: a slow or dead link only fills that connection's queue
(bounded; the oldest fragment broadcasts are dropped first, they are
superseded anyway) and is cut after `timeouts.liveness_s` of silence.

A learner is *alive* while it has an authenticated connection that has not
said BYE. Every frame that fails its checks is counted, logged and ends that
connection; nothing from it reaches the merge.

Crash safety (Decoupled DiLoCo, `recovery.syncer_checkpoint = "every_merge"`):
every merged fragment is written to its slot under `syncer_state/`
(`harness/fragment_checkpoint.py`: two checksummed slots per fragment,
rewritten in place, never over the newest version) *before* it is broadcast,
so no learner ever holds a version the syncer could lose. A syncer started with
`restore` loads the newest valid slots, binds the same port and carries on; what a crash
loses is only what was never acknowledged to anyone: rounds still open and
pushes carried for a fragment's next round (the learners' counters were not
reset for them, so those steps are pulled again at their next sync point), and
the online step-time estimates.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import queue
import socket
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.codec import merged_to_message, message_to_push, push_round
from harness.events import EventLog
from harness.fragment_checkpoint import FragmentCheckpoints
from harness.handshake import new_nonce, verify_challenge
from harness.procutil import cpu_seconds
from harness.rundir import atomic_torch_save
from harness.scenario import Scenario
from harness.wire import (
    HEADER,
    ConnectionClosed,
    FrameError,
    Message,
    MsgType,
    recv_message,
    send_message,
)
from trainers.baselines import DdpSyncer, DilocoSyncer, SyncRejected, SyncRound
from trainers.data import eval_batches, make_splits
from trainers.decoupled_syncer import DecoupledSyncer, MergeRecord, PushOutcome
from trainers.elastic_ddp import ElasticDdpSyncer
from trainers.model import build_model

log = logging.getLogger(__name__)

OUTQ_MAX = 256
EVAL_SEQS = 16


DATA_FRAMES = frozenset({MsgType.PUSH, MsgType.GRADS, MsgType.PARAMS})
STATE_DIR = "syncer_state"
"""Under the run directory: one checkpoint file per fragment (Decoupled DiLoCo)."""


def fragment_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A short content checksum of a fragment (names and bytes, in name order): merge and restore events carry
    it, so a test can check that a restored fragment is exactly the last one broadcast. CRC-32, computed on every
    merge: a third of sha256's cost, and an accidental match of two different fragments has odds of 2^-32 (it
    guards against mistakes, not against an adversary)."""
    crc = 0
    for n in sorted(tensors):
        crc = zlib.crc32(n.encode(), crc)
        crc = zlib.crc32(tensors[n].detach().contiguous().numpy().data.cast("B"), crc)
    return f"{crc:08x}"


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


def max_frame_bytes(sc: Scenario) -> int:
    """Largest legal frame: three model-sized float32 tensor sets (a ddp resume: parameters and both AdamW
    moments) plus generous metadata room. Anything larger is refused before its payload is read."""
    m = build_model(sc.model, 0)
    return 3 * sum(p.numel() for p in m.parameters()) * 4 + 1_000_000


class SyncerService:
    """Runs one algorithm's syncer core behind a TCP listener until told to stop."""

    def __init__(self, sc: Scenario, run_dir: str, secret: bytes, events: EventLog, port: int = 0,
                 restore: bool = False) -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.secret = secret
        self.events = events
        self.t = sc.timeouts
        self.max_frame = max_frame_bytes(sc)
        m = sc.topology.learners
        self.algorithm = sc.algorithm
        if sc.algorithm == "decoupled":
            self.core: Any = DecoupledSyncer(sc.model, sc.diloco, sc.seed, m)
        elif sc.algorithm == "diloco":
            self.core = DilocoSyncer(sc.model, sc.diloco, sc.seed, m)
        elif sc.algorithm == "elastic_ddp":
            self.core = ElasticDdpSyncer(sc.model, sc.train, sc.seed, m)
        else:
            self.core = DdpSyncer(sc.model, sc.train, sc.seed, m)
        self.inbox: queue.Queue = queue.Queue()
        self.conns: dict[int, Conn] = {}
        self.by_learner: dict[int, Conn] = {}
        self.finished: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.frames_rejected = 0
        self.budget_total = m * sc.train.steps if sc.train.budget == "total" and sc.algorithm == "decoupled" else None
        """train.budget = total: learner-steps the run trains in all; reaching it sends every learner STOP."""
        self.budget_reached = False
        self.persist = sc.algorithm == "decoupled" and sc.recovery.syncer_checkpoint == "every_merge"
        self.slots = FragmentCheckpoints(os.path.join(run_dir, STATE_DIR), sc.recovery.syncer_checkpoint_fsync) \
            if self.persist else None
        self.frag_tokens = [0.0] * len(getattr(self.core, "partition", []))
        self.listener = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: a restart rebinds at once
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._cids = itertools.count(1)
        self._eval_q: queue.Queue = queue.Queue(maxsize=1)
        splits = make_splits(sc.data, m)
        self._eval_set = eval_batches(splits.holdout, sc.model.seq_len, EVAL_SEQS, sc.eval.batches)
        self._eval_model = build_model(sc.model, sc.seed)
        self.tokens_merged = 0.0
        self.checkpoints = 0
        self.checkpoint_s = 0.0
        if restore:
            self._restore()

    # -- crash safety ----------------------------------------------------------------------------
    def _persist(self, recs: list[MergeRecord]) -> None:
        """Write the merged fragments' state into their checkpoint slots before anyone is told of them."""
        assert self.slots is not None
        t0 = time.monotonic()
        for p in sorted({r.fragment for r in recs}):
            st = self.core.fragment_state(p)
            st["tokens_merged"] = self.frag_tokens[p]
            self.slots.write(p, int(st["version"]), st)
        self.checkpoint_s += time.monotonic() - t0
        self.checkpoints += 1

    def _restore(self) -> None:
        states, rejected = FragmentCheckpoints(os.path.join(self.run_dir, STATE_DIR)).load(self.max_frame)
        for why in rejected:  # a slot torn by the crash: the other slot of that fragment holds the version before
            self.events.log("checkpoint_slot_rejected", detail=why)
        self.core.restore(states)
        for st in states:
            self.frag_tokens[int(st["fragment"])] = float(st["tokens_merged"])
        self.tokens_merged = sum(self.frag_tokens)
        self.events.log("syncer_restore", fragments=[int(st["fragment"]) for st in states],
                        versions=list(self.core.versions), merges=self.core.merges, clock=self.core.clock,
                        tokens_merged=self.tokens_merged,
                        digests={p: fragment_digest(self.core.fragment(p)) for p in range(len(self.core.partition))},
                        merged_into={p: {m: list(v) for (m, q), v in self.core.merged_into.items() if q == p}
                                     for p in range(len(self.core.partition))})

    # -- state helpers ---------------------------------------------------------------------------
    def global_params(self) -> dict[str, torch.Tensor]:
        return self.core.params

    def alive(self) -> frozenset[int]:
        with self.lock:
            return frozenset(m for m in self.by_learner if m not in self.finished)

    def version(self) -> int:
        return self.core.merges

    # -- threads ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(next(self._cids), sock, f"{peer[0]}:{peer[1]}")
            with self.lock:
                self.conns[conn.cid] = conn
            threading.Thread(target=self._reader, args=(conn,), name=f"rd{conn.cid}", daemon=True).start()

    def _handshake(self, conn: Conn) -> int:
        deadline = time.monotonic() + self.t.connect_s
        hello = recv_message(conn.sock, 4096, self.t.connect_s)
        if hello.type is not MsgType.HELLO:
            raise ConnectionError(f"expected HELLO, got {hello.type.name}")
        learner: int = hello.meta["learner"]  # a non-negative int: checked on decode (harness/wire_messages.py)
        nonce = new_nonce()
        send_message(conn.sock, Message(MsgType.CHALLENGE, {"nonce": nonce.hex()}), self.t.socket_op_s)
        auth = recv_message(conn.sock, 4096, max(0.01, deadline - time.monotonic()))
        ok = (auth.type is MsgType.AUTH and auth.meta["learner"] == learner and learner < self.sc.topology.learners
              and verify_challenge(self.secret, nonce, learner, auth.meta["sig"]))
        if not ok:
            send_message(conn.sock, Message(MsgType.REJECT, {"reason": "bad credentials"}), self.t.socket_op_s)
            raise PermissionError(f"learner {learner} failed authentication")
        send_message(conn.sock, Message(MsgType.WELCOME, {"algorithm": self.algorithm}), self.t.socket_op_s)
        return learner

    def _reader(self, conn: Conn) -> None:
        """One connection's reader thread. However it ends, the connection is closed with the reason logged:
        an unforeseen error on one connection's path (a bug) must neither leak its socket nor leave its
        learner counted alive, and it is raised on (the thread's traceback) rather than hidden."""
        try:
            self._read(conn)
        except BaseException as e:
            self._close(conn, f"reader failed: {type(e).__name__}: {e}")
            if conn.learner is not None:
                self._log_link_stats(conn)
                self.inbox.put(("leave", conn, None))
            raise

    def _read(self, conn: Conn) -> None:
        try:
            learner = self._handshake(conn)
        except (OSError, FrameError, ConnectionClosed, ConnectionError, KeyError, ValueError) as e:
            kind = {"kind": e.kind} if isinstance(e, FrameError) else {}
            self.events.log("auth_failed", peer=conn.peer, error=f"{type(e).__name__}: {e}", **kind)
            self._close(conn, "handshake failed")
            return
        conn.learner = learner
        self.inbox.put(("join", conn, None))
        threading.Thread(target=self._writer, args=(conn,), name=f"wr{conn.cid}", daemon=True).start()
        timing: dict[str, float] = {}
        while not conn.closed.is_set():
            try:
                msg = recv_message(conn.sock, self.max_frame, self.t.liveness_s, timing)
            except FrameError as e:
                self.frames_rejected += 1
                self.events.log("frame_rejected", learner=learner, side="syncer", kind=e.kind, error=str(e))
                self._close(conn, f"rejected frame: {e.kind}")
                break
            except (OSError, ConnectionClosed) as e:
                self._close(conn, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
                break
            conn.bytes_in += int(timing["bytes"])
            if msg.type is MsgType.PING:
                self._send(conn, Message(MsgType.PONG, msg.meta))
                continue
            if msg.type in DATA_FRAMES:  # what the link's bandwidth is measured on, as the syncer receives it
                conn.data_frames += 1
                conn.data_bytes += int(timing["bytes"])
                late = int(timing["bytes"]) - HEADER.size - int(timing["ready_bytes"])
                if late > 0:  # bytes that arrived after the header: what the link's rate is measured on
                    conn.data_late_bytes += late
                    conn.data_rx_s += timing["end_t"] - timing["header_t"]
            if msg.type is not MsgType.HEARTBEAT:
                self.inbox.put(("msg", conn, msg))
        self._log_link_stats(conn)
        self.inbox.put(("leave", conn, None))

    def _log_link_stats(self, conn: Conn) -> None:
        """Once per connection: what crossed it, and how long its data frames took to arrive."""
        with self.lock:
            if conn.stats_logged or conn.learner is None:
                return
            conn.stats_logged = True
        self.events.log("link_stats", learner=conn.learner, peer=conn.peer,
                        seconds=round(time.monotonic() - conn.opened_at, 6), bytes_in=conn.bytes_in,
                        bytes_out=conn.bytes_out, data_frames=conn.data_frames, data_bytes=conn.data_bytes,
                        data_late_bytes=conn.data_late_bytes, data_rx_s=round(conn.data_rx_s, 6))

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
                if isinstance(msg, tuple):  # ("latest", p): the newest value of fragment p, taken now
                    with conn.latest_lock:
                        msg = conn.latest.pop(msg[1], None)
                    if msg is None:
                        continue
                try:
                    conn.bytes_out += send_message(wsock, msg, self.t.socket_op_s)
                except OSError as e:
                    self._close(conn, f"send failed: {type(e).__name__}: {e}")
                    break
        finally:
            wsock.close()

    def _close(self, conn: Conn, reason: str) -> None:
        if conn.closed.is_set():
            return
        conn.closed.set()
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.sock.close()
        self.events.log("conn_closed", learner=conn.learner, peer=conn.peer, reason=reason)

    def _check_budget(self) -> None:
        """train.budget = total: once the learners' reported steps (each learner's highest, which a restarted
        learner continues from, so redone steps count once) add up to the budget, tell every learner to stop."""
        if self.budget_total is None or self.budget_reached:
            return
        total = sum(self.core.reported_step.values())
        if total < self.budget_total:
            return
        self.budget_reached = True
        with self.lock:
            conns = dict(self.by_learner)
        self.events.log("budget_reached", total_steps=total, budget=self.budget_total,
                        per_learner={str(m): s for m, s in sorted(self.core.reported_step.items())})
        for conn in conns.values():
            self._send(conn, Message(MsgType.STOP, {"total": total}))

    def _resend_current(self, learner: int, p: int, reason: str) -> None:
        """Send `learner` fragment p's current global value (applied on arrival), if it is connected."""
        with self.lock:
            conn = self.by_learner.get(learner)
        if conn is None:
            return
        version = self.core.versions[p]
        self._send_fragment(conn, p, merged_to_message(p, version, self.core.fragment(p)))
        self.events.log("fragment_resent", learner=learner, fragment=p, version=version, reason=reason)

    def _send_fragment(self, conn: Conn, p: int, msg: Message) -> None:
        """Queue fragment p's newest merged value: replaces an older one still waiting on this connection."""
        with conn.latest_lock:
            waiting = p in conn.latest
            if waiting:
                self.events.log("send_coalesced", learner=conn.learner, fragment=p)
            conn.latest[p] = msg
        if not waiting:
            self._send(conn, ("latest", p))  # type: ignore[arg-type]

    def _send(self, conn: Conn, msg: Message) -> None:
        if conn.closed.is_set():
            return
        try:
            conn.outq.put_nowait(msg)
        except queue.Full:  # a stalled link: drop its oldest queued frame, keep the newest
            try:
                conn.outq.get_nowait()
            except queue.Empty:
                pass
            self.events.log("send_dropped", learner=conn.learner, reason="outbound queue full")
            conn.outq.put_nowait(msg)

    def _evaluator(self) -> None:
        while True:
            item = self._eval_q.get()
            if item is None:
                return
            version, tokens, params = item
            loss = evaluate(self._eval_model, params, self._eval_set)
            self.events.log("eval", version=version, tokens_merged=tokens, loss=loss, kind="periodic")

    def _request_eval(self) -> None:
        snap = {n: t.detach().clone() for n, t in self.global_params().items()}
        try:
            self._eval_q.put_nowait((self.version(), self.tokens_merged, snap))
        except queue.Full:
            pass

    # -- main loop --------------------------------------------------------------------------------
    def serve(self, stop_requested: Any) -> None:
        """Run until every learner said BYE or `stop_requested.is_set()`; then drain and checkpoint."""
        threads = [threading.Thread(target=self._accept, name="accept", daemon=True),
                   threading.Thread(target=self._evaluator, name="eval", daemon=True)]
        for th in threads:
            th.start()
        self.events.log("syncer_start", port=self.port, algorithm=self.algorithm,
                        fragments=len(getattr(self.core, "partition", [])) or None)
        self._request_eval()
        next_eval = time.monotonic() + self.sc.eval.every_s
        wake: float | None = None
        m = self.sc.topology.learners
        while True:
            now = time.monotonic()
            if len(self.finished) >= m or stop_requested.is_set():
                break
            timeout = 0.1 if wake is None else min(0.1, max(0.0, wake - now))
            try:
                kind, conn, msg = self.inbox.get(timeout=timeout)
                self._handle(kind, conn, msg)
                while True:  # take everything already queued before deciding merges
                    kind, conn, msg = self.inbox.get_nowait()
                    self._handle(kind, conn, msg)
            except queue.Empty:
                pass
            if self.algorithm == "decoupled":
                wake = self._merge_decoupled()
            if time.monotonic() >= next_eval:
                self._request_eval()
                next_eval = time.monotonic() + self.sc.eval.every_s
        self._finish()
        while True:  # replace a pending snapshot by the stop marker; never block on a busy evaluator
            try:
                self._eval_q.put_nowait(None)
                break
            except queue.Full:
                try:
                    self._eval_q.get_nowait()
                except queue.Empty:
                    pass
        threads[1].join(timeout=self.t.shutdown_s)

    def _handle(self, kind: str, conn: Conn, msg: Message | None) -> None:
        learner = conn.learner
        assert learner is not None
        if kind == "join":
            with self.lock:
                old = self.by_learner.get(learner)
                self.by_learner[learner] = conn
                self.finished.discard(learner)
            if old is not None and old is not conn:
                self._close(old, "replaced by a new connection")
            # decoupled: the versions of the current fragments it is sent (which it applies, resetting counters)
            sent = {"versions": self.core.on_join(learner)} if self.algorithm == "decoupled" else {}
            for q in self.core.drop_carried(learner) if self.algorithm == "decoupled" else []:
                self.events.log("push_superseded", learner=learner, fragment=q.fragment, first_step=q.first_step,
                                last_step=q.last_step, base_version=q.base_version,
                                reason="dropped on rejoin: carried from before it rejoined, where it is sent the "
                                       "current value (its counters reset)")
            self.events.log("learner_join", learner=learner, peer=conn.peer, alive=sorted(self.alive()), **sent)
            if self.algorithm == "decoupled":  # the pull: current global fragments to a (re)joining learner
                for p, version in enumerate(sent["versions"]):
                    self._send(conn, merged_to_message(p, version, self.core.fragment(p)))
                if self.budget_reached:  # it came back after the budget was spent: it stops after a step
                    self._send(conn, Message(MsgType.STOP, {"total": self.budget_total}))
            else:  # a restarted baseline learner resumes from the syncer's state (a fresh one ignores it)
                if self.algorithm == "elastic_ddp":  # it is admitted at the next step, from this state
                    step, tensors = self.core.on_join(learner, time.monotonic(), f"connected from {conn.peer}")
                else:
                    step, tensors = self.core.resume_state()
                self._send(conn, Message(MsgType.RESUME, {"step": step}, tensors))
            return
        if kind == "leave":
            with self.lock:
                if self.by_learner.get(learner) is conn:
                    del self.by_learner[learner]
            if self.algorithm == "decoupled":
                self.core.forget(learner)
            self.events.log("learner_leave", learner=learner, alive=sorted(self.alive()))
            if self.algorithm == "elastic_ddp" and self.by_learner.get(learner) is None:  # the group shrinks
                res = self.core.on_leave(learner, time.monotonic(), "link closed")
                self._log_reconfigurations()
                if res is not None:
                    self._on_sync_result(learner, res, MsgType.GRADS_AVG, "step", res.key)
            return
        assert msg is not None
        if msg.type is MsgType.BYE:
            self.finished.add(learner)
            if self.algorithm == "elastic_ddp":
                self.core.on_finished(learner)
            self.events.log("learner_bye", learner=learner)
        elif msg.type is MsgType.META and self.algorithm == "decoupled":
            pulls = self.core.on_meta(learner, int(msg.meta["step"]), float(msg.meta["step_time_s"]),
                                      time.monotonic(), self.alive())
            for pull in pulls:
                self._send_pull(pull)
            self._check_budget()
        elif msg.type is MsgType.PUSH and self.algorithm == "decoupled":
            self._on_push(learner, msg)
        elif msg.type is MsgType.GRADS and self.algorithm == "ddp":
            res = self.core.on_grads(learner, int(msg.meta["step"]), int(msg.meta["tokens"]), msg.tensors)
            self._on_sync_result(learner, res, MsgType.GRADS_AVG, "step", int(msg.meta["step"]))
        elif msg.type is MsgType.GRADS and self.algorithm == "elastic_ddp":
            res = self.core.on_grads(learner, int(msg.meta["step"]), int(msg.meta["tokens"]), msg.tensors,
                                     time.monotonic())
            self._log_reconfigurations()
            self._on_sync_result(learner, res, MsgType.GRADS_AVG, "step", int(msg.meta["step"]))
        elif msg.type is MsgType.PARAMS and self.algorithm == "diloco":
            res = self.core.on_params(learner, int(msg.meta["round"]), int(msg.meta["step"]),
                                      int(msg.meta["tokens"]), msg.tensors)
            self._on_sync_result(learner, res, MsgType.PARAMS_MERGED, "round", int(msg.meta["round"]))
        else:
            self.events.log("unexpected_message", learner=learner, type=msg.type.name)

    def _on_push(self, learner: int, msg: Message) -> None:
        try:
            push = message_to_push(msg)
        except (KeyError, TypeError, ValueError) as e:
            self.events.log("push_rejected", learner=learner, reason=f"malformed: {e}")
            return
        if push.learner != learner:
            self.events.log("push_rejected", learner=learner, reason="learner id does not match the connection")
            return
        round_id = push_round(msg)
        outcome, superseded = self.core.on_push(push, round_id, time.monotonic())
        if outcome is PushOutcome.DECLINED:
            return
        into_round = None  # accepted or carried: the round it is in now (None: held for the fragment's next one)
        if outcome in (PushOutcome.ACCEPTED, PushOutcome.CARRIED):
            rnd = self.core.rounds[push.fragment]
            into_round = rnd.round_id if rnd is not None else None
        self.events.log("push", learner=learner, fragment=push.fragment, round=round_id, c_steps=push.c_steps,
                        c_tokens=push.c_tokens, first_step=push.first_step, last_step=push.last_step,
                        base_version=push.base_version, outcome=outcome.value, final=push.final, joined=into_round)
        if outcome in (PushOutcome.STALE, PushOutcome.UNANCHORED, PushOutcome.BEFORE_REJOIN, PushOutcome.LAGGING):
            if outcome is PushOutcome.STALE:
                into = self.core.merged_into[(learner, push.fragment)]
                reason = f"stale: its work is already in version {into[0]}, not yet applied"
            elif outcome is PushOutcome.BEFORE_REJOIN:
                joined = self.core.joined_at[(learner, push.fragment)]
                reason = (f"before rejoin: based on version {push.base_version}, older than version {joined} "
                          "it was sent when it rejoined, not yet applied")
            elif outcome is PushOutcome.LAGGING:
                reason = (f"lagging: based on version {push.base_version}, more than "
                          f"{self.sc.diloco.max_staleness} versions behind version {self.core.versions[push.fragment]}")
            else:
                reason = (f"stale: based on version {push.base_version}, older than the "
                          f"{self.sc.diloco.anchor_history} versions held to anchor it")
            self.events.log("push_superseded", learner=learner, fragment=push.fragment, reason=reason,
                            first_step=push.first_step, last_step=push.last_step, base_version=push.base_version)
            # it stepped on without the merge, or is too far behind: send it the fragment's current value
            if outcome in (PushOutcome.UNANCHORED, PushOutcome.LAGGING) or self.core.missed_broadcast(push):
                self._resend_current(learner, push.fragment, reason=outcome.value)
        elif outcome not in (PushOutcome.ACCEPTED, PushOutcome.CARRIED):
            self.events.log("push_rejected", learner=learner, fragment=push.fragment, reason=outcome.value,
                            first_step=push.first_step, last_step=push.last_step)
        if superseded is not None:
            self.events.log("push_superseded", learner=learner, fragment=push.fragment, round=into_round,
                            reason="newer push in the same round", first_step=superseded.first_step,
                            last_step=superseded.last_step)

    def _send_pull(self, pull: Any) -> None:
        msg = Message(MsgType.PULL, {"fragment": pull.fragment, "round": pull.round_id})
        with self.lock:
            targets = [c for m, c in self.by_learner.items() if m in pull.learners]
        for conn in targets:
            self._send(conn, msg)
        self.events.log("pull", fragment=pull.fragment, round=pull.round_id, learners=sorted(pull.learners),
                        clock=self.core.clock)

    def _merge_decoupled(self) -> float | None:
        merges, wake = self.core.poll(time.monotonic(), self.alive())
        for rec, counted in zip(merges, self._account(merges), strict=True):
            self._broadcast_merge(rec, *counted)
        return wake

    def _broadcast_merge(self, rec: MergeRecord, tokens: float, tokens_merged: float) -> None:
        """Send a merge to its participants and log it with its tokens and the total merged up to it."""
        t0 = time.monotonic()
        with self.lock:  # the participants apply it; a late answer is carried into the next round
            targets = {m: self.by_learner[m] for m in rec.participants if m in self.by_learner}
        for m, pulled in zip(rec.participants, rec.pulled_steps, strict=True):
            if m in targets:
                self._send_fragment(targets[m], rec.fragment,
                                    merged_to_message(rec.fragment, rec.version, rec.tensors, pulled))
        self.core.note_sync_time(time.monotonic() - rec.merged_at)
        w = rec.weights
        self.events.log(
            "merge", fragment=rec.fragment, version=rec.version, merges=self.core.merges, round=rec.round_id,
            participants=rec.participants, carried=rec.carried, weights=[round(x, 6) for x in w],
            c_steps=rec.c_steps,
            c_tokens=rec.c_tokens, step_ranges=rec.step_ranges, base_versions=rec.base_versions,
            reason=rec.reason, grace_s=rec.grace_s, quorum_wait_s=(rec.quorum_at or rec.merged_at) - rec.started_at,
            wait_s=rec.merged_at - rec.started_at, broadcast_s=time.monotonic() - t0,
            tokens=tokens, tokens_merged=tokens_merged,
            outer_grad_norm=rec.outer_grad_norm, digest=fragment_digest(rec.tensors),
            norms=dataclasses.asdict(rec.norms), outer_lr=rec.outer_lr,
        )

    def _account(self, recs: list[MergeRecord]) -> list[tuple[float, float]]:
        """Count the merges' tokens and, if crash safety is on, persist them: all before any broadcast.
        Returns, per merge, (its tokens, the tokens merged up to and including it)."""
        counted = []
        for rec in recs:
            tokens = sum(rec.c_tokens) / len(self.core.partition)
            self.frag_tokens[rec.fragment] += tokens
            self.tokens_merged += tokens
            counted.append((tokens, self.tokens_merged))
        if recs and self.persist:
            self._persist(recs)
        return counted

    def _log_reconfigurations(self) -> None:
        """elastic_ddp: one `elastic_reconfigure` event per change of the global group (times since run start
        are the events' own `t`; started_at / ended_at here are the syncer's monotonic clock)."""
        for rec in self.core.take_reconfigurations():
            self.events.log("elastic_reconfigure", **dataclasses.asdict(rec))

    def _on_sync_result(self, learner: int, res: SyncRound | None | bool | SyncRejected, reply: MsgType, key: str,
                        value: int) -> None:
        if res is False or isinstance(res, SyncRejected):
            reason = res.reason if isinstance(res, SyncRejected) else "non-finite or malformed"
            self.events.log("sync_rejected", learner=learner, **{key: value}, reason=reason)
            return
        if res is None or res is True:
            return
        msg = Message(reply, {key: value}, res.tensors)
        if res.replay_to is not None:  # a learner asked again for a round it missed: answer it alone
            with self.lock:
                conn = self.by_learner.get(res.replay_to)
            if conn is not None:
                self._send(conn, msg)
            if res.step != res.key:  # elastic_ddp: it missed steps; it is sent the group's state instead
                self.events.log("elastic_catch_up_sent", learner=res.replay_to, **{key: value}, state_step=res.step)
            else:
                self.events.log("sync_replayed", learner=res.replay_to, **{key: value})
            return
        with self.lock:
            targets = [self.by_learner[m] for m in res.participants if m in self.by_learner]
        for conn in targets:
            self._send(conn, msg)
        self.tokens_merged += sum(res.tokens)
        self.events.log("merge", fragment=None, version=self.core.merges, merges=self.core.merges,
                        participants=res.participants, tokens=sum(res.tokens), c_tokens=res.tokens,
                        tokens_merged=self.tokens_merged, step=res.step, round=value if key == "round" else None)

    def _finish(self) -> None:
        if self.algorithm == "decoupled":
            drained = self.core.drain(time.monotonic())
            for rec, counted in zip(drained, self._account(drained), strict=True):
                self._broadcast_merge(rec, *counted)
        self.save_checkpoint("global.pt")
        if self.slots is not None:
            self.slots.close()
        self.events.log("syncer_done", merges=self.core.merges, tokens_merged=self.tokens_merged,
                        frames_rejected=self.frames_rejected, cpu_s=cpu_seconds(), checkpoints=self.checkpoints,
                        checkpoint_s=round(self.checkpoint_s, 4))
        self.stop.set()
        self.listener.close()
        with self.lock:
            conns = list(self.conns.values())
        for conn in conns:
            self._close(conn, "syncer finished")
            self._log_link_stats(conn)

    def save_checkpoint(self, name: str) -> str:
        path = os.path.join(self.run_dir, name)
        state = {"params": self.global_params(), "merges": self.core.merges, "algorithm": self.algorithm,
                 "tokens_merged": self.tokens_merged}
        if self.algorithm == "decoupled":
            state["versions"] = list(self.core.versions)
            state["outer"] = self.core.outer.state_dict()
        atomic_torch_save(state, path)
        return path


def evaluate(model: torch.nn.Module, params: dict[str, torch.Tensor], batches: list) -> float:
    """Mean held-out loss of `params` loaded into `model` (a scratch copy)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
        losses = [float(model.loss(x, y)) for x, y in batches]  # type: ignore[operator]
    return sum(losses) / len(losses)


@dataclass(frozen=True)
class SyncerSpec:
    """Everything the syncer process needs; picklable."""

    run_dir: str
    scenario: dict
    secret_hex: str
    parent_pid: int
    port: int = 0
    """0: any free port; a restarted syncer rebinds the port the learners' links (and proxies) point at."""
    restore: bool = False
    """Load the per-fragment checkpoint of a syncer that crashed."""


def syncer_main(spec: SyncerSpec, port_conn: Any, stop_requested: Any) -> None:
    """Process entry: bind, report the port to the supervisor, serve until done."""
    from harness import scenario as scenario_mod
    from harness.events import EVENTS_FILE
    from harness.procutil import become_run_process

    become_run_process(spec.parent_pid)
    sc = scenario_mod.from_dict(spec.scenario)
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), "syncer")
    svc = SyncerService(sc, spec.run_dir, bytes.fromhex(spec.secret_hex), events, spec.port, spec.restore)
    port_conn.send(svc.port)
    port_conn.close()
    try:
        svc.serve(stop_requested)
    except Exception as e:
        events.log("syncer_error", error=f"{type(e).__name__}: {e}")
        raise
    finally:
        events.close()
