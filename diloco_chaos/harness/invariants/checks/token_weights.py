"""Invariant `token_weights`: Each merge's weights are c_tokens^2 / c_steps of its participants, normalised.

One module per invariant (a protocol invariant of Decoupled DiLoCo, for decoupled runs only): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import _diloco, _listing, _no_merges
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.syncer import Merge
from diloco_chaos.trainers.config import DilocoConfig


def expected_weights(c_steps: list[int], c_tokens: list[int], token_weighting: bool = True) -> list[float]:
    """The merge weights the algorithm promises: c_tokens^2 / c_steps normalised, or uniform."""
    if not token_weighting:
        return [1.0 / len(c_steps)] * len(c_steps)
    raw = [t * t / s if s > 0 else 0.0 for s, t in zip(c_steps, c_tokens, strict=True)]
    total = sum(raw)
    return [x / total for x in raw] if total > 0 else [math.nan] * len(raw)


@register(order=130, requires="fragmented", bounds=(
    Bound("tolerance", "absolute merge-weight difference allowed", 1e-5, low=0.0),
    Bound("show", "problems listed in the detail", 3, low=0)))
def token_weights(run: Run, *, tolerance: float = 1e-5, show: int = 3) -> InvariantResult:
    """Per merge, the weights it used (logged, rounded to 6 decimals) equal c_tokens^2 / c_steps of its
    participants normalised (diloco.token_weighting off: uniform), recomputed from the merge's counters, which
    are the pushes'. Figure: the largest absolute difference. Merges whose participants all had the same
    counters cannot tell the two apart (the detail counts those that can)."""
    r = _run(run)
    measure = "largest merge-weight difference"
    merges = r.records(Merge)
    if not merges:
        return _no_merges("token_weights", tolerance, measure)
    on = bool(_diloco(r, "token_weighting", DilocoConfig().token_weighting))
    worst, bad, unlogged, telling = 0.0, [], 0, 0
    for e in merges:
        if e.weights is None or e.c_steps is None:
            unlogged += 1
            continue
        cs, ct = [int(x) for x in e.c_steps], [int(x) for x in e.c_tokens]
        want = expected_weights(cs, ct, on)
        telling += max(want) - min(want) > tolerance
        got = [float(w) for w in e.weights]
        diff = max((abs(a - b) for a, b in zip(got, want, strict=False)), default=math.inf)
        if len(got) != len(want) or not diff <= tolerance:
            bad.append(f"fragment {e.fragment} v{e.version}: weights {got}, c_steps {cs}, "
                       f"c_tokens {ct} give {[round(w, 6) for w in want]}")
        worst = max(worst, diff if math.isfinite(diff) else 1.0)
    if unlogged:
        return InvariantResult("token_weights", False, None, tolerance, f"{unlogged} of {len(merges)} merges "
                               "logged no weights or counters: unverifiable", measure)
    detail = _listing(bad, show) if bad else (f"token_weighting {on}: {len(merges)} merges, {telling} whose "
                                              "counters give unequal weights")
    return InvariantResult("token_weights", not bad, round(worst, 7), tolerance, detail, measure)
