"""Helpers shared by the protocol invariants' modules (not an invariant: modules starting with _ are skipped)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from diloco_chaos.harness.invariants.base import InvariantResult, RunRecord
from diloco_chaos.harness.record.learner import Apply, FragmentOverwritten, InitialPull
from diloco_chaos.harness.record.syncer import Merge, SyncerRestore

PushKey = tuple[int, int, int, int]
"""(learner, fragment, first_step, last_step): a push's identity in both the learner's and the syncer's log."""


def _diloco(r: RunRecord, key: str, default: Any) -> Any:
    return r.config.get("diloco", {}).get(key, default)


def _listing(problems: list[str], show: int) -> str:
    return "; ".join(problems[:show]) + (f"; and {len(problems) - show} more" if len(problems) > show else "")


def _no_merges(name: str, bound: float, measure: str, unit: str = "") -> InvariantResult:
    return InvariantResult(name, False, None, bound, "no merge was logged: nothing to check", measure, unit)



@dataclass(frozen=True)
class Overwrite:
    """diloco.broadcast = all: one apply of a merge its learner was not in (`Merge.overwrites`), with the steps
    it discarded as the log shows them, and the learner's `fragment_overwritten` record of it (None: missing)."""

    learner: int
    fragment: int
    version: int
    step: int
    first: int
    """The first step discarded: after the learner's previous apply of the fragment (or its restart's initial
    pull), and after the last step of a merge of its own whose value a newer one replaced before it applied it."""
    record: FragmentOverwritten | None


def unlogged_merges(r: RunRecord) -> list[tuple[int, int]]:
    """(fragment, version) of each merge a killed syncer made and checkpointed but never logged: the versions a
    restored syncer came back at above the newest merge of that fragment logged before the restore (once per
    restore that shows them)."""
    out: list[tuple[int, int]] = []
    for rest in r.records(SyncerRestore):
        for p, v in enumerate(rest.versions):
            logged = max((int(e.version) for e in r.records(Merge) if e.fragment == p and e.t < rest.t), default=0)
            out += [(p, x) for x in range(logged + 1, int(v) + 1)]
    return out


def overwrites(r: RunRecord) -> tuple[list[Overwrite], list[FragmentOverwritten]]:
    """Every apply of a merge its learner was not in that discarded steps, and the `fragment_overwritten`
    records no such apply accounts for. The merge says whom it was sent to (`Merge.overwrites`); a merge the
    syncer sent but never logged (killed between its broadcast and its `merge` record, and restored at that
    version or later from its checkpoint) is known by the learner's `apply` alone, which flags it `broadcast`.
    Where the apply carries that flag, an unflagged value is no overwrite even if the merge lists the learner:
    the broadcast died with the syncer and the learner took the same version as the restored syncer's welcome
    (seen: learner 1 applied fragment 3 v7 at step 57, after the restore, as a join value)."""
    sent = {(int(e.fragment), int(e.version)): set(e.overwrites) for e in r.records(Merge)
            if e.overwrites and e.fragment is not None}
    unlogged = set(unlogged_merges(r))
    merged: dict[tuple[int, int], list[int]] = defaultdict(list)  # (learner, fragment) -> merged last steps
    for e in r.records(Merge):
        for m, (_, b) in zip(e.participants, e.step_ranges or [], strict=False):
            merged[(int(m), int(e.fragment or 0))].append(int(b))
    records: dict[tuple[int, int, int], list[FragmentOverwritten]] = defaultdict(list)
    for o in r.records(FragmentOverwritten):
        records[(o.learner, o.fragment, o.step)].append(o)
    start: dict[tuple[int, int], int] = {}  # (learner, fragment) -> first step of its counter period
    out: list[Overwrite] = []
    for x in r.all_records:
        if isinstance(x, InitialPull):
            for p in range(x.of):
                start[(x.learner, p)] = x.step + 1
        elif isinstance(x, Apply) and x.fragments:
            for i, (p, v) in enumerate(zip(x.fragments, x.versions or [], strict=False)):
                lo = start.get((x.learner, p), 1)
                start[(x.learner, p)] = x.step + 1
                if x.broadcast is not None:  # the learner says which values were broadcasts: it alone knows
                    overwrote = x.was_broadcast(i) and (x.learner in sent.get((p, v), ()) or (p, v) in unlogged)
                else:  # an older log: the merge's recipients
                    overwrote = x.learner in sent.get((p, v), ())
                if not overwrote:
                    continue
                lo = max([lo] + [b + 1 for b in merged[(x.learner, p)] if lo <= b <= x.step])
                if lo > x.step:
                    continue
                got = records.get((x.learner, p, x.step))
                out.append(Overwrite(x.learner, p, v, x.step, lo, got.pop(0) if got else None))
    return out, [o for left in records.values() for o in left]
