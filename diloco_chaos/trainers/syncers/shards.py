"""Which synchronizer shard owns which fragment: a pure, deterministic assignment balanced by size.

Why: in the paper the synchronizer is sharded across CPU hosts; each shard owns some of the P fragments (their
global values, versions, outer momentum and rounds) and nothing else, so losing one shard stops only its
fragments' merges. The learners and every shard compute the same assignment independently, like the partition
(diloco_chaos/trainers/fragments.py), so nothing about it travels on the wire.

The assignment is greedy LPT bin-packing over the fragments' element counts: fragments are taken largest first
(ties: lower fragment index first) and each goes to the shard with the fewest elements so far (ties: lower shard
index). Its largest shard holds at most the mean load plus the largest fragment (each fragment went to the
lightest shard at the time, which was at or below the mean), and with S = 1 every fragment is shard 0's.
"""

from __future__ import annotations

from collections.abc import Sequence


def assign_shards(sizes: Sequence[int], shards: int) -> list[int]:
    """The owning shard of each fragment (index = fragment), LPT-balanced by `sizes` (elements per fragment).

    Raises ValueError if `shards` is not in [1, len(sizes)] (a shard would own nothing) or a size is negative.
    """
    if shards < 1 or shards > len(sizes):
        raise ValueError(f"shards = {shards}: must be in [1, {len(sizes)}] (fragments: a shard would own nothing)")
    if any(s < 0 for s in sizes):
        raise ValueError(f"fragment sizes must be >= 0, got {list(sizes)}")
    load = [0] * shards
    owner = [0] * len(sizes)
    for p in sorted(range(len(sizes)), key=lambda q: (-sizes[q], q)):
        k = min(range(shards), key=lambda j: (load[j], j))
        owner[p] = k
        load[k] += sizes[p]
    return owner


def owned(owner: Sequence[int], shard: int) -> list[int]:
    """The fragments `shard` owns, in fragment order."""
    return [p for p, k in enumerate(owner) if k == shard]


def fragment_sizes(partition: Sequence[Sequence[str]], numel: dict[str, int]) -> list[int]:
    """Elements per fragment of a partition (diloco_chaos/trainers/fragments.py `partition_tensors`)."""
    return [sum(numel[n] for n in names) for names in partition]
