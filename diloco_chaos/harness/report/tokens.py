"""Where every trained token went: report.json `tokens`, whose parts sum to the tokens trained (docs/metrics.md,
"Where the trained tokens went").

What: `token_parts(evs, algorithm, fragments, sync_every)` splits each inner step's tokens (its `step` record) into
the part that reached the global model and the parts that did not, each by the event that ended it:

* merged: the share of the step a merge took in (the coverage of diloco_chaos/harness/report/progress.py; decoupled:
  per fragment, 1/P of the step's tokens for each fragment a merge took in).
* discarded_overlap: decoupled, work on fragment p in the overlap window, overwritten by p's merged value: the steps
  after the pull the learner answered, up to the `apply` (the paper's overwrite, notes §1.3).
* discarded_broadcast: work overwritten by the value of a merge its learner was not in: a `fragment_overwritten`
  record (diloco.broadcast = "all"), or a synchronous round applied over steps no merge took in.
* discarded_restart: work lost when its learner was lost (`learner_down`, `learner_restart`: the steps since its
  last merged work), redone after a restart (a step logged again), or overwritten by the current value it took
  on (re)joining (an `apply` of values it did not pull).
* discarded_rejected: work whose push or sync the syncer or quorum declined (`push_rejected`, a `push_superseded`
  other than by a newer push, `sync_rejected`, an uncommitted torchft sync).
* in_flight_at_end: trained, or pushed, and not merged when the run stopped.
* unattributed: work overwritten by the merge of a pull its learner answered although no merge took its push
  and no record says why.

`merged_unlogged` is not a part: tokens merged whose steps have no `step` record (a learner killed between sending
its work and logging the step), so that report.json `tokens_merged` = merged + merged_unlogged.

How: each step record is a unit per fragment (one unit, of the step's whole tokens, for an algorithm without
fragments and for torchft); the system's reader (READERS, by the algorithm descriptor's `system`) says each unit's
covered share and lists `Claim`s, the events that end unmerged work; the claims, in time order, take the uncovered
rest of the units they hold; what no claim takes is in flight at the end. A step logged twice by one learner (a
restart redid it) counts its earlier records as discarded_restart.

Why: about a third of the trained tokens never reached the global model in every decoupled configuration, and
nothing said where they went (issue 29); the same view for every system makes the comparison honest.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import Apply, FragmentOverwritten, Step
from diloco_chaos.harness.record.run import LearnerDown, LearnerRestart
from diloco_chaos.harness.record.syncer import Merge, PushRejected, PushSuperseded, SyncRejected
from diloco_chaos.harness.record.torchft import TorchftSync
from diloco_chaos.harness.report.progress import progress
from diloco_chaos.trainers.syncers.decoupled_records import SupersededCause

PARTS = ("merged", "discarded_overlap", "discarded_broadcast", "discarded_restart", "discarded_rejected",
         "in_flight_at_end", "unattributed")
"""The parts of `trained`, in report order."""


@dataclass(frozen=True)
class TokenParts:
    """report.json `tokens`: the trained tokens and where they went (module docstring)."""

    trained: float
    merged: float
    discarded_overlap: float
    discarded_broadcast: float
    discarded_restart: float
    discarded_rejected: float
    in_flight_at_end: float
    unattributed: float
    merged_unlogged: float
    """Not a part: tokens merged whose steps were never logged."""

    def parts(self) -> dict[str, float]:
        """Each part of `trained` (they sum to it)."""
        return {p: getattr(self, p) for p in PARTS}

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class Claim:
    """An event that ended some unmerged work of one learner: it takes the uncovered rest of the units it holds."""

    t: float
    learner: int
    kind: str
    """The part it gives them (a PARTS name)."""
    fragment: int | None = None
    """The fragment whose units it holds (None: every fragment)."""
    last_step: int | None = None
    """Units of steps first_step..last_step of the learner's incarnation at `t`; None: every unit logged before t."""
    first_step: int = 0
    pulled: int | None = None
    """Units of steps up to this one take `before` instead of `kind` (the overlap's pull)."""
    before: str = "unattributed"
    share: float = 1.0
    """At most this share of each unit's tokens (a torchft_diloco sync holds one fragment of a window)."""


@dataclass
class _Unit:
    learner: int
    step: int
    t: float
    incarnation: int
    fragment: int
    tokens: float
    """The unit's tokens (the step's / the units per step)."""
    remaining: float


@dataclass(frozen=True)
class Ledger:
    """What a system's reader says of a run: each (learner, step, fragment)'s covered share, and the claims."""

    fragments: int
    """Units per step (1: the step's tokens are one unit)."""
    covered: Callable[[int, int, int], float]
    """(learner, step, fragment) -> the share of that unit a merge took in."""
    claims: list[Claim]
    rejected: frozenset[tuple[int, int, int]] = frozenset()
    """(learner, fragment, step) units whose last push was declined: discarded_rejected if nothing later took them."""


def _restarts(evs: Sequence[Event]) -> list[Claim]:
    return [Claim(e.t, e.learner, "discarded_restart") for e in evs if isinstance(e, LearnerDown | LearnerRestart)]


def _builtin(evs: Sequence[Event], alg: algorithms.Algorithm, fragments: int, sync_every: int) -> Ledger:
    """Built-in syncer: merges by step range (decoupled, per fragment) or by round or step; applies overwrite."""
    claims = _restarts(evs)
    overwritten = {(e.learner, e.fragment, e.step) for e in evs if isinstance(e, FragmentOverwritten)}
    claims += [Claim(e.t, e.learner, "discarded_broadcast", e.fragment, e.step) for e in evs
               if isinstance(e, FragmentOverwritten)]
    seen: set[tuple[int, int, int]] = set()
    for e in evs:
        if isinstance(e, Apply) and e.fragments:
            for i, p in enumerate(e.fragments):
                if (e.learner, p, e.step) in seen:
                    continue  # every chip of a learner may log its apply
                seen.add((e.learner, p, e.step))
                pulled = (e.pulled or [])[i] if i < len(e.pulled or []) else None
                if pulled is not None:
                    claims.append(Claim(e.t, e.learner, "discarded_overlap", p, e.step, pulled=pulled))
                elif (e.learner, p, e.step) not in overwritten:
                    # a value it did not pull: the current one taken on (re)joining, or a merge it was not in over
                    # work it had already pushed (so no fragment_overwritten), which loses that work to the broadcast
                    kind = "discarded_broadcast" if e.was_broadcast(i) else "discarded_restart"
                    claims.append(Claim(e.t, e.learner, kind, p, e.step))
        elif isinstance(e, Apply) and e.round is not None:
            claims.append(Claim(e.t, e.learner, "discarded_broadcast", None, e.step))
        elif isinstance(e, SyncRejected):
            if e.step is not None:
                claims.append(Claim(e.t, e.learner, "discarded_rejected", None, e.step, e.step))
            elif e.round is not None:
                claims.append(Claim(e.t, e.learner, "discarded_rejected", None, e.round * sync_every,
                                    (e.round - 1) * sync_every + 1))
    if alg.fragmented:
        cover: set[tuple[int, int, int]] = set()
        for m_ in evs:
            if isinstance(m_, Merge) and m_.fragment is not None:
                for m, (a, b) in zip(m_.participants, m_.step_ranges or [], strict=False):
                    cover.update((m, int(s), m_.fragment) for s in range(int(a), int(b) + 1))
        rejected = {(e.learner, e.fragment, s) for e in evs
                    if isinstance(e, PushRejected) and e.fragment is not None and e.first_step is not None
                    and e.last_step is not None for s in range(e.first_step, e.last_step + 1)}
        rejected |= {(e.learner, e.fragment, s) for e in evs
                     if isinstance(e, PushSuperseded) and e.cause is not SupersededCause.NEWER
                     for s in range(e.first_step, e.last_step + 1)}
        return Ledger(fragments, lambda m, s, p: 1.0 if (m, s, p) in cover else 0.0, claims, frozenset(rejected))
    share = progress(evs, alg.name, fragments, sync_every).covered
    return Ledger(1, lambda m, s, p: min(1.0, share.get(m, {}).get(s, 0.0)), claims)


def _torchft(evs: Sequence[Event], alg: algorithms.Algorithm, fragments: int, sync_every: int) -> Ledger:
    """torchft: a committed sync covers its window (progress.py); an uncommitted one's work is declined."""
    window, share = (1, 1.0) if alg.data_parallel else (sync_every, 1.0 / max(1, fragments))
    claims = _restarts(evs)
    claims += [Claim(e.t, e.learner, "discarded_rejected", None, e.inner_step, e.inner_step - window + 1,
                     share=share) for e in evs if isinstance(e, TorchftSync) and e.rank == 0 and not e.committed]
    cover = progress(evs, alg.name, fragments, sync_every).covered
    return Ledger(1, lambda m, s, p: min(1.0, cover.get(m, {}).get(s, 0.0)), claims)


READERS: dict[algorithms.System, Callable[[Sequence[Event], algorithms.Algorithm, int, int], Ledger]] = {
    "builtin": _builtin, "torchft": _torchft}
"""How each system's history says which work was merged and what ended the rest; a plugin target's is read as the
builtin one's (as in progress.py READERS)."""


def token_parts(evs: Sequence[Event], algorithm: str, fragments: int, sync_every: int,
                tokens_merged: float) -> TokenParts:
    """Where the tokens of every `step` record went (module docstring); `tokens_merged` is report.json's (the
    syncer's count), against which merged_unlogged is told."""
    alg = algorithms.get(algorithm)
    ledger = READERS.get(alg.system, _builtin)(evs, alg, fragments, sync_every)
    totals: dict[str, float] = defaultdict(float)
    boundaries: dict[int, list[float]] = defaultdict(list)  # learner -> its restarts' times
    for e in evs:
        if isinstance(e, LearnerRestart):
            boundaries[e.learner].append(e.t)
    for times in boundaries.values():
        times.sort()

    def incarnation(m: int, t: float) -> int:
        return bisect.bisect_right(boundaries.get(m, []), t)

    steps = sorted((e for e in evs if isinstance(e, Step)), key=lambda e: e.t)
    last: dict[tuple[int, int], int] = {(e.learner, e.step): i for i, e in enumerate(steps)}
    trained = 0.0
    units: dict[int, list[_Unit]] = defaultdict(list)
    f = max(1, ledger.fragments)
    for i, e in enumerate(steps):
        trained += e.tokens
        if last[(e.learner, e.step)] != i:
            totals["discarded_restart"] += e.tokens  # redone after a restart: this record's work was lost
            continue
        for p in range(f):
            share = ledger.covered(e.learner, e.step, p)
            totals["merged"] += e.tokens / f * share
            if share < 1.0:
                units[e.learner].append(_Unit(e.learner, e.step, e.t, incarnation(e.learner, e.t), p, e.tokens / f,
                                              e.tokens / f * (1.0 - share)))
    for c in sorted(ledger.claims, key=lambda c: c.t):
        inc = incarnation(c.learner, c.t)
        for u in units.get(c.learner, []):
            if u.remaining <= 0 or (c.fragment is not None and u.fragment != c.fragment):
                continue
            if c.last_step is None:
                if u.t >= c.t:
                    continue
            elif u.incarnation != inc or not c.first_step <= u.step <= c.last_step:
                continue
            take = min(u.remaining, c.share * u.tokens)
            kind = c.before if c.pulled is not None and u.step <= c.pulled else c.kind
            if kind == "unattributed" and (u.learner, u.fragment, u.step) in ledger.rejected:
                kind = "discarded_rejected"
            totals[kind] += take
            u.remaining -= take
    for xs in units.values():
        for u in xs:
            if u.remaining > 0:
                kind = ("discarded_rejected" if (u.learner, u.fragment, u.step) in ledger.rejected
                        else "in_flight_at_end")
                totals[kind] += u.remaining
    return TokenParts(trained=trained, **{p: totals[p] for p in PARTS},
                      merged_unlogged=tokens_merged - totals["merged"])
