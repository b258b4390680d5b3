"""Invariant `token_accounting`: The tokens the syncer says it merged equal the tokens of the steps its merges took in.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

from collections import defaultdict

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.checks._common import overwrites
from diloco_chaos.harness.invariants.registry import Bound, register
from diloco_chaos.harness.record.learner import Step
from diloco_chaos.harness.record.syncer import Eval, Merge, SyncerDone, SyncerRestore, shard_of


@register(order=70, systems=("builtin",), bounds=(
    Bound("tolerance", "tokens of discrepancy allowed", 1e-3, low=0.0),
    Bound("show", "problems listed in the detail", 5, low=0)))
def token_accounting(run: Run, *, tolerance: float = 1e-3, show: int = 5) -> InvariantResult:
    """Tokens merged = tokens in merged pushes. Figure: the discrepancy in tokens; bound `tolerance`.

    Two sums of absolute differences, so errors cannot cancel:
    * the syncer's own count (the last `syncer_done.tokens_merged`, else the final eval's, else the last
      merge's cumulative `tokens_merged`) against the sum over merge events of their contributions'
      c_tokens / P (P fragments for decoupled, 1 for the others: the report's definition). A restored
      syncer's `tokens_merged` counts in where its versions show merges that were checkpointed but never
      logged; otherwise a restored count that differs from the log is a discrepancy. With a sharded
      synchronizer this holds per shard (each shard's count against its own merges and restores; the shard is
      the `proc` that logged them), and the figure sums the shards' gaps;
    * decoupled: each merged contribution's c_tokens against the tokens the learner's `step` events logged for
      the steps it trained (the c_steps steps ending at its last_step; the latest logged value of each step),
      divided by P; ddp and elastic_ddp: each participant's tokens against its step's (logged after the merge,
      so every step is read first). diloco.broadcast = all: each `fragment_overwritten` record's tokens against
      the tokens the learner's steps it discarded logged, / P (the discarded work, counted with its reason). A
      contribution whose
      steps were not all logged is counted in the detail as unverifiable, not as a discrepancy."""
    r = _run(run)
    merges = r.records(Merge)
    p_div = r.fragments
    measure = "tokens-merged discrepancy"
    shards = sorted({shard_of(e.proc) for e in [*merges, *r.records(SyncerDone)]}) or [0]
    reports: dict[int, tuple[float, str]] = {}
    for k in shards:
        done = [e for e in r.records(SyncerDone) if shard_of(e.proc) == k]
        finals = [e for e in r.records(Eval) if e.kind == "final"] if len(shards) == 1 else []
        mine = [e for e in merges if shard_of(e.proc) == k]
        if done:
            reports[k] = float(done[-1].tokens_merged), "syncer_done"
        elif finals:
            reports[k] = float(finals[-1].tokens_merged), "final eval"
        elif mine:
            reports[k] = float(mine[-1].tokens_merged), "last merge"
    if not reports:
        return InvariantResult("token_accounting", False, None, tolerance, "no merge and no syncer count: "
                               "nothing merged to account for", measure, "tokens")
    reported = sum(v for v, _ in reports.values())
    src = "/".join(sorted({w for _, w in reports.values()}))
    step_tokens: dict[int, dict[int, int]] = defaultdict(dict)
    logged_of: dict[int, float] = defaultdict(float)  # per shard: tokens of its logged merges
    extra_of: dict[int, float] = defaultdict(float)  # per shard: tokens its restores counted beyond them
    per_contrib, unverifiable, misreported = 0.0, 0, 0
    issues: list[str] = []
    unit = r.descriptor.merge_unit
    data_parallel = unit == "step"
    if data_parallel:  # a data-parallel step is logged after its merge: the learner steps on the averaged gradient
        for s in r.records(Step):
            step_tokens[s.learner][s.step] = s.tokens
    for e in r.all_records:
        if isinstance(e, Step) and not data_parallel:
            step_tokens[e.learner][e.step] = e.tokens
        elif isinstance(e, SyncerRestore):
            k = shard_of(e.proc)
            logged, restored_extra = logged_of[k], extra_of[k]
            before = [x for x in merges if x.t < e.t]
            gap = float(e.tokens_merged) - logged - restored_extra
            lost_merges = sum(max(0, int(v) - max((x.version for x in before if x.fragment == q), default=0))
                              for q, v in enumerate(e.versions))
            if lost_merges > 0 and gap >= 0:
                extra_of[k] += gap
            elif abs(gap) > tolerance:
                per_contrib += abs(gap)
                issues.append(f"restored syncer counts {e.tokens_merged} tokens merged, the log "
                              f"{logged + restored_extra:.6g}")
        elif isinstance(e, Merge):
            c = [int(x) for x in e.c_tokens]
            logged_of[shard_of(e.proc)] += sum(c) / p_div
            if unit == "fragment":
                ranges = [(int(a), int(b)) for a, b in e.step_ranges or []]
                c_steps = [int(x) for x in (e.c_steps if e.c_steps is not None else [b - a + 1 for a, b in ranges])]
                misreported += sum(1 for (a, b), cs in zip(ranges, c_steps, strict=False) if cs != b - a + 1)
                spans = [(max(a, b - cs + 1), b) for (a, b), cs in zip(ranges, c_steps, strict=False)]
            elif data_parallel and e.step is not None:
                spans = [(e.step, e.step)] * len(c)
            else:
                continue
            for m, ct, (a, b) in zip(e.participants, c, spans, strict=False):
                have = step_tokens.get(int(m), {})
                if any(s not in have for s in range(a, b + 1)):
                    unverifiable += 1
                    continue
                steps_sum = sum(have[s] for s in range(a, b + 1))
                if steps_sum != ct:
                    per_contrib += abs(ct - steps_sum) / p_div
                    issues.append(f"merge of fragment {e.fragment} v{e.version}: learner {m} "
                                  f"c_tokens {ct} but its steps {a}-{b} logged {steps_sum} tokens")
    overwritten = 0.0
    for o in [o for o in overwrites(r)[0] if o.record is not None]:  # broadcast = all: discarded work
        have = step_tokens.get(o.learner, {})
        if any(k not in have for k in range(o.first, o.step + 1)):
            unverifiable += 1
            continue
        want = sum(have[k] for k in range(o.first, o.step + 1)) / p_div
        assert o.record is not None
        overwritten += o.record.tokens
        if abs(o.record.tokens - want) > tolerance:
            per_contrib += abs(o.record.tokens - want)
            issues.append(f"fragment_overwritten of learner {o.learner} fragment {o.fragment} at step {o.step}: "
                          f"{o.record.tokens:.6g} tokens discarded but its steps {o.first}-{o.step} logged {want:.6g}")
    total_gap = 0.0
    for k, (count, where) in sorted(reports.items(), reverse=True):
        gap = abs(count - (logged_of[k] + extra_of[k]))
        total_gap += gap
        if gap > tolerance:
            who = f"shard {k}'s " if len(shards) > 1 else ""
            issues.insert(0, f"{who}{where} says {count:.6g} tokens merged, merges logged "
                             f"{logged_of[k] + extra_of[k]:.6g}")
    figure = round(total_gap + per_contrib, 6)
    detail = "; ".join(issues[:show]) + (f"; and {len(issues) - show} more" if len(issues) > show else "")
    if not issues:
        detail = f"{reported:.6g} tokens merged ({src}) over {len(merges)} merges, P = {p_div}"
        if overwritten:
            detail += f"; {overwritten:.6g} discarded by overwrites (broadcast = all), as their steps logged"
    if unverifiable:
        detail += f"; {unverifiable} contribution(s) with steps not all logged, not checked against steps"
    if misreported:
        detail += (f"; {misreported} contribution(s) whose step range is not c_steps long (first_step misreported),"
                   " checked over the last c_steps steps")
    return InvariantResult("token_accounting", figure <= tolerance, figure, tolerance, detail, measure, "tokens")
