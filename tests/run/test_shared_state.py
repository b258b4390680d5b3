"""diloco_chaos/harness/learner/shared_state.py: the snapshot the training process shares with its link process, the
inbox of merged fragments going the other way, and the doorbell. Real shared mappings, a real fork and a real
eventfd."""

from __future__ import annotations

import multiprocessing as mp
import select

import pytest
import torch

from diloco_chaos.harness.learner.shared_state import Doorbell, SharedInbox, SharedSnapshot
from diloco_chaos.trainers.messages import MergedFragment, Snapshot

SHAPES = {"a": torch.Size([2, 3]), "b": torch.Size([4])}
PARTITION = [["b"], ["a"]]


def snap(step: int, value: float, counters: list[tuple[int, int, int, int]]) -> Snapshot:
    return Snapshot(learner=3, step=step, step_time_s=0.25 * step,
                    tensors={n: torch.full(s, value) for n, s in SHAPES.items()}, counters=counters)


def test_shared_snapshot_serves_the_latest_write_as_a_copy() -> None:
    sh = SharedSnapshot(3, SHAPES, fragments=2)
    assert sh.step == 0 and sh.step_time_s == 0.0  # nothing published yet
    sh.write(snap(1, 1.0, [(0, 1, 10, 1), (0, 1, 10, 1)]))
    sh.write(snap(2, 2.0, [(5, 0, 0, 3), (0, 2, 20, 1)]))
    assert sh.step == 2 and sh.step_time_s == 0.5
    push = sh.push_for(1, ["a"])
    assert (push.learner, push.fragment, push.base_version, push.c_steps, push.c_tokens, push.first_step,
            push.last_step, push.step_time_s, push.final) == (3, 1, 0, 2, 20, 1, 2, 0.5, False)
    assert torch.equal(push.tensors["a"], torch.full((2, 3), 2.0))
    sh.write(snap(3, 3.0, [(5, 1, 10, 3), (0, 3, 30, 1)]))  # a later write leaves the copy alone
    assert torch.equal(push.tensors["a"], torch.full((2, 3), 2.0))
    final = sh.push_for(1, ["b"], final=True)
    assert final.final and final.last_step == 3 and final.tensors["b"].tolist() == [3.0] * 4


def test_shared_snapshot_without_progress_sends_no_tensors() -> None:
    sh = SharedSnapshot(0, SHAPES, fragments=1)
    sh.write(snap(4, 1.0, [(2, 0, 0, 5)]))
    push = sh.push_for(0, ["a", "b"])
    assert push.c_steps == 0 and push.tensors == {} and push.base_version == 2


def test_shared_snapshot_is_shared_with_a_forked_reader() -> None:
    """The link process reads what the training process writes after the fork."""
    sh = SharedSnapshot(0, SHAPES, fragments=1)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    go = ctx.Event()

    def reader() -> None:
        go.wait(10)
        q.put((sh.step, sh.push_for(0, ["b"]).tensors["b"].tolist()))

    p = ctx.Process(target=reader)
    p.start()
    sh.write(snap(7, 7.0, [(0, 7, 70, 1)]))
    go.set()
    assert q.get(timeout=10) == (7, [7.0] * 4)
    p.join(timeout=10)
    assert p.exitcode == 0


def test_shared_snapshot_never_serves_a_slot_mid_write() -> None:
    """A slot whose sequence number is odd is being written: the reader retries and finally says so."""
    sh = SharedSnapshot(0, SHAPES, fragments=1)
    sh.write(snap(1, 1.0, [(0, 1, 10, 1)]))
    seq_word = 1 + sh._word(0)  # the latest slot's sequence
    sh._set_word(seq_word, sh._word(seq_word) + 1)  # as if the training process were writing the latest slot
    with pytest.raises(RuntimeError, match="kept changing"):
        sh.push_for(0, ["a"])
    sh._set_word(seq_word, sh._word(seq_word) + 1)
    assert sh.push_for(0, ["a"]).tensors["a"].tolist() == [[1.0] * 3] * 2


def merged(p: int, version: int, value: float, pulled: int | None = 5) -> MergedFragment:
    return MergedFragment(p, version, {n: torch.full(SHAPES[n], value) for n in PARTITION[p]}, pulled)


def test_inbox_gives_each_new_version_once_as_a_copy() -> None:
    box = SharedInbox(SHAPES, PARTITION)
    assert box.take() == []  # nothing arrived
    box.put(merged(1, 1, 1.0, pulled=7))
    box.put(merged(0, 3, 3.0, pulled=None))
    got = {m.fragment: m for m in box.take()}
    assert sorted(got) == [0, 1]
    assert (got[1].version, got[1].pulled_step) == (1, 7) and (got[0].version, got[0].pulled_step) == (3, None)
    assert torch.equal(got[1].tensors["a"], torch.full((2, 3), 1.0))
    assert box.take() == []  # taken already
    box.put(merged(1, 2, 2.0))
    assert torch.equal(got[1].tensors["a"], torch.full((2, 3), 1.0))  # the copy taken before is ours
    (newer,) = box.take()
    assert (newer.fragment, newer.version) == (1, 2) and newer.tensors["a"].flatten().tolist() == [2.0] * 6
    box.put(merged(1, 2, 9.0))  # the same version again (a resend): nothing new
    assert box.take() == []


def test_inbox_keeps_only_the_newest_value_of_a_fragment() -> None:
    box = SharedInbox(SHAPES, PARTITION)
    box.put(merged(1, 1, 1.0))
    box.put(merged(1, 2, 2.0))  # before the training loop looked: it finds version 2 only
    (m,) = box.take()
    assert (m.version, float(m.tensors["a"][0, 0])) == (2, 2.0)


def test_inbox_leaves_a_region_mid_write_for_the_next_take() -> None:
    box = SharedInbox(SHAPES, PARTITION)
    box.put(merged(0, 1, 1.0))
    base = box._base[0]
    seq, *rest = box._HEAD.unpack_from(box._mm, base)
    box._HEAD.pack_into(box._mm, base, seq + 1, *rest)  # odd: as if the link process were writing it
    assert box.take() == []
    box._HEAD.pack_into(box._mm, base, seq + 2, *rest)  # the write finished
    (m,) = box.take()
    assert (m.fragment, m.version) == (0, 1)


@pytest.mark.parametrize("bad, match", [
    (MergedFragment(2, 1, {}, None), "fragment 2 is not one of the 2"),
    (MergedFragment(1, 1, {"b": torch.ones(4)}, None), "tensors \\['b'\\], expected \\['a'\\]"),
    (MergedFragment(1, 1, {"a": torch.ones(3, 2)}, None), "a has shape \\(3, 2\\), expected \\(2, 3\\)"),
])
def test_inbox_refuses_what_is_not_the_fragment_and_writes_nothing(bad: MergedFragment, match: str) -> None:
    box = SharedInbox(SHAPES, PARTITION)
    with pytest.raises(ValueError, match=match):
        box.put(bad)
    assert box.take() == []


def test_inbox_and_doorbell_across_fork() -> None:
    """The link process (a fork child) puts a fragment and rings; the training process, waiting on the bell
    with a bounded select, takes it."""
    box, bell = SharedInbox(SHAPES, PARTITION), Doorbell()
    ctx = mp.get_context("fork")

    def link() -> None:
        box.put(merged(1, 4, 4.0))
        bell.ring()

    child = ctx.Process(target=link)
    child.start()
    readable, _, _ = select.select([bell], [], [], 10.0)
    assert readable == [bell]
    bell.clear()
    (m,) = box.take()
    assert (m.fragment, m.version) == (1, 4)
    child.join(timeout=10)
    assert child.exitcode == 0
    assert select.select([bell], [], [], 0.0)[0] == []  # cleared: a wait now blocks
    bell.close()


def test_doorbell_counts_rings_and_never_blocks_the_ringer() -> None:
    bell = Doorbell()
    for _ in range(100_000):  # far past a pipe's capacity: an eventfd only counts
        bell.ring()
    assert select.select([bell], [], [], 0.0)[0] == [bell]
    bell.clear()
    bell.clear()  # nothing rang since: no error
    assert select.select([bell], [], [], 0.0)[0] == []
    bell.close()
