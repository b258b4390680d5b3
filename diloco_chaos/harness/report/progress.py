"""When the global model advanced, by whom, with which work: one view of a run's progress that every system under
test gives, so report.json, goodput, uptime and the invariants read the same figures for each (docs/metrics.md,
"Progress of the global model").

What: `progress(evs, algorithm, fragments, sync_every)` returns a `Progress`: the `Advance`s of the global model
(when it advanced, the learners whose work it took in, their tokens, the cumulative tokens merged) and, per
learner, the share of each inner step's work that reached it. The system that ran the algorithm (its descriptor's
`system`, diloco_chaos/harness/algorithms/base.py) picks how they are read:

* builtin: one advance per `merge` event of the syncer (diloco_chaos/harness/record/syncer.py), as before.
* torchft: one advance per manager step committed in a quorum: the `torchft_sync` records with committed = true
  (diloco_chaos/harness/record/torchft.py) grouped by (quorum_id, step), at the first commit's time, its
  participants the learners that committed it. A committed sync of learner m at its inner step i takes in m's
  inner steps i - w < s <= i, each for a share 1 / f of the model: torchft_ddp (`data_parallel`) w = f = 1, the
  step's gradients; torchft_diloco w = sync_every and f = diloco.fragments, one fragment's pseudo-gradient over
  the last sync_every inner steps. A learner's tokens in the advance are its covered steps' tokens (its `step`
  records) x that share.

Why: the figures used to count `merge` events only, so a torchft run (which has none) reported no merges, no
tokens merged, a goodput of 0 and the whole run as one gap. A system is added here once, not in every figure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.syncer import Merge, shard_of
from diloco_chaos.harness.record.torchft import TorchftSync


@dataclass(frozen=True)
class Advance:
    """The global model advanced (a merge of the syncer, a committed torchft step)."""

    t: float
    """When (event clock)."""
    participants: tuple[int, ...]
    """The learners whose work it took in."""
    tokens: tuple[float, ...]
    """Each participant's tokens it took in (same order)."""
    shard: int
    """The syncer shard that made it (0 when unsharded, and for torchft)."""
    tokens_merged: float
    """Tokens merged by that shard so far, this advance included."""


@dataclass(frozen=True)
class Progress:
    """A run's progress of the global model, whatever system ran it."""

    advances: tuple[Advance, ...]
    """In event-log order."""
    covered: dict[int, dict[int, float]]
    """learner -> inner step -> the share of the model (fragments) its work reached, up to 1."""
    rounds: bool = False
    """The algorithm exchanges at round ends (merge_unit "round"): those steps' healthy time is estimated apart."""
    round_every: int = 0
    """Every step that is a multiple of this ends a round (0: none by count)."""
    round_ends: frozenset[int] = frozenset()
    """Further steps that ended a round, for every learner (a round closed early)."""
    learner_round_ends: dict[int, frozenset[int]] = field(default_factory=dict)
    """learner -> its steps that carried an exchange (torchft_diloco: its fragment syncs)."""

    @property
    def times(self) -> list[float]:
        """Every advance's time: what uptime and the longest gap read."""
        return [a.t for a in self.advances]

    def round_end(self, learner: int, step: int) -> bool:
        """Whether the learner's `step` carried a round's exchange."""
        return self.rounds and ((self.round_every > 0 and step % self.round_every == 0) or step in self.round_ends
                                or step in self.learner_round_ends.get(learner, ()))


def _builtin(evs: Sequence[Event], alg: algorithms.Algorithm, fragments: int, sync_every: int,
             cover_steps: bool = True) -> Progress:
    """Each `merge` event is an advance; its coverage by merge unit (a fragment's step ranges, a round, a step),
    unless not `cover_steps` (then a merge need not carry its step or round)."""
    merges = [e for e in evs if isinstance(e, Merge)]
    advances = []
    for e in merges:
        div = fragments if alg.fragmented and e.base_versions is not None else 1
        tokens = tuple(e.c_tokens[i] / div for i in range(min(len(e.participants), len(e.c_tokens))))
        advances.append(Advance(e.t, tuple(e.participants), tokens, shard_of(e.proc), e.tokens_merged))
    unit = alg.merge_unit
    cover: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for e in merges if cover_steps else ():
        if unit == "fragment":
            for m, (a, b) in zip(e.participants, e.step_ranges or [], strict=False):
                for s in range(int(a), int(b) + 1):
                    cover[m][s] += 1.0 / fragments
        elif unit == "step":
            if e.step is None:
                raise ValueError(f"a {alg.name} merge without its step: {e}")
            for m in e.participants:
                cover[m][e.step] = 1.0
        else:
            if e.round is None or e.step is None:
                raise ValueError(f"a {alg.name} merge without its round and step: {e}")
            r = e.round
            for m in e.participants:
                for s in range((r - 1) * sync_every + 1, min(r * sync_every, e.step) + 1):
                    cover[m][s] = 1.0
    rounds = unit == "round"
    ends = frozenset(e.step for e in merges if e.round is not None and e.step is not None)
    return Progress(tuple(advances), cover, rounds, sync_every if rounds else 0, ends)


def _torchft(evs: Sequence[Event], alg: algorithms.Algorithm, fragments: int, sync_every: int,
             cover_steps: bool = True) -> Progress:
    """Each manager step committed in a quorum is an advance (module docstring); rank 0's record speaks for its
    group (every rank of a group commits the same steps)."""
    window, share = (1, 1.0) if alg.data_parallel else (sync_every, 1.0 / max(1, fragments))
    step_tokens: dict[int, dict[int, int]] = defaultdict(dict)
    for e in evs:
        if isinstance(e, Step):
            step_tokens[e.learner][e.step] = e.tokens
    cover: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    synced: dict[int, set[int]] = defaultdict(set)
    by_key: dict[tuple[int, int], list[tuple[float, int, float]]] = {}  # (quorum, step) -> (t, learner, tokens)
    for e in evs:
        if not isinstance(e, TorchftSync) or e.rank != 0:
            continue
        synced[e.learner].add(e.inner_step)
        if not e.committed:
            continue
        steps = range(e.inner_step - window + 1, e.inner_step + 1)
        for s in steps:
            cover[e.learner][s] = min(1.0, cover[e.learner][s] + share)
        tokens = sum(step_tokens[e.learner].get(s, 0) for s in steps) * share
        by_key.setdefault((e.quorum_id, e.step), []).append((e.t, e.learner, tokens))
    advances = []
    total = 0.0
    for _, commits in sorted(by_key.items(), key=lambda kv: min(c[0] for c in kv[1])):
        commits.sort(key=lambda c: c[1])
        total += sum(c[2] for c in commits)
        advances.append(Advance(min(c[0] for c in commits), tuple(c[1] for c in commits),
                                tuple(c[2] for c in commits), 0, total))
    rounds = alg.merge_unit == "round"
    return Progress(tuple(advances), cover, rounds,
                    learner_round_ends={m: frozenset(xs) for m, xs in synced.items()} if rounds else {})


READERS: dict[algorithms.System, Callable[[Sequence[Event], algorithms.Algorithm, int, int, bool], Progress]] = {
    "builtin": _builtin, "torchft": _torchft}
"""How each system's history says the global model advanced; any other target's (a plugin's) is read as the
builtin one's, from the `merge` records it writes for each change of its global model (docs/targets.md)."""


def progress(evs: Sequence[Event], algorithm: str, fragments: int, sync_every: int) -> Progress:
    """The run's progress of the global model, read by the reader of the system that ran `algorithm`."""
    alg = algorithms.get(algorithm)
    return READERS.get(alg.system, _builtin)(evs, alg, fragments, sync_every, True)


def advance_times(evs: Sequence[Event], algorithm: str) -> list[float]:
    """When the global model advanced (what uptime, the longest gap and no_global_downtime read): the times of
    `progress`'s advances, without the per-step coverage."""
    alg = algorithms.get(algorithm)
    return READERS.get(alg.system, _builtin)(evs, alg, 1, 1, False).times
