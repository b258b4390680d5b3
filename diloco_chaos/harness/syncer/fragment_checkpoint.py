"""The syncer's crash-safe checkpoint: per fragment, two slot files rewritten in place, each holding one frame.

Why: the syncer writes every merged fragment before it broadcasts it (so no learner ever holds a version a
restarted syncer could lose), once per merge and on the merge path. Writing it with `torch.save` to a new
temporary file renamed over the old one cost the syncer about 1.7 ms of CPU per merge (P = H = 8 and one
learner: a merge per step, 40% of the syncer's CPU, on a core it shares with the chips), and a new inode per
merge for the file system's journal. Here fragment p has two files, `fragment-<p>.slot0` and `.slot1`, open for
the syncer's life; version v of p overwrites slot `v % 2` in place with one `pwrite`, as one frame of the wire
format (`diloco_chaos/harness/wire/framing.py`: magic, payload length, CRC-32; type FRAGMENT_STATE). A frame is never
written over the newest version: a crash in the middle of a write tears only the slot being written, which then fails
its checks, while the other slot still holds version v - 1, the newest any learner can have been sent. `load`
takes, per fragment, the newest slot that passes every check, and reports the slots it rejected.

`durable` adds an `fdatasync` of the slot after each write (and of the directory when a slot file is created),
so the checkpoint also survives the machine losing power; without it, it survives the process (the page cache
outlives it), which is what a syncer crash is.

A state is a dict of JSON values and of dicts of tensors (`DecoupledSyncer.fragment_state`): each tensor dict is
stored under its key as tensors named `<key>/<name>`.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import torch

from diloco_chaos.harness.wire.framing import FrameError, Message, MsgType, decode_frame, encode
from diloco_chaos.trainers import mutations

SLOTS = 2
_NAME = re.compile(r"fragment-(\d+)\.slot([01])$")
_GROUPS_KEY = "tensor_groups"
"""Meta key listing the state's keys that hold tensor dicts."""


def slot_path(directory: str, p: int, slot: int) -> str:
    return os.path.join(directory, f"fragment-{p}.slot{slot}")


def state_to_message(state: dict[str, Any]) -> Message:
    # an empty dict counts as a tensor group: it comes back as the same empty dict either way
    groups = [k for k, v in state.items() if isinstance(v, dict) and all(isinstance(t, torch.Tensor)
                                                                         for t in v.values())]
    meta = {k: v for k, v in state.items() if k not in groups}
    meta[_GROUPS_KEY] = groups
    tensors = {f"{k}/{n}": t for k in groups for n, t in state[k].items()}
    return Message(MsgType.FRAGMENT_STATE, meta, tensors)


def message_to_state(msg: Message) -> dict[str, Any]:
    if msg.type is not MsgType.FRAGMENT_STATE:
        raise ValueError(f"a checkpoint slot holds a {msg.type.name} frame, not FRAGMENT_STATE")
    state = dict(msg.meta)
    groups = state.pop(_GROUPS_KEY, [])
    for k in groups:
        state[k] = {}
    for full, t in msg.tensors.items():
        k, _, n = full.partition("/")
        if k not in state or not isinstance(state[k], dict):
            raise ValueError(f"checkpoint tensor {full!r} is in no listed group {groups}")
        state[k][n] = t
    return state


class FragmentCheckpoints:
    """The slot files of one run's syncer checkpoint (one directory)."""

    def __init__(self, directory: str, durable: bool = False) -> None:
        self.directory = directory
        self.durable = durable
        self._fds: dict[tuple[int, int], int] = {}
        self.bytes_written = 0
        os.makedirs(directory, exist_ok=True)

    def write(self, p: int, version: int, state: dict[str, Any]) -> int:
        """Write fragment p's state at `version` into slot version % 2 (never the slot of version - 1).
        Returns the frame's size."""
        frame = encode(state_to_message({**state, "fragment": p, "version": version}))
        fd = self._fd(p, version % SLOTS)
        done = 0
        while done < len(frame):  # pwrite may write less than asked (a signal, a full disk): write the rest
            done += os.pwrite(fd, memoryview(frame)[done:], done)
        if self.durable:
            os.fdatasync(fd)
        self.bytes_written += len(frame)
        return len(frame)

    def _fd(self, p: int, slot: int) -> int:
        fd = self._fds.get((p, slot))
        if fd is None:
            path = slot_path(self.directory, p, slot)
            created = not os.path.exists(path)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self._fds[(p, slot)] = fd
            if created and self.durable:  # the new file's directory entry must survive a power loss too
                dfd = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        return fd

    def load(self, max_frame_bytes: int) -> tuple[list[dict[str, Any]], list[str]]:
        """Per fragment, the newest slot's state that passes every check; and one line per rejected slot
        ("<file>: <why>"). A fragment whose slots are all rejected is left out (it restarts from its initial
        value, which loses nothing: it can only happen if its first merge's write was torn, before any
        learner was sent that merge)."""
        best: dict[int, dict[str, Any]] = {}
        rejected: list[str] = []
        for path in sorted(glob.glob(os.path.join(self.directory, "fragment-*.slot*"))):
            m = _NAME.search(path)
            if m is None:
                continue
            p = int(m.group(1))
            try:
                with open(path, "rb") as f:
                    state = message_to_state(decode_frame(f.read(), max_frame_bytes))
                if int(state["fragment"]) != p:
                    raise ValueError(f"holds fragment {state['fragment']}, not {p}")
            except (FrameError, ValueError, KeyError) as e:
                rejected.append(f"{os.path.basename(path)}: {type(e).__name__}: {e}")
                continue
            newer = p not in best or int(state["version"]) > int(best[p]["version"])
            if mutations.active("restore_older_slot") and p in best:  # mutation: the older valid slot is kept
                newer = not newer
            if newer:
                best[p] = state
        return [best[p] for p in sorted(best)], rejected

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
