"""diloco_chaos/harness/learner/link_process.py's pieces: the whole-frame check on a local socket, and a link process
that died."""

from __future__ import annotations

import socket

import pytest
import torch

from diloco_chaos.harness.wire.framing import Message, MsgType, encode, frame_waiting

SHAPES = {"a": torch.Size([2, 3]), "b": torch.Size([4])}


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


def test_link_process_gone_is_fatal_at_once(tmp_path) -> None:
    """A LinkProcess whose child died: its waits return at once (no spinning to the deadline) and a push is
    refused with LinkFatal naming the cause."""
    import time

    from diloco_chaos.harness.config.sections import Timeouts
    from diloco_chaos.harness.learner.link_process import LinkProcess
    from diloco_chaos.harness.learner.syncer_link import LinkFatal
    from diloco_chaos.trainers.messages import FragmentPush

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
