"""Known regressions that can be switched on for one process tree, to measure what the invariants catch.

What: a registry of named mutations of the algorithm (each a bug a real change could introduce), and
`active(name)`, which the algorithm's code asks at one hook per mutation (`if mutations.active("..."):`,
off the normal path). `bench/sensitivity.py` runs small scenarios with each mutation and reports which
invariants noticed it (docs/sensitivity.md).

Why a switch and not a patch: the mutated runs must be the real system (real processes, real merges), and
the bench must run the unmodified code beside them from the same checkout.

How it is switched on: only by the environment variable `DILOCO_CHAOS_MUTATION` (one name, or empty), read
once per process. Run processes start from a forkserver and inherit the environment the server started with,
so the variable must be set before the run starts: the bench runs each run in a subprocess with it set.
There is deliberately no scenario key for it: a scenario file cannot turn a mutation on.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Mapping

ENV_VAR = "DILOCO_CHAOS_MUTATION"

MUTATIONS: dict[str, str] = {
    "rda_as_mean": "RDA replaced by the plain weighted mean of the outer gradients (merge_rule rda).",
    "outer_lr_halved": "the syncer's outer Nesterov step uses half of diloco.outer_lr.",
    "drop_pushes": "about 10% of pushes silently dropped at the syncer (chosen by a hash of the push's identity).",
    "stale_as_fresh": "the syncer's staleness check skipped: a stale push is merged as a fresh one.",
    "ignore_token_weights": "token weights ignored (uniform weights) although token_weighting is on.",
    "overlap_off_by_one": "a merged fragment is applied one learner step later than the tau schedule says.",
    "final_before_rejoin": ("a finished learner's final pushes are declined as before_rejoin (and dropped from "
                            "the carried ones) when it reconnects to a restored syncer, as before issue 26."),
    "skip_initial_pull": "a restarted learner skips its initial pull of the global model before its first step.",
    "restore_older_slot": ("a restored syncer loads each fragment's older checkpoint slot instead of the newest: it "
                           "comes back one merge behind and makes that version again (fault path: kill_syncer)."),
    "restore_tokens_reset": ("a restored syncer's count of tokens merged starts again from zero instead of the "
                             "checkpointed count (fault path: kill_syncer)."),
    "restore_drops_momentum": ("a restored syncer drops each fragment's outer Nesterov momentum (restarts it "
                               "from zero) instead of loading it from the checkpoint (fault path: kill_syncer)."),
    "resume_one_step_early": ("a restarted learner resumes one step too early: after its initial pull it trains its "
                              "last logged step again, so its counters hold a step its step range does not "
                              "(fault path: a learner restart)."),
}
"""Every mutation name, with what it breaks."""

DROP_FRACTION = 0.1
"""drop_pushes: the share of pushes dropped."""


def from_env(environ: Mapping[str, str]) -> str | None:
    """The mutation `environ` names (None when the variable is unset or empty). Raises ValueError naming the
    allowed values on an unknown name."""
    name = environ.get(ENV_VAR, "").strip()
    if not name:
        return None
    if name not in MUTATIONS:
        raise ValueError(f"{ENV_VAR}={name!r} is not a known mutation; allowed: {', '.join(MUTATIONS)}")
    return name


@functools.cache
def current() -> str | None:
    """This process's mutation, read from the environment once."""
    return from_env(os.environ)


def active(name: str) -> bool:
    """Whether mutation `name` is switched on in this process. Raises ValueError for a name not in MUTATIONS
    (a misspelt hook) or an unknown value of the environment variable."""
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; allowed: {', '.join(MUTATIONS)}")
    return current() == name


def dropped(*key: int) -> bool:
    """drop_pushes: whether the push identified by `key` (seed, learner, fragment, first and last step) is one
    of the DROP_FRACTION dropped: deterministic, so a run with the same seed drops the same pushes."""
    h = zlib.crc32(",".join(map(str, key)).encode())
    return h % 1000 < DROP_FRACTION * 1000
