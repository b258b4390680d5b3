"""The synchronous baselines' side of the syncer service (ddp, diloco, elastic_ddp): one barrier round at a time.

`BarrierHandler` drives any `diloco_chaos.trainers.syncers.core.BarrierCore`: a (re)joining learner is sent the state it
resumes from (RESUME), a contribution (GRADS every step, PARAMS every H steps) goes to the core, and a
completed round is sent back to its participants (GRADS_AVG / PARAMS_MERGED) and logged as a `merge`; a
round asked for again by one learner is answered to it alone. elastic_ddp's group changes come back from the
core as records, each logged as an `elastic_reconfigure` event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import tokens_per_batch
from diloco_chaos.harness.record.elastic import ElasticRollback
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.syncer import ElasticCatchUpSent, ElasticReconfigure, Merge, SyncReplayed
from diloco_chaos.harness.record.syncer import SyncRejected as SyncRejectedEvent
from diloco_chaos.harness.syncer.accounting import Accounting
from diloco_chaos.harness.syncer.eval_schedule import planned_tokens
from diloco_chaos.harness.syncer.transport import Conn, Transport
from diloco_chaos.harness.wire.framing import Message, MsgType
from diloco_chaos.trainers.merge.outer_gradient import all_finite
from diloco_chaos.trainers.syncers.core import BarrierCore, Contribution, SyncRejected, SyncResult, SyncRound


@dataclass(frozen=True)
class Frames:
    """The frames of one kind of contribution."""

    request: MsgType
    """What a learner sends."""
    reply: MsgType
    """What a completed round is answered with."""
    key: str
    """The meta field that names the round ("step" or "round"); the reply carries it."""


FRAMES: dict[Contribution, Frames] = {
    "grads": Frames(MsgType.GRADS, MsgType.GRADS_AVG, "step"),
    "params": Frames(MsgType.PARAMS, MsgType.PARAMS_MERGED, "round"),
}


class BarrierHandler:
    """An `AlgorithmHandler` (diloco_chaos/harness/syncer/dispatch.py) for the synchronous algorithms."""

    fragments: int | None = None

    def __init__(self, sc: Scenario, run_dir: str, events: EventLog, transport: Transport,
                 core: BarrierCore) -> None:
        self.events = events
        self.transport = transport
        self.core = core
        self.frames = FRAMES[core.contribution]
        self.accounting = Accounting(run_dir, 0, persist=False, fsync=False)
        self.planned_tokens = planned_tokens(sc.topology.learners, sc.topology.chips_per_learner, sc.train.steps,
                                             tokens_per_batch(sc), 1)

    def restore(self) -> None:
        raise ValueError(f"{type(self.core).__name__} keeps no crash-safe state to restore from")

    def join_fields(self, learner: int) -> dict[str, object]:
        return {}

    def welcome(self, conn: Conn, fields: dict[str, object]) -> None:
        """A (re)started learner resumes from the syncer's state (a fresh one ignores it); elastic_ddp admits
        it at the next step, from this state."""
        assert conn.learner is not None
        step, tensors = self.core.on_join(conn.learner, time.monotonic(), f"connected from {conn.peer}")
        for frm, to, m in self.core.take_rollbacks():  # elastic_ddp's torchrun engine: the job restarted whole
            self.events.write(ElasticRollback(from_step=frm, to_step=to, learner=m))
        self.transport.send(conn, Message(MsgType.RESUME, {"step": step}, tensors))

    def before_leave(self, learner: int) -> None:
        return None

    def after_leave(self, learner: int) -> None:
        if self.transport.connection(learner) is not None:  # a newer connection replaced it: not a loss
            return
        res = self.core.on_leave(learner, time.monotonic(), "link closed")  # elastic_ddp: the group shrinks
        self._log_reconfigurations()
        if isinstance(res, SyncRound):  # the survivors' gradients were in: the open step completes
            self._on_sync_result(learner, res, res.key)

    def on_bye(self, learner: int) -> None:
        self.core.on_finished(learner)

    def on_message(self, learner: int, msg: Message) -> bool:
        if msg.type is not self.frames.request:
            return False
        key = int(msg.meta[self.frames.key])
        res = self.core.on_contribution(learner, key, int(msg.meta["step"]), int(msg.meta["tokens"]), msg.tensors,
                                        time.monotonic())
        self._log_reconfigurations()
        if res is False:  # refused for its content: say which way, so a learner's non-finite work is named
            res = SyncRejected("rejected_nonfinite" if not all_finite(msg.tensors.values())
                               else "rejected_shape: not the model's tensor names")
        self._on_sync_result(learner, res, key)
        return True

    def progress(self) -> float:
        """Tokens merged over the tokens planned: a synchronous round merges every token it trained."""
        return self.accounting.tokens_merged / self.planned_tokens

    def poll(self, now: float) -> float | None:
        return None

    def finish(self) -> None:
        return None

    def _log_reconfigurations(self) -> None:
        """elastic_ddp: one `elastic_reconfigure` event per change of the global group (times since run start
        are the events' own `t`; started_at / ended_at here are the syncer's monotonic clock)."""
        for rec in self.core.take_reconfigurations():
            self.events.write(ElasticReconfigure(
                kind=rec.kind, learner=rec.learner, members_before=rec.members_before,
                members_after=rec.members_after, step=rec.step, started_at=rec.started_at, ended_at=rec.ended_at,
                stall_s=rec.stall_s, reason=rec.reason))

    def _on_sync_result(self, learner: int, res: SyncResult, value: int) -> None:
        key = self.frames.key
        if res is False or isinstance(res, SyncRejected):
            reason = res.reason if isinstance(res, SyncRejected) else "non-finite or malformed"
            self.events.write(SyncRejectedEvent(learner=learner, step=self._step(value), round=self._round(value),
                                                reason=reason))
            return
        if res is None or res is True:
            return
        msg = Message(self.frames.reply, {key: value}, res.tensors)
        if res.replay_to is not None:  # a learner asked again for a round it missed: answer it alone
            conn = self.transport.connection(res.replay_to)
            if conn is not None:
                self.transport.send(conn, msg)
            if res.step != res.key:  # elastic_ddp: it missed steps; it is sent the group's state instead
                self.events.write(ElasticCatchUpSent(learner=res.replay_to, step=self._step(value),
                                                     round=self._round(value), state_step=res.step))
            else:
                self.events.write(SyncReplayed(learner=res.replay_to, step=self._step(value),
                                               round=self._round(value)))
            return
        for conn in self.transport.connections(res.participants).values():
            self.transport.send(conn, msg)
        self.accounting.add_tokens(sum(res.tokens))
        self.events.write(Merge(fragment=None, version=self.core.merges, merges=self.core.merges,
                                participants=res.participants, tokens=sum(res.tokens),
                                c_tokens=list[float](res.tokens), tokens_merged=self.accounting.tokens_merged,
                                step=res.step, round=self._round(value)))

    def _step(self, key: int) -> int | None:
        """The barrier's key as an event's `step` (ddp, elastic_ddp; None for diloco)."""
        return key if self.frames.key == "step" else None

    def _round(self, key: int) -> int | None:
        """The barrier's key as an event's `round` (diloco; None for ddp, elastic_ddp)."""
        return key if self.frames.key == "round" else None
