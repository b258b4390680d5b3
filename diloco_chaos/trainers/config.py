"""Training-side configuration: the inner loop, the algorithm and its knobs.

Every field carries its allowed range in `metadata["range"]` (or its choices in
`metadata["choices"]`) so that the scenario loader can reject a bad value
before any process starts, naming the key and the range. Defaults follow the
paper where it gives a value (P = H = 24, tau = 2, K = 1, RDA, token weights)
and DiLoCo's lineage where it does not (momentum 0.9; outer lr 0.35, half of DiLoCo's 0.7, for
this project's small H); see
docs/algorithm.md for every choice the paper leaves open.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

INF = math.inf


def bounded(default: Any, lo: float, hi: float) -> Any:
    """A dataclass field whose value must lie in [lo, hi]."""
    return field(default=default, metadata={"range": (lo, hi)})


def choice(default: str | None, choices: Sequence[str]) -> Any:
    """A dataclass field whose value must be one of `choices` (a default of None: unset, for optional fields)."""
    return field(default=default, metadata={"choices": choices})


@dataclass(frozen=True)
class TrainConfig:
    """The inner loop every learner runs (AdamW on its own shard)."""

    steps: int = bounded(300, 1, 10_000_000)
    """Inner steps each learner runs before it finishes (budget = per_learner), or the mean per learner of the
    run's total (budget = total)."""
    budget: str = choice("per_learner", ("per_learner", "total"))
    """per_learner: every learner runs `steps` inner steps, so a learner that was down finishes late while the
    others wait at the end with nothing to do. total (Decoupled DiLoCo): the run trains M x `steps` learner-
    steps in all; the learners train on until the syncer has seen that many reported and tells them to stop,
    so the healthy ones do a failed one's share (the paper's fixed token budget; at most M x `steps` each).
    The synchronous baselines run in lockstep, where the two are the same."""
    lr: float = bounded(3e-3, 0.0, 1.0)
    """AdamW peak learning rate."""
    warmup_steps: int = bounded(20, 0, 10_000_000)
    """Linear warm-up of the inner learning rate, in inner steps."""
    lr_schedule: Literal["constant", "cosine"] = choice("constant", ("constant", "cosine"))
    """After the warm-up: constant (lr until the end) or cosine (from lr down to lr * min_lr_ratio at step
    `steps`, held there after it); one of the knobs bench/spread.py's parity sweep varies."""
    min_lr_ratio: float = bounded(0.1, 0.0, 1.0)
    """cosine: the learning rate at the last step, as a fraction of lr."""
    weight_decay: float = bounded(0.01, 0.0, 1.0)
    """AdamW decoupled weight decay."""
    grad_clip: float = bounded(1.0, 0.0, 1e6)
    """Global gradient-norm clip per inner step (0 disables)."""


@dataclass(frozen=True)
class DilocoConfig:
    """Decoupled DiLoCo's knobs (the synchronous `diloco` baseline uses sync_every and outer_*)."""

    fragments: int = bounded(24, 1, 10_000)
    """P: number of parameter fragments (greedy balanced bin-packing of tensors)."""
    sync_every: int = bounded(24, 1, 1_000_000)
    """H: inner steps between two syncs of the same fragment (also DiLoCo's round length)."""
    overlap: int = bounded(2, 0, 1_000_000)
    """tau: a merged fragment is applied tau steps after it was sent, or on arrival if later."""
    broadcast: str = choice("all", ("all", "participants"))
    """Who receives a merged fragment. all (the default; the paper's syncer loop, step 7): every connected
    learner; one that was not in the merge overwrites its copy on arrival and resets that fragment's counters,
    discarding its unmerged work on it (a `fragment_overwritten` record). participants: only the merge's
    participants (a left-out learner keeps its work and sends it in a later round; this project's behaviour
    before the paper's was measured)."""
    apply_wait: str = choice("on_arrival", ("on_arrival", "block"))
    """What a learner does when the merge of a fragment it was pulled for at step s has not arrived by step
    s + tau. on_arrival: step on and apply it whenever it comes. block: wait for it, at most timeouts.liveness_s
    (the link's liveness bound), then step on; each wait is an `apply_wait` record and goodput counts it lost."""
    min_quorum: int = bounded(1, 1, 1_000)
    """K: learners that must report a fragment before it may be merged; at most topology.learners."""
    grace_enabled: bool = True
    """Whether the adaptive grace window is used after the quorum is reached."""
    grace_gamma: float = bounded(0.5, 0.0, 1.0)
    """gamma: safety margin on the slack tau*xi_step - xi_quorum - xi_sync."""
    grace_cap_s: float = bounded(0.5, 0.0, 600.0)
    """Upper clamp of the grace window, seconds (also used before xi_step is measured)."""
    merge_rule: str = choice("rda", ("rda", "mean"))
    """Merge of non-embedding tensors: Radial-Directional Averaging or a weighted mean."""
    token_weighting: bool = True
    """Weight learners by c_tokens**2 / c_steps; False weighs every participant equally."""
    embedding_tensors: tuple[str, ...] = ()
    """Tensors merged by a plain weighted mean (the paper: embeddings lack near-orthogonality). Empty (the
    default): the task's own list (diloco_chaos/trainers/task.py; the byte LM's: tok_emb.weight and pos_emb.weight,
    other built-in tasks: none). Names must be parameters of the task's model; an alias of a tied tensor counts."""
    outer_anchor: str = choice("current", ("current", "base"))
    """What a push's outer gradient is measured from. current: the syncer's current value, Δ_m = Θ_p(prev) − θ_m
    (the notes' reading of the paper's Appendix D.2); a push k versions stale then also carries
    −(Θ_p(prev) − Θ_p(base)), the others' progress since its base. base: the global value of the version the
    push was based on, Δ_m = Θ_p(base_m) − θ_m, so a stale push carries only its own learner's progress, but
    pushes of the same base merged one after another each take a full outer step (docs/algorithm.md)."""
    anchor_history: int = bounded(64, 1, 100_000)
    """Versions of each fragment the syncer keeps to anchor pushes at their base (outer_anchor = base); a push
    based on an older version is declined as stale and its learner is sent the current value."""
    deterministic: bool = False
    """Lockstep mode for bisecting a regression: each learner waits at every sync point for that round's merge
    and the syncer merges a round only once every alive learner is in, so merges happen in a fixed order at
    fixed steps and a fault-free run repeats exactly (diloco_chaos/trainers/learner/lockstep.py). Learners then wait
    for each
    other:
    not for measuring availability."""
    max_staleness: int = bounded(4, 0, 100_000)
    """Versions a push's base may be behind its fragment's current version and still be merged. An older-based
    push is declined (outcome lagging) and its learner is sent the current value: its learner sat out that many
    merges without being declared dead, and its outer gradient would undo the others' progress since
    (docs/algorithm.md has the measured staleness of fault-free and straggler runs)."""
    outer_lr: float = bounded(0.35, 0.0, 10.0)
    """Outer SGD learning rate (the paper publishes none). Half of DiLoCo's 0.7, which is tuned for H in the
    hundreds: at this project's H = 4-8, 0.7 overshoots, and 0.35 ended lower on the fault-free scenario with a
    third of the spread (docs/algorithm.md, Outer step, has the measurements)."""
    outer_momentum: float = bounded(0.9, 0.0, 0.999)
    """Outer Nesterov momentum."""
    wire_dtype: Literal["fp32", "bf16", "int8", "int4"] = choice("bf16", ("fp32", "bf16", "int8", "int4"))
    """Precision of the outer traffic on the links (decoupled: pushes and merged fragments; diloco: its rounds'
    parameters, both ways). Each frame is a delta against a value both ends of the connection hold, quantised
    (diloco_chaos/trainers/quantize.py: int8/int4 with per-block scales); a frame without such a value carries the
    values themselves, int4's in int8 (diloco_chaos/harness/wire/precision.py; docs/wire-precision.md has the bytes and
    losses measured). The paper sends bf16 and reports int4 nearly lossless. Ignored by ddp and elastic_ddp, whose
    per-step gradients stay fp32."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """" (did you mean X?)" for the allowed name closest to a misspelt one, or "" when none is close."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""
