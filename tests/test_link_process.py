"""harness/link_process.py's pieces: the shared snapshot's slots and the whole-frame check on a local socket."""

from __future__ import annotations

import socket

import pytest
import torch

from harness.link_process import SharedSnapshot
from harness.wire import Message, MsgType, encode, frame_waiting
from trainers.learner import Snapshot

SHAPES = {"a": torch.Size([2, 3]), "b": torch.Size([4])}


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
    import multiprocessing as mp

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


def test_frame_waiting_only_for_whole_frames() -> None:
    a, b = socket.socketpair()
    try:
        frame = encode(Message(MsgType.FRAGMENT, {"fragment": 1}, {"x": torch.ones(1000)}))
        a.sendall(frame[:100])
        assert not frame_waiting(b)  # header there, payload not
        a.sendall(frame[100:])
        assert frame_waiting(b)
        assert frame_waiting(b)  # peeking consumes nothing
        assert b.recv(len(frame), socket.MSG_WAITALL) == frame
        a.close()
        assert frame_waiting(b)  # closed: reading reports it at once
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("partial", [1, 15])
def test_frame_waiting_on_a_partial_header(partial: int) -> None:
    a, b = socket.socketpair()
    try:
        a.sendall(encode(Message(MsgType.META, {"step": 1}))[:partial])
        assert not frame_waiting(b)
    finally:
        a.close()
        b.close()


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


def test_link_process_gone_is_fatal_at_once(tmp_path) -> None:
    """A LinkProcess whose child died: its waits return at once (no spinning to the deadline) and a push is
    refused with LinkFatal naming the cause."""
    import time

    from harness.link import LinkFatal
    from harness.link_process import LinkProcess
    from harness.scenario import Timeouts
    from trainers.learner import FragmentPush

    link = LinkProcess("127.0.0.1", 9, 0, b"k" * 32, Timeouts(), 1 << 20, str(tmp_path / "events.jsonl"),
                       SHAPES, [["a"], ["b"]]).start()
    try:
        link._proc.kill()
        link._proc.join(timeout=10)
        t0 = time.monotonic()
        assert link.wait_inbox(5.0) is False
        assert link.wait_connected(5.0) is False
        assert time.monotonic() - t0 < 2.0
        assert link.fatal is not None and "link process gone" in link.fatal
        with pytest.raises(LinkFatal):
            link.push(FragmentPush(0, 0, 0, 1, 1, 1, 1, 0.0, {}))
    finally:
        link.close(flush_timeout_s=0.1)
    assert link._proc.exitcode is not None
