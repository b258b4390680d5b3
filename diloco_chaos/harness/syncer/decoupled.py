"""Decoupled DiLoCo's side of the syncer service: pushes in, pulls and merged fragments out.

`DecoupledHandler` drives `diloco_chaos.trainers.syncers.decoupled.DecoupledSyncer` from the typed frames the transport
hands the main loop (META, PUSH), logs every outcome (push, push_superseded, push_rejected, pull, merge,
fragment_resent, budget_reached), counts and persists merges before broadcasting them (diloco_chaos/harness/
syncer_accounting.py), and restores the core from its slots after a syncer crash: what a crash loses is only
what was never acknowledged to anyone (rounds still open, pushes carried for a fragment's next round, the
online step-time estimates).
"""

from __future__ import annotations

import dataclasses
import time

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record.base import Event
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.syncer import (
    BudgetReached,
    CheckpointSlotRejected,
    FragmentResent,
    Merge,
    PushRejected,
    PushSuperseded,
    SyncerRestore,
)
from diloco_chaos.harness.record.syncer import Pull as PullEvent
from diloco_chaos.harness.record.syncer import Push as PushEvent
from diloco_chaos.harness.syncer.accounting import Accounting, fragment_digest
from diloco_chaos.harness.syncer.shards import fragment_owners, state_dir
from diloco_chaos.harness.syncer.transport import Conn, Transport
from diloco_chaos.harness.wire.convert import merged_to_message, message_to_push, push_round
from diloco_chaos.harness.wire.framing import Message, MsgType
from diloco_chaos.trainers.syncers.decoupled import DecoupledSyncer
from diloco_chaos.trainers.syncers.decoupled_records import MergeRecord, Pull, PushOutcome, SupersededCause
from diloco_chaos.trainers.syncers.shards import owned as owned_by

REJOIN_DROP = ("dropped on rejoin: carried from before it rejoined, where it is sent the current value (its "
               "counters reset)")


class DecoupledHandler:
    """An `AlgorithmHandler` (diloco_chaos/harness/syncer/dispatch.py) for `algorithm = "decoupled"`."""

    def __init__(self, sc: Scenario, run_dir: str, events: EventLog, transport: Transport, shard: int = 0) -> None:
        self.sc = sc
        self.events = events
        self.transport = transport
        self.shard = shard
        s = sc.syncer.shards
        self.owners = fragment_owners(sc) if s > 1 else None
        """syncer.shards > 1: the owning shard of each fragment (diloco_chaos/harness/syncer/shards.py); None: one
        syncer."""
        owned = frozenset(owned_by(self.owners, shard)) if self.owners is not None else None
        self.core = DecoupledSyncer(scenario_task(sc), sc.diloco, sc.seed, sc.topology.learners, owned)
        self.fragments: int | None = len(self.core.partition)
        self.accounting = Accounting(run_dir, len(self.core.partition),
                                     sc.recovery.syncer_checkpoint == "every_merge",
                                     sc.recovery.syncer_checkpoint_fsync, state_dir(shard, s))
        self.budget_total = sc.topology.learners * sc.train.steps if sc.train.budget == "total" else None
        """train.budget = total: learner-steps the run trains in all; reaching it sends every learner STOP."""
        self.budget_reached = False

    # -- lifecycle ---------------------------------------------------------------------------------
    def restore(self) -> None:
        """Load the newest valid slot of every fragment (a syncer started after a crash)."""
        states, rejected = self.accounting.load(self.transport.max_frame)
        for why in rejected:  # a slot torn by the crash: the other slot of that fragment holds the version before
            self.events.write(CheckpointSlotRejected(detail=why))
        core = self.core
        core.restore(states)
        parts = range(len(core.partition))
        self.events.write(SyncerRestore(
            fragments=[int(st["fragment"]) for st in states], versions=list(core.versions), merges=core.merges,
            clock=core.clock, tokens_merged=self.accounting.tokens_merged,
            digests={str(p): fragment_digest(core.fragment(p)) for p in parts},
            merged_into={str(p): {str(m): list(v) for (m, q), v in core.merged_into.items() if q == p}
                         for p in parts}))

    def join_fields(self, learner: int) -> dict[str, object]:
        """A learner joined: the versions of the current fragments it is sent (it applies them, resetting its
        counters); pushes carried from before it rejoined are dropped."""
        versions = self.core.on_join(learner)
        for q in self.core.drop_carried(learner):
            self.events.write(PushSuperseded(learner=learner, fragment=q.fragment, first_step=q.first_step,
                                             last_step=q.last_step, base_version=q.base_version, reason=REJOIN_DROP,
                                             cause=SupersededCause.REJOIN_DROP))
        return {"versions": versions}

    def welcome(self, conn: Conn, fields: dict[str, object]) -> None:
        """The pull: current global fragments to a (re)joining learner."""
        versions = fields["versions"]
        assert isinstance(versions, list)
        for p, version in enumerate(versions):
            if self.core.owns(p):  # a shard sends its own fragments; the others come from their shards
                flag = conn.learner is not None and self._overwrites(conn.learner, p, version)
                self.transport.send(conn, merged_to_message(p, version, self.core.fragment(p), broadcast=flag,
                                                            merged_step=self._merged_step(conn.learner or 0, p)))
        if self.budget_reached:  # it came back after the budget was spent: it stops after a step
            self.transport.send(conn, Message(MsgType.STOP, {"total": self.budget_total}))

    def before_leave(self, learner: int) -> None:
        self.core.forget(learner)

    def after_leave(self, learner: int) -> None:
        return None

    def on_bye(self, learner: int) -> None:
        return None

    def on_message(self, learner: int, msg: Message) -> bool:
        if msg.type is MsgType.META:
            pulls = self.core.on_meta(learner, int(msg.meta["step"]), float(msg.meta["step_time_s"]),
                                      time.monotonic(), self.transport.alive())
            for pull in pulls:
                self._send_pull(pull)
            self._check_budget()
            return True
        if msg.type is MsgType.PUSH:
            self._on_push(learner, msg)
            return True
        return False

    def progress(self) -> float:
        """Learner-steps reported (each learner's highest step) over the learner-steps planned. Not tokens
        merged: a push superseded by its learner's next one, or still in flight at the end, is never merged,
        so merged tokens stop well short of the planned ones."""
        return sum(self.core.reported_step.values()) / (self.sc.topology.learners * self.sc.train.steps)

    def poll(self, now: float) -> float | None:
        merges, wake = self.core.poll(now, self.transport.alive())
        self._broadcast_all(merges)
        return wake

    def finish(self) -> None:
        self._broadcast_all(self.core.drain(time.monotonic()))

    # -- pushes and pulls --------------------------------------------------------------------------
    def _on_push(self, learner: int, msg: Message) -> None:
        try:
            push = message_to_push(msg)
        except (KeyError, TypeError, ValueError) as e:
            self.events.write(PushRejected(learner=learner, reason=f"malformed: {e}"))
            return
        if push.learner != learner:
            self.events.write(PushRejected(learner=learner, reason="learner id does not match the connection"))
            return
        round_id = push_round(msg)
        outcome, superseded = self.core.on_push(push, round_id, time.monotonic())
        if outcome is PushOutcome.DECLINED:
            return
        into_round = None  # accepted or carried: the round it is in now (None: held for the fragment's next one)
        if outcome in (PushOutcome.ACCEPTED, PushOutcome.CARRIED):
            rnd = self.core.rounds[push.fragment]
            into_round = rnd.round_id if rnd is not None else None
        # the push and what became of it in one write: a syncer killed here leaves both records or neither
        records: list[Event] = [PushEvent(
            learner=learner, fragment=push.fragment, round=round_id, c_steps=push.c_steps, c_tokens=push.c_tokens,
            first_step=push.first_step, last_step=push.last_step, base_version=push.base_version, outcome=outcome,
            final=push.final, joined=into_round)]
        resend = False
        if outcome in (PushOutcome.STALE, PushOutcome.UNANCHORED, PushOutcome.BEFORE_REJOIN, PushOutcome.LAGGING,
                       PushOutcome.OVERWRITTEN):
            if outcome is PushOutcome.STALE:
                into = self.core.merged_into[(learner, push.fragment)]
                reason = f"stale: its work is already in version {into[0]}, not yet applied"
            elif outcome is PushOutcome.BEFORE_REJOIN:
                joined = self.core.joined_at[(learner, push.fragment)]
                reason = (f"before rejoin: based on version {push.base_version}, older than version {joined} "
                          "it was sent when it rejoined, not yet applied")
            elif outcome is PushOutcome.OVERWRITTEN:
                sent = self.core.overwritten_at[(learner, push.fragment)]
                reason = (f"overwritten: based on version {push.base_version}, older than version {sent} it was "
                          "sent as a merge it was not in (broadcast = all), not yet applied")
            elif outcome is PushOutcome.LAGGING:
                reason = (f"lagging: based on version {push.base_version}, more than "
                          f"{self.sc.diloco.max_staleness} versions behind version {self.core.versions[push.fragment]}")
            else:
                reason = (f"stale: based on version {push.base_version}, older than the "
                          f"{self.sc.diloco.anchor_history} versions held to anchor it")
            records.append(PushSuperseded(learner=learner, fragment=push.fragment, reason=reason,
                                          cause=SupersededCause.of(outcome), first_step=push.first_step,
                                          last_step=push.last_step, base_version=push.base_version))
            # it stepped on without the merge, or is too far behind: send it the fragment's current value
            # (an overwritten push's learner was just sent the merge it was not in)
            resend = outcome is not PushOutcome.OVERWRITTEN and (
                outcome in (PushOutcome.UNANCHORED, PushOutcome.LAGGING) or self.core.missed_broadcast(push))
        elif outcome not in (PushOutcome.ACCEPTED, PushOutcome.CARRIED):
            records.append(PushRejected(learner=learner, fragment=push.fragment, reason=outcome.value,
                                        first_step=push.first_step, last_step=push.last_step))
        if superseded is not None:
            records.append(PushSuperseded(learner=learner, fragment=push.fragment, round=into_round,
                                          reason="newer push in the same round", cause=SupersededCause.NEWER,
                                          first_step=superseded.first_step, last_step=superseded.last_step))
        self.events.write_all(records)
        if resend:
            self._resend_current(learner, push.fragment, reason=outcome.value)

    def _send_pull(self, pull: Pull) -> None:
        msg = Message(MsgType.PULL, {"fragment": pull.fragment, "round": pull.round_id})
        for conn in self.transport.connections(pull.learners).values():
            self.transport.send(conn, msg)
        self.events.write(PullEvent(fragment=pull.fragment, round=pull.round_id, learners=sorted(pull.learners),
                                    clock=self.core.clock))

    def _check_budget(self) -> None:
        """train.budget = total: once the learners' reported steps (each learner's highest, which a restarted
        learner continues from, so redone steps count once) add up to the budget, tell every learner to stop."""
        if self.budget_total is None or self.budget_reached:
            return
        total = sum(self.core.reported_step.values())
        if total < self.budget_total:
            return
        self.budget_reached = True
        conns = self.transport.connections()
        self.events.write(BudgetReached(total_steps=total, budget=self.budget_total,
                                        per_learner={str(m): s for m, s in sorted(self.core.reported_step.items())}))
        for conn in conns.values():
            self.transport.send(conn, Message(MsgType.STOP, {"total": total}))

    def _resend_current(self, learner: int, p: int, reason: str) -> None:
        """Send `learner` fragment p's current global value (applied on arrival), if it is connected."""
        conn = self.transport.connection(learner)
        if conn is None:
            return
        version = self.core.versions[p]
        self.transport.send_fragment(conn, p, merged_to_message(p, version, self.core.fragment(p),
                                                                broadcast=self._overwrites(learner, p, version),
                                                                merged_step=self._merged_step(learner, p)))
        self.events.write(FragmentResent(learner=learner, fragment=p, version=version, reason=reason))

    # -- merges ------------------------------------------------------------------------------------
    def _broadcast_all(self, recs: list[MergeRecord]) -> None:
        """Count and persist the merges (all of them, before any is sent), then broadcast each."""
        for rec, counted in zip(recs, self.accounting.account(recs, self.core.fragment_state), strict=True):
            self._broadcast_merge(rec, *counted)

    def _broadcast_merge(self, rec: MergeRecord, tokens: float, tokens_merged: float) -> None:
        """Send a merge to its participants and log it with its tokens and the total merged up to it."""
        t0 = time.monotonic()
        targets = self.transport.connections(rec.participants)  # a late answer is carried into the next round
        for m, pulled in zip(rec.participants, rec.pulled_steps, strict=True):
            if m in targets:
                self.transport.send_fragment(targets[m], rec.fragment,
                                             merged_to_message(rec.fragment, rec.version, rec.tensors, pulled))
        overwrites = self._broadcast_others(rec) if self.sc.diloco.broadcast == "all" else None
        self.core.note_sync_time(time.monotonic() - rec.merged_at)
        w = rec.weights
        self.events.write(Merge(
            fragment=rec.fragment, version=rec.version, merges=self.core.merges, round=rec.round_id,
            participants=rec.participants, carried=rec.carried, weights=[round(x, 6) for x in w],
            c_steps=rec.c_steps, c_tokens=list[float](rec.c_tokens), step_ranges=[list(r) for r in rec.step_ranges],
            base_versions=rec.base_versions,
            reason=rec.reason, grace_s=rec.grace_s, quorum_wait_s=(rec.quorum_at or rec.merged_at) - rec.started_at,
            wait_s=rec.merged_at - rec.started_at, broadcast_s=time.monotonic() - t0,
            tokens=tokens, tokens_merged=tokens_merged,
            outer_grad_norm=rec.outer_grad_norm, digest=fragment_digest(rec.tensors),
            norms={**dataclasses.asdict(rec.norms), "momentum_in": rec.momentum_in, "momentum_out": rec.momentum_out},
            outer_lr=rec.outer_lr, overwrites=overwrites,
        ))

    def _overwrites(self, learner: int, p: int, version: int) -> bool:
        """Whether `version` of fragment p is a merge `learner` was sent without being in it (broadcast = all):
        sent again (a resend, a welcome that replaced the queued broadcast), it keeps that flag."""
        return self.core.overwritten_at.get((learner, p)) == version

    def _merged_step(self, learner: int, p: int) -> int:
        """The last step of `learner`'s work on fragment p a merge took in (-1: none)."""
        return self.core.merged_into.get((learner, p), (0, -1))[1]

    def _broadcast_others(self, rec: MergeRecord) -> list[int]:
        """diloco.broadcast = all (the paper's syncer loop, step 7): send the merge to every alive learner not in
        it, flagged so it overwrites its copy on arrival. Its carried pushes of the fragment, and its later
        pushes based on older versions, are dropped (`DecoupledSyncer.on_overwrite`). Returns those learners."""
        others = sorted(self.transport.alive() - set(rec.participants))
        conns = self.transport.connections(others)
        sent = []
        for m, conn in conns.items():
            msg = merged_to_message(rec.fragment, rec.version, rec.tensors, broadcast=True,
                                    merged_step=self._merged_step(m, rec.fragment))
            self.transport.send_fragment(conn, rec.fragment, msg)
            sent.append(m)
            for q in self.core.on_overwrite(m, rec.fragment, rec.version):
                self.events.write(PushSuperseded(
                    learner=m, fragment=q.fragment, first_step=q.first_step, last_step=q.last_step,
                    base_version=q.base_version, cause=SupersededCause.BROADCAST_DROP,
                    reason=f"dropped: carried, and its learner was sent version {rec.version}, a merge it was not in"))
        return sent
