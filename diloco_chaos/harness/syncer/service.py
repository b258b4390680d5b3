"""The synchronizer process: the main loop that ties the syncer's parts together, and its process entry.

Threads: the transport's acceptor and per-connection readers and writers (diloco_chaos/harness/syncer/transport.py), the
evaluator (diloco_chaos/harness/syncer/evaluator.py), and the main loop here, the only thread that touches the
algorithm's state. The main loop takes the readers' inbox items, keeps who is connected, hands joins,
leaves and frames to the algorithm's handler (diloco_chaos/harness/syncer/dispatch.py: Decoupled DiLoCo's pushes and
merges in diloco_chaos/harness/syncer/decoupled.py, the synchronous baselines' barrier in
diloco_chaos/harness/syncer/barrier.py) and
asks it for time-driven merges; accounting and crash-safe persistence are diloco_chaos/harness/syncer/accounting.py's.

A learner is *alive* while it has an authenticated connection that has not said BYE. A syncer started with
`restore` loads the newest valid per-fragment slots, binds the same port and carries on.
"""

from __future__ import annotations

import os
import queue
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.syncer import (
    LearnerBye,
    LearnerJoin,
    LearnerLeave,
    SyncerDone,
    SyncerError,
    SyncerStart,
    UnexpectedMessage,
)
from diloco_chaos.harness.run.procutil import cpu_seconds
from diloco_chaos.harness.syncer.dispatch import AlgorithmHandler
from diloco_chaos.harness.syncer.eval_schedule import EvalSchedule
from diloco_chaos.harness.syncer.evaluator import Evaluator
from diloco_chaos.harness.syncer.shards import assembled_params, checkpoint_name, fragment_owners, proc_name
from diloco_chaos.harness.syncer.transport import Conn, InboxItem, Transport
from diloco_chaos.harness.wire.framing import Message, MsgType

__all__ = ["SyncerService", "SyncerSpec", "syncer_main"]


class SyncerService:
    """Runs one algorithm's syncer handler behind a TCP listener until told to stop."""

    def __init__(self, sc: Scenario, run_dir: str, secret: bytes, events: EventLog, port: int = 0,
                 restore: bool = False, shard: int = 0, host: str = "127.0.0.1") -> None:
        self.sc = sc
        self.run_dir = run_dir
        self.events = events
        self.algorithm = sc.algorithm
        self.shard = shard
        """Which shard of the synchronizer this is (syncer.shards > 1; diloco_chaos/harness/syncer/shards.py), else
        0."""
        self.transport = Transport(sc, secret, events, port, host)
        self._owners = fragment_owners(sc) if sc.syncer.shards > 1 else []
        self.handler: AlgorithmHandler = algorithms.get(sc.algorithm).syncer_handler(sc, run_dir, events,
                                                                                     self.transport, shard)
        self.evaluator = Evaluator(sc, events)
        if restore:
            self.handler.restore()

    # -- state helpers (also what tests look at) ---------------------------------------------------
    @property
    def port(self) -> int:
        return self.transport.port

    @property
    def conns(self) -> dict[int, Conn]:
        return self.transport.conns

    @property
    def frames_rejected(self) -> int:
        return self.transport.frames_rejected

    @property
    def tokens_merged(self) -> float:
        return self.handler.accounting.tokens_merged

    def global_params(self) -> dict[str, torch.Tensor]:
        return dict(self.handler.core.params)

    def alive(self) -> frozenset[int]:
        return self.transport.alive()

    def version(self) -> int:
        return self.handler.core.merges

    def _request_eval(self, trigger: str) -> None:
        """Evaluate the global model. Sharded: shard 0 evaluates its own fragments with the other shards' from
        their newest checkpoint slots (diloco_chaos/harness/syncer/shards.py); the other shards do not evaluate."""
        if self.sc.syncer.shards == 1:
            self.evaluator.request(self.version(), self.tokens_merged, self.handler.core.params, trigger)
            return
        if self.shard != 0:
            return
        params, versions, tokens = assembled_params(self.run_dir, self.sc, self.handler.core.params, self._owners,
                                                    self.shard, self.transport.max_frame)
        self.evaluator.request(self.version() + versions, self.tokens_merged + tokens, params, trigger)

    def _eval_schedule(self, now: float) -> EvalSchedule:
        sched = EvalSchedule.start(1.0, self.sc.eval.points, self.sc.eval.every_s, now, self.sc.eval.max_share)
        sched.taken(now, self.handler.progress())  # a restored syncer starts past the milestones it took
        return sched

    # -- main loop --------------------------------------------------------------------------------
    def serve(self, stop_requested: Any) -> None:
        """Run until every learner said BYE or `stop_requested.is_set()`; then drain and checkpoint."""
        self.transport.start()
        self.evaluator.start()
        owned = getattr(self.handler.core, "owned", None)
        self.events.write(SyncerStart(port=self.port, algorithm=self.algorithm,
                                      fragments=self.handler.fragments or None,
                                      shard=self.shard if owned is not None else None,
                                      owned=sorted(owned) if owned is not None else None))
        self._request_eval("start")
        schedule = self._eval_schedule(time.monotonic())
        wake: float | None = None
        m = self.sc.topology.learners
        inbox = self.transport.inbox
        while True:
            now = time.monotonic()
            if len(self.transport.finished) >= m or stop_requested.is_set():
                break
            timeout = 0.1 if wake is None else min(0.1, max(0.0, wake - now))
            try:
                self._handle(inbox.get(timeout=timeout))
                while True:  # take everything already queued before deciding merges
                    self._handle(inbox.get_nowait())
            except queue.Empty:
                pass
            wake = self.handler.poll(time.monotonic())
            now = time.monotonic()
            done = self.handler.progress()
            schedule.cost(self.evaluator.last_cpu_s)
            trigger = schedule.due(now, done)
            if trigger is not None:
                self._request_eval(trigger)
                schedule.taken(now, done)
        self._finish()
        self.evaluator.stop(self.sc.timeouts.shutdown_s)

    def _handle(self, item: InboxItem) -> None:
        conn, learner = item.conn, item.conn.learner
        assert learner is not None
        if item.kind == "join":
            old = self.transport.register(conn)
            if old is not None:
                self.transport.close(old, "replaced by a new connection")
            fields = self.handler.join_fields(learner)
            versions = fields.get("versions")
            self.events.write(LearnerJoin(learner=learner, peer=conn.peer, alive=sorted(self.alive()),
                                          versions=list(versions) if isinstance(versions, list) else None))
            self.handler.welcome(conn, fields)
            return
        if item.kind == "leave":
            self.transport.unregister(conn)
            self.handler.before_leave(learner)
            self.events.write(LearnerLeave(learner=learner, alive=sorted(self.alive())))
            self.handler.after_leave(learner)
            return
        msg = item.msg
        assert msg is not None
        if msg.type is MsgType.BYE:
            self.transport.finished.add(learner)
            self.handler.on_bye(learner)
            self.events.write(LearnerBye(learner=learner))
            # the syncer closes, not the learner: it has taken in everything the learner sent before BYE, and
            # a learner that closed first would lose what its (or its proxy's) send buffer still held. Its own
            # BYE first: a learner whose connection ends without it sends its final pushes again
            # (diloco_chaos/harness/learner/syncer_link.py)
            # (not behind fragment values it will never apply: on a slow link those held it past the syncer's end)
            self.transport.drop_fragments(conn)
            self.transport.send(conn, Message(MsgType.BYE, {}))
            self.transport.close_after_sent(conn, "learner said BYE")
        elif not self.handler.on_message(learner, msg):
            self.events.write(UnexpectedMessage(learner=learner, type=msg.type.name))

    def _finish(self) -> None:
        self.handler.finish()
        acc = self.handler.accounting
        self.save_checkpoint(checkpoint_name(self.shard, self.sc.syncer.shards))
        acc.close()
        self.events.write(SyncerDone(merges=self.handler.core.merges, tokens_merged=acc.tokens_merged,
                                     frames_rejected=self.frames_rejected, cpu_s=cpu_seconds(),
                                     checkpoints=acc.checkpoints, checkpoint_s=round(acc.checkpoint_s, 4)))
        self.transport.shutdown()

    def save_checkpoint(self, name: str) -> str:
        return self.handler.accounting.save_checkpoint(name, self.handler.core, self.algorithm)


@dataclass(frozen=True)
class SyncerSpec:
    """Everything the syncer process needs; picklable."""

    run_dir: str
    scenario: Scenario
    """The scenario the supervisor validated, as it is: the syncer never parses a document again."""
    secret_hex: str
    parent_pid: int
    port: int = 0
    """0: any free port; a restarted syncer rebinds the port the learners' links (and proxies) point at."""
    restore: bool = False
    """Load the per-fragment checkpoint of a syncer that crashed."""
    host: str = "127.0.0.1"
    """Address to listen on: loopback, or the netns hosts' bridge (diloco_chaos/harness/hosts/netns.py)."""
    shard: int = 0
    """Which shard of the synchronizer (syncer.shards > 1), else 0."""
    plugins: tuple[algorithms.PluginRef, ...] = field(default_factory=algorithms.plugin_refs)
    """The algorithm plugins registered where the spec was made, imported first (a forkserver may predate them)."""


def syncer_main(spec: SyncerSpec, port_conn: Any, stop_requested: Any) -> None:
    """Process entry: bind, report the port to the supervisor, serve until done."""
    from diloco_chaos.harness.record.events import EVENTS_FILE
    from diloco_chaos.harness.run.procutil import become_run_process, print_error, stderr_to_file

    become_run_process(spec.parent_pid)
    algorithms.load_plugins(spec.plugins)
    sc = spec.scenario
    stderr_to_file(spec.run_dir, proc_name(spec.shard, sc.syncer.shards))
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), proc_name(spec.shard, sc.syncer.shards))
    svc = SyncerService(sc, spec.run_dir, bytes.fromhex(spec.secret_hex), events, spec.port, spec.restore,
                        spec.shard, spec.host)
    port_conn.send(svc.port)
    port_conn.close()
    try:
        svc.serve(stop_requested)
    except Exception as e:
        print_error(e)  # logs/<proc>.stderr, before the event the supervisor reacts to; not printed twice
        events.write(SyncerError(error=f"{type(e).__name__}: {e}"))
        raise SystemExit(1) from e
    finally:
        events.close()
