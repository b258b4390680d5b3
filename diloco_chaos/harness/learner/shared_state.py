"""What the learner host's training process and its link process share in memory, without a system call
on the training process's side of a step.

Why: the training process's side of the link is the only part of the harness inside a chip's step, so what it
does per step is the harness's overhead in the first place. A merged fragment delivered as a frame on the local
socket cost the training loop 0.37 ms a step (select, a 68 KB receive, CRC, JSON, copies; 3% of a 13 ms step,
P = H = 8); read from shared memory it is one copy. All three structures live in anonymous shared mappings
(or an eventfd) made before the fork, so both processes see them:

* `SharedSnapshot` (training -> link): the latest snapshot of the replica and the fragment counters, from which
  the link process answers the syncer's pulls at once. Two slots; the writer fills the one not being read.
* `SharedInbox` (link -> training): per fragment, the newest merged value the syncer sent, with its version
  and the step it was pulled at. The training loop checks one counter per step and copies out what is new.
* `Doorbell`: an eventfd one side rings after writing, so that the other side can *wait* (a select with a
  timeout) instead of polling: the link process waits on the training process's bell for new snapshots
  (it sends the step's META then), the training process on the link's bell only where it blocks for a
  fragment (a rejoining learner's first pull). Ringing never blocks: the eventfd only counts.

Every region is guarded by a sequence number (a seqlock): odd while its writer writes it, so a reader copies
only what did not change under it and otherwise retries. The stores are ordered as written on x86-64 (TSO),
which this relies on; a weakly ordered CPU would need fences around the sequence numbers.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import Any

import torch
from torch import Tensor

from diloco_chaos.trainers.messages import FragmentPush, MergedFragment, Snapshot

_INT64 = struct.Struct("=q")
SNAPSHOT_RETRIES = 1000
"""Copies of a fragment the link process tries before giving up on a slot that keeps changing under it."""


class SharedSnapshot:
    """The host's latest snapshot in shared memory: written by the training process, read by the link process.

    Duck-types `diloco_chaos.trainers.messages.Snapshot` for `SyncerLink` (`learner`, `step`, `step_time_s`,
    `push_for`)."""

    def __init__(self, learner: int, shapes: dict[str, torch.Size], fragments: int) -> None:
        self.learner = learner
        numel = [int(torch.Size(s).numel()) for s in shapes.values()]
        n_params = sum(numel)
        self._head = struct.Struct(f"={1 + 4 * fragments}qd")
        """A slot's header: step, then (version, c_steps, c_tokens, first_step) per fragment, then the step time
        (float64), no padding; the parameters follow it."""
        slot_bytes = self._head.size + 4 * n_params
        slot_bytes += -slot_bytes % 64
        self._mm = mmap.mmap(-1, 64 + 2 * slot_bytes)  # anonymous and shared: the fork child sees our writes
        self._pulled = mmap.mmap(-1, max(8, 8 * fragments))
        """Per fragment, the step of the snapshot the link last answered a pull from (-1: none); written by the
        link process, read by the training process (diloco.apply_wait = block waits on it)."""
        for p in range(fragments):
            _INT64.pack_into(self._pulled, 8 * p, -1)
        self._set_word(0, -1)  # control words (_word): latest slot (-1: none yet), then each slot's sequence
        self._base = [64 + slot * slot_bytes for slot in range(2)]
        self._views = []
        for base in self._base:
            flat = torch.frombuffer(self._mm, dtype=torch.float32, count=n_params, offset=base + self._head.size)
            self._views.append({n: v.view(s) for n, v, s in zip(shapes, flat.split(numel), shapes.values(),
                                                                   strict=True)})

    # -- the training process --------------------------------------------------------------------
    def _word(self, i: int) -> int:
        """Control word i: 0 the latest complete slot, 1 + s the sequence of slot s (odd while it is written)."""
        return int(_INT64.unpack_from(self._mm, 8 * i)[0])

    def _set_word(self, i: int, value: int) -> None:
        _INT64.pack_into(self._mm, 8 * i, value)

    def write(self, snap: Snapshot) -> None:
        """Copy a step's snapshot into the slot that is not the latest, then make it the latest.

        The control words and the header are packed with struct (a torch element write costs ~10 us, and
        this runs every step); the tensors are copied in one foreach call."""
        slot = 1 if self._word(0) == 0 else 0
        seq = self._word(1 + slot) + 1
        self._set_word(1 + slot, seq)  # odd: mid-write
        self._head.pack_into(self._mm, self._base[slot], snap.step, *[c for cs in snap.counters for c in cs],
                             snap.step_time_s)
        views = self._views[slot]
        with torch.no_grad():
            torch._foreach_copy_([views[n] for n in snap.tensors], list(snap.tensors.values()))
        self._set_word(1 + slot, seq + 1)
        self._set_word(0, slot)

    # -- the link process ------------------------------------------------------------------------
    def _latest_head(self) -> tuple[Any, ...] | None:
        latest = self._word(0)
        return self._head.unpack_from(self._mm, self._base[latest]) if latest >= 0 else None

    def pulled_step(self, p: int) -> int | None:
        """The training process: the step of the snapshot fragment p was last pulled from (None: never)."""
        step = int(_INT64.unpack_from(self._pulled, 8 * p)[0])
        return None if step < 0 else step

    @property
    def step(self) -> int:
        head = self._latest_head()
        return int(head[0]) if head is not None else 0

    @property
    def step_time_s(self) -> float:
        head = self._latest_head()
        return float(head[-1]) if head is not None else 0.0

    def push_for(self, p: int, names: list[str], final: bool = False) -> FragmentPush:
        """Fragment p of the newest complete snapshot, copied out (as `Snapshot.push_for`)."""
        for _ in range(SNAPSHOT_RETRIES):
            slot = self._word(0)
            seq = self._word(1 + slot)
            if seq % 2:
                continue
            head = self._head.unpack_from(self._mm, self._base[slot])
            version, c_steps, c_tokens, first = head[1 + 4 * p: 5 + 4 * p]
            tensors = {n: self._views[slot][n].clone() for n in names} if c_steps > 0 else {}
            if self._word(1 + slot) == seq:
                if c_steps > 0 and not final:  # a pull answered with work: the training process may wait for it
                    _INT64.pack_into(self._pulled, 8 * p, head[0])
                return FragmentPush(learner=self.learner, fragment=p, base_version=version, c_steps=c_steps,
                                    c_tokens=c_tokens, first_step=first, last_step=head[0], step_time_s=head[-1],
                                    tensors=tensors, final=final)
        raise RuntimeError(f"snapshot slot kept changing during {SNAPSHOT_RETRIES} copies of fragment {p}")


class SharedInbox:
    """The newest merged value of each fragment, written by the link process, read by the training process.

    One region per fragment (sequence number, version, pulled step, then the fragment's tensors in partition
    order) and one arrivals counter. A newer version of a fragment overwrites the older one in place, which is
    what the training loop would do with it anyway (a newer version supersedes a pending one). One writer
    (the link's reader thread) and one reader (the training loop)."""

    _HEAD = struct.Struct("=qqqqq")  # sequence (odd while written), version, pulled step (-1: none), broadcast,
    # merged step (-1: none)

    def __init__(self, shapes: dict[str, torch.Size], partition: list[list[str]]) -> None:
        self.partition = partition
        self._shapes = {n: torch.Size(s) for n, s in shapes.items()}
        sizes = [sum(self._shapes[n].numel() for n in names) for names in partition]
        self._base: list[int] = []
        offset = 64  # word 0: arrivals (fragment values written so far)
        for n_params in sizes:
            self._base.append(offset)
            offset += self._HEAD.size + 4 * n_params
            offset += -offset % 64
        self._mm = mmap.mmap(-1, offset)
        self._views: list[list[Tensor]] = []
        for base, names, n_params in zip(self._base, partition, sizes, strict=True):
            flat = torch.frombuffer(self._mm, dtype=torch.float32, count=n_params, offset=base + self._HEAD.size) \
                if n_params else torch.empty(0)
            parts = flat.split([self._shapes[n].numel() for n in names])
            self._views.append([v.view(self._shapes[n]) for v, n in zip(parts, names, strict=True)])
        self._seen_arrivals = 0
        self._taken = [0] * len(partition)
        """Reader side: the version of each fragment already taken."""

    # -- the link process --------------------------------------------------------------------------
    def put(self, merged: MergedFragment) -> None:
        """Make `merged` fragment's newest value. Raises ValueError (writing nothing) if its tensors are not
        exactly the fragment's, with their shapes."""
        p = merged.fragment
        if not 0 <= p < len(self.partition):
            raise ValueError(f"fragment {p} is not one of the {len(self.partition)}")
        names = self.partition[p]
        if set(merged.tensors) != set(names):
            raise ValueError(f"fragment {p}: tensors {sorted(merged.tensors)}, expected {sorted(names)}")
        for n in names:
            if merged.tensors[n].shape != self._shapes[n]:
                raise ValueError(f"fragment {p}: {n} has shape {tuple(merged.tensors[n].shape)}, "
                                 f"expected {tuple(self._shapes[n])}")
        base = self._base[p]
        seq, version, _, was_broadcast, _ = (int(x) for x in self._HEAD.unpack_from(self._mm, base))
        if seq and was_broadcast and version == merged.version:  # its welcome after its broadcast: keep the flag
            return
        seq += 1
        _INT64.pack_into(self._mm, base, seq)  # odd: mid-write
        self._HEAD.pack_into(self._mm, base, seq, merged.version,
                             -1 if merged.pulled_step is None else merged.pulled_step, int(merged.broadcast),
                             merged.merged_step)
        with torch.no_grad():
            torch._foreach_copy_(self._views[p], [merged.tensors[n].float() for n in names])
        _INT64.pack_into(self._mm, base, seq + 1)
        _INT64.pack_into(self._mm, 0, int(_INT64.unpack_from(self._mm, 0)[0]) + 1)

    # -- the training process ----------------------------------------------------------------------
    def take(self) -> list[MergedFragment]:
        """The fragments with a version newer than the last taken, copied out; [] at the cost of one memory
        read when nothing arrived since the last call. A region mid-write is left for the next call."""
        arrivals = int(_INT64.unpack_from(self._mm, 0)[0])
        if arrivals == self._seen_arrivals:
            return []
        out: list[MergedFragment] = []
        complete = True
        for p, base in enumerate(self._base):
            seq, version, pulled, broadcast, merged_step = self._HEAD.unpack_from(self._mm, base)
            if seq % 2:
                complete = False
                continue
            if version <= self._taken[p]:
                continue
            tensors = [v.clone() for v in self._views[p]]
            if int(_INT64.unpack_from(self._mm, base)[0]) != seq:  # rewritten while we copied: next call
                complete = False
                continue
            self._taken[p] = version
            out.append(MergedFragment(fragment=p, version=version,
                                      tensors=dict(zip(self.partition[p], tensors, strict=True)),
                                      pulled_step=None if pulled < 0 else pulled, broadcast=bool(broadcast),
                                      merged_step=merged_step))
        if complete:
            self._seen_arrivals = arrivals
        return out


class Doorbell:
    """An eventfd: `ring` (never blocks) after writing shared memory; the other side waits on `fileno` with
    select and `clear`s it before looking."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self._fd

    def ring(self) -> None:
        os.eventfd_write(self._fd, 1)

    def clear(self) -> None:
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:  # nobody rang
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
