"""With min_replicas 1, a replica group that returns after every up-to-date group has gone forms a quorum alone and
commits again the steps the others already committed, from other weights: a forked history.

Setup: a Lighthouse (--min_replicas 1, join 2 s, heartbeat 1 s), two replica groups of one rank, the DDP-style
torchft loop of trainers.py (Manager min_replica_size 1, every timeout explicit). Both train together in one
quorum. Group 1 holds before the quorum of manager step FREEZE (a gate: the script acts on progress) and the
script SIGSTOPs it there. Group 0 goes on alone (once group 1's heartbeat expires the Lighthouse issues a quorum
of one), trains to step STEPS and exits. Then the script lets group 1 go and SIGCONTs it: it is alone with the
Lighthouse, gets a quorum of one at its own step FREEZE, has nobody ahead of it to heal from, and commits steps
FREEZE+1..STEPS again. Each commit's weight digest is compared with group 0's at the same step.

With --min-replicas 2 (the control) there are three groups, the Lighthouse and every Manager use min_replicas 2:
groups 0 and 1 finish together, group 2 returns alone, gets no quorum and torchft raises its quorum TimeoutError
after quorum_timeout_s: no step is committed twice.

Run: python examples/torchft-findings/min_replicas_one_fork.py [--min-replicas 2]   (one JSON line on stdout)
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from reprolib import Cluster, free_port, main
from trainers import Group, Spec, ddp, finish, first, launch, syncs

FINDING = "min_replicas_one_fork"
FREEZE = 4  # the stale group is frozen before the quorum of this manager step
STEPS = 16
QUORUM_TIMEOUT_S = 4.0  # the control's stale group waits this long for a quorum that cannot come



def body(min_replicas: int, c: Cluster, facts: dict[str, Any]) -> bool:
    n = 2 if min_replicas == 1 else 3
    stale = f"g{n - 1}"
    port = free_port()
    c.lighthouse("lighthouse", port=port, min_replicas=min_replicas, join_ms=2000, heartbeat_ms=1000)
    specs = [Spec(c.dir, f"g{g}", g, steps=STEPS, min_replicas=min_replicas, quorum_retries=0,
                  quorum_timeout_s=QUORUM_TIMEOUT_S, timeout_s=3, connect_timeout_s=3,
                  gates=(0, FREEZE) if g == n - 1 else (0,)) for g in range(n)]
    procs = {s.label: launch(c, ddp, s, Group(s.group, 1), port) for s in specs}
    c.wait(lambda: all(first(c.records(), s.label, "ready") for s in specs), 90, "every group's Manager")
    for s in specs:  # every Manager heartbeats: the first quorum holds every group
        c.touch(f"go-{s.label}-0")
    held = c.wait(lambda: first(c.records(), stale, "held", step=FREEZE), 60, f"{stale} at step {FREEZE}")
    c.signal(procs[stale], signal.SIGSTOP)
    facts["frozen_at_step"] = held["step"]
    c.touch(f"go-{stale}-{FREEZE}")  # seen only once it runs again
    up_to_date = [s.label for s in specs if s.label != stale]
    for label in up_to_date:
        facts[f"{label}_exit"] = finish(c, procs[label], 60)
    facts["others_last_step"] = {label: syncs(c.records(), label)[-1]["step"] for label in up_to_date}
    c.signal(procs[stale], signal.SIGCONT)
    facts["stale_exit"] = finish(c, procs[stale], QUORUM_TIMEOUT_S + 60)
    recs = c.records()
    mine = {r["step"]: r for r in syncs(recs, stale) if r["committed"]}
    theirs = {r["step"]: r for r in syncs(recs, "g0") if r["committed"]}
    common = sorted(set(mine) & set(theirs))
    facts["agreed_before_freeze"] = all(mine[s]["digest"] == theirs[s]["digest"] for s in common if s <= FREEZE)
    forked = [s for s in common if s > FREEZE and mine[s]["digest"] != theirs[s]["digest"]]
    facts["recommitted_steps"] = [s for s in common if s > FREEZE]
    facts["forked_steps"] = len(forked)
    after = [r for r in syncs(recs, stale) if r["step"] > FREEZE]
    facts["stale_after_thaw"] = None if not after else {k: after[0][k] for k in ("step", "quorum_id",
                                                                                 "participants", "committed")}
    facts["stale_healed"] = first(recs, stale, "heal_load") is not None
    tail = c.text(stale)
    facts["stale_quorum_timeout"] = "TimeoutError" in tail and "Timeout expired" in tail
    if min_replicas == 1:
        return bool(forked and facts["agreed_before_freeze"] and not facts["stale_healed"]
                    and after and after[0]["participants"] == 1)
    # the control: nothing committed twice, the stale group failed on its quorum timeout
    return bool(not facts["recommitted_steps"] and facts["stale_quorum_timeout"] and facts["stale_exit"] != 0)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-replicas", type=int, choices=(1, 2), default=1)
    args = ap.parse_args()
    name = FINDING if args.min_replicas == 1 else f"{FINDING}_control_min_replicas_2"
    sys.exit(main(name, lambda c, facts: body(args.min_replicas, c, facts)))
