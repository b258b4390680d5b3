"""Split a model's tensors into P fragments and decide when each fragment syncs.

Why: Decoupled DiLoCo (like Streaming DiLoCo) never sends the whole model at
once. The parameters are cut into P non-overlapping fragments of roughly equal
size ("balanced tensor fragmentation", a greedy LPT bin-packing, which keeps the
largest fragment within 4/3 of the optimum), and the fragments' sync times are
staggered so that network traffic is smooth instead of bursty. With P == H (the
paper's main setting, P = H = 24, tau = 2) exactly one fragment starts syncing
after every inner step and each fragment syncs once every H steps.

Everything here is a pure function of its arguments: the learners and the
syncer each compute the same partition and schedule independently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def partition_tensors(sizes: Mapping[str, int], num_fragments: int) -> list[list[str]]:
    """Greedy balanced (LPT) bin-packing of tensors into `num_fragments` fragments.

    Tensors are taken largest first (ties: earlier in `sizes` first) and each
    goes into the fragment with the fewest elements so far (ties: lowest
    fragment index). Within a fragment, names keep the order of `sizes`
    (model order), so every process lays a fragment out identically.

    Args:
        sizes: tensor name -> number of elements, in model order.
        num_fragments: P, the number of fragments; 1 <= P <= len(sizes).

    Returns:
        One list of tensor names per fragment; every name appears in exactly one.

    Raises:
        ValueError: if `num_fragments` is out of range or a size is negative.
    """
    names = list(sizes)
    if num_fragments < 1:
        raise ValueError(f"num_fragments must be >= 1, got {num_fragments}")
    if num_fragments > len(names):
        raise ValueError(
            f"num_fragments ({num_fragments}) exceeds the number of tensors ({len(names)}); "
            "a fragment would be empty"
        )
    for name in names:
        if sizes[name] < 0:
            raise ValueError(f"tensor {name!r} has negative size {sizes[name]}")
    position = {name: i for i, name in enumerate(names)}
    # sorted() is stable, so equal sizes keep their model order.
    by_size = sorted(names, key=lambda n: -sizes[n])
    loads = [0] * num_fragments
    members: list[list[str]] = [[] for _ in range(num_fragments)]
    for name in by_size:
        target = min(range(num_fragments), key=lambda f: (loads[f], f))
        members[target].append(name)
        loads[target] += sizes[name]
    return [sorted(group, key=position.__getitem__) for group in members]


def fragment_sizes_report(partition: Sequence[Sequence[str]], sizes: Mapping[str, int]) -> dict:
    """Summarise how balanced a partition is.

    Returns:
        {"sizes": [elements per fragment], "max_over_mean": largest / mean}.
        `max_over_mean` is 1.0 for a perfectly balanced partition (and, by
        convention, when every fragment is empty).

    Raises:
        ValueError: if `partition` is empty or names a tensor missing from `sizes`.
    """
    if not partition:
        raise ValueError("partition has no fragments")
    frag_sizes: list[int] = []
    for group in partition:
        missing = [n for n in group if n not in sizes]
        if missing:
            raise ValueError(f"partition names tensors missing from sizes: {missing}")
        frag_sizes.append(sum(int(sizes[n]) for n in group))
    mean = sum(frag_sizes) / len(frag_sizes)
    ratio = max(frag_sizes) / mean if mean > 0 else 1.0
    return {"sizes": frag_sizes, "max_over_mean": float(ratio)}


@dataclass(frozen=True)
class FragmentSchedule:
    """When each fragment is sent to the syncer and when the merged result is applied.

    Fragment p is due after inner step t (steps count from 1) when
    t % H == offset(p), with offset(p) = (p * H) // P. Because offsets are
    spread evenly over [0, H): with P == H exactly one fragment is due at every
    step (fragment t % H), with P < H the due steps are about H / P apart,
    and with P > H about P / H fragments are due at each step. In every case
    each fragment is due exactly once in any H consecutive steps.
    """

    num_fragments: int
    """P: number of non-overlapping parameter fragments."""
    period: int
    """H: inner steps between two syncs of the same fragment."""
    overlap: int
    """tau: inner steps between sending a fragment and applying the merged result."""

    def __post_init__(self) -> None:
        if self.num_fragments < 1:
            raise ValueError(f"num_fragments must be >= 1, got {self.num_fragments}")
        if self.period < 1:
            raise ValueError(f"period must be >= 1, got {self.period}")
        if self.overlap < 0:
            raise ValueError(f"overlap must be >= 0, got {self.overlap}")

    def offset(self, fragment: int) -> int:
        """Phase of `fragment` within the period, in [0, H): (fragment * H) // P."""
        if not 0 <= fragment < self.num_fragments:
            raise ValueError(f"fragment {fragment} out of range [0, {self.num_fragments})")
        return (fragment * self.period) // self.num_fragments

    def fragments_due(self, step: int) -> list[int]:
        """Fragments whose sync starts right after inner step `step` (>= 1), ascending."""
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        phase = step % self.period
        return [p for p in range(self.num_fragments) if self.offset(p) % self.period == phase]

    def sync_index(self, fragment: int, step: int) -> int:
        """How many of `fragment`'s sync points lie in steps [1, `step`] (0 for `step` < its first one).

        The r-th sync point (r >= 1) is the r-th step after which the fragment is due: a learner whose step
        count goes from s to s' > s has reached a sync point of p exactly when this index grows."""
        first = self.offset(fragment) or self.period
        return 0 if step < first else (step - first) // self.period + 1

    def apply_step(self, sent_step: int) -> int:
        """Inner step after which a fragment sent after `sent_step` is applied: sent_step + tau."""
        return sent_step + self.overlap
