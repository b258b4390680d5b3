"""The typed messages a learner and the syncer exchange, and the flat-tensor helpers they use.

They live apart from the learner's loops so the syncer side (trainers' syncer cores, diloco_chaos/harness/syncer/,
the wire conversions in diloco_chaos/harness/wire/convert.py) can name them without importing the learner:
`FragmentPush` (a learner's copy of a fragment, Decoupled DiLoCo), `MergedFragment` (a global fragment back),
`Snapshot` (the host-RAM state a link answers pulls from) and `STATE_STEP_KEY` (elastic_ddp's marker for a state
answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def flatten(tensors: list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def unflatten_into(flat: Tensor, tensors: list[Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n



@dataclass
class FragmentPush:
    """One learner's copy of one fragment, offered to the syncer (never waited on)."""

    learner: int
    fragment: int
    base_version: int
    c_steps: int
    c_tokens: int
    first_step: int
    last_step: int
    step_time_s: float
    tensors: dict[str, Tensor]
    final: bool = False


@dataclass
class MergedFragment:
    """A global fragment from the syncer: the answer to our pulled copy, or the current value on (re)join."""

    fragment: int
    version: int
    tensors: dict[str, Tensor]
    pulled_step: int | None = None
    """The step at which our copy was pulled for this merge (None: not a merge we took part in)."""
    broadcast: bool = False
    """Sent to a learner that was not in this merge (diloco.broadcast = all): it overwrites its copy."""
    merged_step: int = -1
    """With `broadcast`: the last step of this learner's work on the fragment some merge took in (-1: none), so
    the overwrite does not count it discarded (its own merge's value may never reach it: a newer one replaced it
    in the send queue)."""


@dataclass
class Snapshot:
    """The host-RAM copy of the learner after a step, from which the link answers pulls at once."""

    learner: int
    step: int
    step_time_s: float
    tensors: dict[str, Tensor]
    counters: list[tuple[int, int, int, int]]
    """Per fragment: (version, c_steps, c_tokens, first_step)."""

    def copy(self) -> Snapshot:
        """The same snapshot with tensors of its own (one flat copy; the entries are views of it)."""
        flat = flatten([t.detach() for t in self.tensors.values()])
        parts = flat.split([t.numel() for t in self.tensors.values()])
        tensors = {n: v.view_as(t) for (n, t), v in zip(self.tensors.items(), parts, strict=True)}
        return Snapshot(self.learner, self.step, self.step_time_s, tensors, list(self.counters))

    def push_for(self, p: int, names: list[str], final: bool = False) -> FragmentPush:
        version, c_steps, c_tokens, first = self.counters[p]
        tensors = {n: self.tensors[n] for n in names} if c_steps > 0 else {}
        return FragmentPush(learner=self.learner, fragment=p, base_version=version, c_steps=c_steps,
                            c_tokens=c_tokens, first_step=first, last_step=self.step, step_time_s=self.step_time_s,
                            tensors=tensors, final=final)



STATE_STEP_KEY = "elastic.state_step"
"""elastic_ddp: in the syncer's answer to a gradient, marks it as the group's state after that step (replica and
AdamW moments, as `resume_sync` takes) instead of an averaged gradient: the answer to a learner that missed
steps while its link was down."""
