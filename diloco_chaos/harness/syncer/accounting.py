"""The syncer's accounting and persistence: tokens merged, per-fragment crash-safe slots, the final checkpoint.

Crash safety (Decoupled DiLoCo, `recovery.syncer_checkpoint = "every_merge"`): every merged fragment is
written to its slot under `syncer_state/` (diloco_chaos/harness/syncer/fragment_checkpoint.py: two checksummed slots per
fragment, rewritten in place, never over the newest version) *before* it is broadcast, so no learner ever
holds a version the syncer could lose. `Accounting.account` counts and persists a batch of merges in that
order; restoring the slots into the core is the decoupled handler's (diloco_chaos/harness/syncer/decoupled.py).
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable

import torch

from diloco_chaos.harness.run.rundir import atomic_torch_save
from diloco_chaos.harness.syncer.fragment_checkpoint import FragmentCheckpoints
from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.syncers.core import SyncerCore
from diloco_chaos.trainers.syncers.decoupled_records import MergeRecord

STATE_DIR = "syncer_state"
"""Under the run directory: one checkpoint file per fragment (Decoupled DiLoCo)."""


def fragment_digest(tensors: dict[str, torch.Tensor]) -> str:
    """A short content checksum of a fragment (names and bytes, in name order): merge and restore events carry
    it, so a test can check that a restored fragment is exactly the last one broadcast. CRC-32, computed on every
    merge: a third of sha256's cost, and an accidental match of two different fragments has odds of 2^-32 (it
    guards against mistakes, not against an adversary)."""
    crc = 0
    for n in sorted(tensors):
        crc = zlib.crc32(n.encode(), crc)
        crc = zlib.crc32(tensors[n].detach().contiguous().numpy().data.cast("B"), crc)
    return f"{crc:08x}"


class Accounting:
    """Tokens merged (in all and per fragment), the crash-safe slots if on, and checkpoint timings."""

    def __init__(self, run_dir: str, fragments: int, persist: bool, fsync: bool, state_dir: str = STATE_DIR) -> None:
        self.run_dir = run_dir
        self.state_dir = state_dir
        """Where the slots are, under the run directory (a shard's own: diloco_chaos/harness/syncer/shards.py)."""
        self.frag_tokens = [0.0] * fragments
        self.tokens_merged = 0.0
        self.slots = FragmentCheckpoints(os.path.join(run_dir, state_dir), fsync) if persist else None
        self.checkpoints = 0
        self.checkpoint_s = 0.0

    def account(self, recs: list[MergeRecord], fragment_state: Callable[[int], dict]) -> list[tuple[float, float]]:
        """Count the merges' tokens and, if crash safety is on, persist them: all before any broadcast.
        Returns, per merge, (its tokens, the tokens merged up to and including it)."""
        counted = []
        for rec in recs:
            tokens = sum(rec.c_tokens) / len(self.frag_tokens)
            self.frag_tokens[rec.fragment] += tokens
            self.tokens_merged += tokens
            counted.append((tokens, self.tokens_merged))
        if recs and self.slots is not None:
            self._persist(recs, fragment_state)
        return counted

    def _persist(self, recs: list[MergeRecord], fragment_state: Callable[[int], dict]) -> None:
        """Write the merged fragments' state into their checkpoint slots before anyone is told of them."""
        assert self.slots is not None
        t0 = time.monotonic()
        for p in sorted({r.fragment for r in recs}):
            st = fragment_state(p)
            st["tokens_merged"] = self.frag_tokens[p]
            self.slots.write(p, int(st["version"]), st)
        self.checkpoint_s += time.monotonic() - t0
        self.checkpoints += 1

    def load(self, max_frame: int) -> tuple[list[dict], list[str]]:
        """The newest valid slot of every fragment, and why any slot was rejected; restores the token counts."""
        states, rejected = FragmentCheckpoints(os.path.join(self.run_dir, self.state_dir)).load(max_frame)
        for st in states:
            if mutations.active("restore_tokens_reset"):  # mutation: the checkpointed count is not restored
                continue
            self.frag_tokens[int(st["fragment"])] = float(st["tokens_merged"])
        self.tokens_merged = sum(self.frag_tokens)
        return states, rejected

    def add_tokens(self, tokens: float) -> None:
        self.tokens_merged += tokens

    def save_checkpoint(self, name: str, core: SyncerCore, algorithm: str) -> str:
        """The final global model (and the core's own extra fields) as `name` under the run directory."""
        path = os.path.join(self.run_dir, name)
        state: dict[str, object] = {"params": core.params, "merges": core.merges, "algorithm": algorithm,
                                    "tokens_merged": self.tokens_merged}
        state.update(core.checkpoint_state())
        atomic_torch_save(state, path)
        return path

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
