"""Tests for diloco_chaos.harness.syncer.fragment_checkpoint: the syncer's two-slot, checksummed, in-place checkpoint
files.

The states come from a real DecoupledSyncer that merged; a torn write is made the way a crash makes one
(the slot's frame cut short, or its bytes changed), and a restore must come back to the version before it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from diloco_chaos.harness.syncer.fragment_checkpoint import FragmentCheckpoints, slot_path
from diloco_chaos.trainers.config import DilocoConfig
from diloco_chaos.trainers.messages import FragmentPush
from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.syncers.decoupled import DecoupledSyncer

MODEL = ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32)
MAX_FRAME = 1 << 24


def syncer() -> DecoupledSyncer:
    cfg = DilocoConfig(fragments=4, sync_every=4, overlap=2, min_quorum=1)
    return DecoupledSyncer(MODEL, cfg, seed=3, num_learners=1)


def merge(s: DecoupledSyncer, p: int, step: int, now: float) -> None:
    """Learner 0 reports `step` (fragment p is due there) and answers p's pull with a shifted copy; merge."""
    rid = next(q.round_id for q in s.on_meta(0, step, 0.01, now, frozenset({0})) if q.fragment == p)
    tensors = {n: t.clone() + 0.01 * step for n, t in s.fragment(p).items()}
    s.on_push(FragmentPush(0, p, s.versions[p], 4, 64, step - 3, step, 0.01, tensors), rid, now)
    (rec,) = s.poll(now + 1.0, frozenset({0}))[0]
    assert rec.fragment == p


def test_write_then_load_restores_the_newest_version_of_every_fragment(tmp_path: Path) -> None:
    s = syncer()
    slots = FragmentCheckpoints(str(tmp_path))
    for step in (1, 5, 9):  # fragment 1 merges three times (versions 1, 2, 3); fragment 2 once
        merge(s, 1, step, float(step))
        slots.write(1, s.versions[1], s.fragment_state(1))
    merge(s, 2, 10, 10.0)
    slots.write(2, s.versions[2], s.fragment_state(2))
    slots.close()
    assert sorted(os.listdir(tmp_path)) == ["fragment-1.slot0", "fragment-1.slot1", "fragment-2.slot1"]

    states, rejected = FragmentCheckpoints(str(tmp_path)).load(MAX_FRAME)
    assert rejected == []
    assert [(st["fragment"], st["version"]) for st in states] == [(1, 3), (2, 1)]
    fresh = syncer()
    fresh.restore(states)
    assert fresh.versions == s.versions and fresh.clock == s.clock
    assert fresh.reported_step == s.reported_step and fresh.merged_into == s.merged_into
    for n, t in s.params.items():
        assert_close(fresh.params[n], t)
    assert_close(fresh.outer.buffers("frag1"), s.outer.buffers("frag1"))


@pytest.mark.parametrize("tear", ["truncated", "flipped"])
def test_a_torn_newest_slot_is_rejected_and_the_version_before_it_restored(tmp_path: Path, tear: str) -> None:
    s = syncer()
    slots = FragmentCheckpoints(str(tmp_path))
    merge(s, 1, 1, 1.0)
    slots.write(1, 1, s.fragment_state(1))
    v1 = {n: t.clone() for n, t in s.fragment(1).items()}
    merge(s, 1, 5, 5.0)
    slots.write(1, 2, s.fragment_state(1))
    slots.close()
    newest = slot_path(str(tmp_path), 1, 0)  # version 2 went to slot 2 % 2
    data = bytearray(Path(newest).read_bytes())
    if tear == "truncated":  # the crash cut the write short
        Path(newest).write_bytes(data[: len(data) // 2])
    else:  # or left the old bytes in its middle
        data[len(data) // 2] ^= 0xFF
        Path(newest).write_bytes(data)

    states, rejected = FragmentCheckpoints(str(tmp_path)).load(MAX_FRAME)
    assert len(rejected) == 1 and rejected[0].startswith("fragment-1.slot0: ")
    assert ("Truncated" if tear == "truncated" else "BadChecksum") in rejected[0]
    assert [(st["fragment"], st["version"]) for st in states] == [(1, 1)]
    for n, t in v1.items():
        assert_close(states[0]["params"][n], t)


def test_a_rewrite_never_touches_the_slot_of_the_version_before(tmp_path: Path) -> None:
    """Version v goes to slot v % 2: the slot holding v - 1 keeps its bytes, whatever happens to the write."""
    s = syncer()
    slots = FragmentCheckpoints(str(tmp_path))
    merge(s, 1, 1, 1.0)
    slots.write(1, 1, s.fragment_state(1))
    before = Path(slot_path(str(tmp_path), 1, 1)).read_bytes()
    merge(s, 1, 5, 5.0)
    slots.write(1, 2, s.fragment_state(1))
    assert Path(slot_path(str(tmp_path), 1, 1)).read_bytes() == before
    assert Path(slot_path(str(tmp_path), 1, 0)).read_bytes() != before
    slots.close()


def test_a_shorter_rewrite_in_place_ignores_the_old_tail(tmp_path: Path) -> None:
    slots = FragmentCheckpoints(str(tmp_path), durable=True)
    big = {"fragment": 0, "version": 0, "params": {"w": torch.arange(100.0)}, "note": "x" * 500}
    small = {"fragment": 0, "version": 0, "params": {"w": torch.arange(4.0)}, "note": ""}
    n_big = slots.write(0, 2, big)
    n_small = slots.write(0, 4, small)  # the same slot (4 % 2 == 2 % 2), written over in place
    slots.close()
    assert n_small < n_big and os.path.getsize(slot_path(str(tmp_path), 0, 0)) == n_big
    (state,), rejected = FragmentCheckpoints(str(tmp_path)).load(MAX_FRAME)
    assert rejected == [] and state["version"] == 4
    assert_close(state["params"]["w"], torch.arange(4.0))


def test_a_slot_naming_another_fragment_is_rejected(tmp_path: Path) -> None:
    slots = FragmentCheckpoints(str(tmp_path))
    slots.write(3, 1, {"params": {"w": torch.ones(2)}})
    slots.close()
    os.rename(slot_path(str(tmp_path), 3, 1), slot_path(str(tmp_path), 2, 1))
    states, rejected = FragmentCheckpoints(str(tmp_path)).load(MAX_FRAME)
    assert states == [] and len(rejected) == 1 and "holds fragment 3, not 2" in rejected[0]
