"""Matching `fragment_overwritten` records to the applies of merges their learner was not in (broadcast = all),
on hand-built logs: a merge the killed syncer sent but never logged is known from the learner's apply, flagged
`broadcast`, when the restored syncer came back at that version; the same record without that restore is an
orphan. Seen in CI: a syncer killed between a merge's broadcast and its `merge` record made updates_accounted
fail with "fragment_overwritten ... matches no apply of a merge it was not in"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import complete

from diloco_chaos.harness.invariants import load_run
from diloco_chaos.harness.invariants.checks._common import overwrites
from tests.invariants.test_invariants import P, config, ev, write_run
from tests.invariants.test_work_kept import merge, steps


def log(tmp_path: Path, restored_at: int | None, name: str) -> Any:
    """Learner 0 trains steps 1-10, fragment 0's merge of its steps 1-4 is version 1; learner 1's merge of
    fragment 0 (version 2) is broadcast to learner 0, which applies it at step 8 over its steps 5-8, and the
    syncer is killed before logging it; with `restored_at`, the restored syncer comes back at that version."""
    evs = steps(0, 10) + [merge(1.5, 0, 0, 1, 4, 1),
                          ev("syncer_down", 1.75, "supervisor", exitcode=-9, repair_s=0.5),
                          ev("apply", 1.8, "learner0.chip0", learner=0, step=8, fragments=[0], versions=[2],
                             pulled=[None], arrived=[7], broadcast=[True]),
                          ev("fragment_overwritten", 1.8, "learner0.chip0", learner=0, fragment=0, step=8,
                             tokens=512.0, reason="not in the merge of version 2")]
    if restored_at is not None:
        evs.append(ev("syncer_restore", 2.5, fragments=list(range(P)), versions=[restored_at] + [0] * (P - 1),
                      merges=2, clock=3, tokens_merged=0.0))
    return load_run(write_run(tmp_path, complete(sorted(evs, key=lambda e: e["t"])), config(learners=2), name=name))


def test_a_broadcast_the_killed_syncer_never_logged_is_matched_by_the_learners_apply(tmp_path: Path) -> None:
    found, orphans = overwrites(log(tmp_path, 2, "restored"))
    assert orphans == []
    (o,) = found
    assert (o.learner, o.fragment, o.version, o.first, o.step) == (0, 0, 2, 5, 8) and o.record is not None


def test_without_a_restore_at_that_version_the_record_is_an_orphan(tmp_path: Path) -> None:
    for restored, name in ((None, "no-restore"), (1, "restored-older")):
        found, orphans = overwrites(log(tmp_path, restored, name))
        assert found == [] and [(o.learner, o.fragment, o.step) for o in orphans] == [(0, 0, 8)], name


def test_a_logged_broadcast_the_learner_took_as_a_welcome_is_no_overwrite(tmp_path: Path) -> None:
    """The merge lists learner 0 among those it was sent to, but the broadcast died with the syncer: the learner
    applied that version after the restore as the welcome, unflagged, and logged no fragment_overwritten (seen:
    a restore_older_slot unmutated run, learner 1 fragment 3 v7 at step 57). Flagged, the same apply is one."""
    def run(flag: bool, name: str) -> Any:
        evs = steps(0, 10) + [merge(1.5, 0, 0, 1, 4, 1),
                              {**merge(1.6, 1, 0, 1, 4, 2), "overwrites": [0]},
                              ev("apply", 1.8, "learner0.chip0", learner=0, step=8, fragments=[0], versions=[2],
                                 pulled=[None], arrived=[7], broadcast=[flag])]
        return load_run(write_run(tmp_path, complete(sorted(evs, key=lambda e: e["t"])), config(learners=2),
                                  name=name))

    assert overwrites(run(False, "welcome")) == ([], [])
    found, orphans = overwrites(run(True, "broadcast"))
    assert [(o.learner, o.fragment, o.version, o.record) for o in found] == [(0, 0, 2, None)] and orphans == []
