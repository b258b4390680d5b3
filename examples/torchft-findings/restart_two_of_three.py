"""Under a restarted Lighthouse with min_replicas 2, two replica groups of three commit without the third when the
third reaches the new Lighthouse later than its join timeout; the third then heals from them.

Setup: a Lighthouse (--min_replicas 2, join 2 s, heartbeat 1 s), three replica groups of one rank, the DDP-style
torchft loop of trainers.py (min_replica_size 2, quorum_retries 9, every timeout explicit). All three train in
one quorum to manager step HOLD and hold there (a gate). The script SIGKILLs the Lighthouse, starts a new one on
the same port (no group asks for a quorum meanwhile: all are held), lets groups 1 and 2 go, and holds group 0
until one of them has committed a step in a quorum of two: group 0 stands for a group that reaches the new
Lighthouse late (its Manager heartbeats the whole time). Groups 1 and 2 then hold at step REJOIN until group 0
has asked the new Lighthouse for a quorum, so the three meet again: the script records how group 0 rejoins
(heal, quorum, commits) and that every group ends at the last step.
Run: python examples/torchft-findings/restart_two_of_three.py   (one JSON line on stdout)
"""

from __future__ import annotations

import sys
from typing import Any

from reprolib import Cluster, free_port, main
from trainers import Group, Spec, ddp, finish, first, launch, syncs

FINDING = "restart_two_of_three"
HOLD = 4
REJOIN = HOLD + 3  # groups 1 and 2 hold here until group 0 has asked the new Lighthouse for a quorum
STEPS = 12
LH = {"min_replicas": 2, "join_ms": 2000, "heartbeat_ms": 1000, "tick_ms": 100}



def body(c: Cluster, facts: dict[str, Any]) -> bool:
    port = free_port()
    c.lighthouse("lighthouse1", port=port, **LH)
    specs = [Spec(c.dir, f"g{g}", g, steps=STEPS, min_replicas=2, quorum_retries=9, quorum_timeout_s=10,
                  timeout_s=3, connect_timeout_s=3, gates=(0, HOLD) if g == 0 else (0, HOLD, REJOIN))
             for g in range(3)]
    procs = {s.label: launch(c, ddp, s, Group(s.group, 1), port) for s in specs}
    c.wait(lambda: all(first(c.records(), s.label, "ready") for s in specs), 90, "every group's Manager")
    for s in specs:
        c.touch(f"go-{s.label}-0")
    c.wait(lambda: all(first(c.records(), s.label, "held", step=HOLD) for s in specs), 60, f"all at {HOLD}")
    c.kill(c.children[0])
    c.lighthouse("lighthouse2", port=port, **LH)
    for label in ("g1", "g2"):
        c.touch(f"go-{label}-{HOLD}")
    pair = c.wait(lambda: next((r for r in syncs(c.records(), "g1") if r["step"] > HOLD and r["committed"]
                                and r["participants"] == 2), None), 60, "a commit of groups 1 and 2")
    c.wait(lambda: all(first(c.records(), lb, "held", step=REJOIN) for lb in ("g1", "g2")), 60, f"pair at {REJOIN}")
    c.touch(f"go-g0-{HOLD}")
    c.wait(lambda: "Received quorum request for replica group0" in c.text("lighthouse2"), 30, "group 0's request")
    for label in ("g1", "g2"):
        c.touch(f"go-{label}-{REJOIN}")
    facts["exits"] = {label: finish(c, p, 90) for label, p in procs.items()}
    recs = c.records()
    pair_syncs = [r for r in syncs(recs, "g1") if r["step"] >= HOLD and r["t"] <= pair["t"]]
    facts["pair_after_restart"] = [{k: r[k] for k in ("step", "quorum_id", "participants", "committed")}
                                   for r in pair_syncs]
    g0_after = [r for r in syncs(recs, "g0") if r["step"] > HOLD]
    facts["g0_first_after"] = None if not g0_after else {k: g0_after[0][k] for k in ("step", "quorum_id",
                                                                                       "participants", "committed")}
    facts["g0_healed"] = first(recs, "g0", "heal_load") is not None
    facts["committed_without_g0"] = sorted(r["step"] for r in syncs(recs, "g1")
                                           if r["committed"] and r["participants"] == 2)
    facts["last_steps"] = {s.label: (syncs(recs, s.label) or [{"step": None}])[-1]["step"] for s in specs}
    digests: dict[int, set[str]] = {r["step"]: set() for r in syncs(recs, "g0")}
    for s in specs:
        for r in syncs(recs, s.label):
            if r["committed"] and r["step"] in digests:
                digests[r["step"]].add(r["digest"])
    facts["steps_all_three_agree"] = sorted(k for k, v in digests.items() if len(v) == 1)
    return bool(facts["committed_without_g0"] and facts["g0_healed"]
                and all(v == STEPS for v in facts["last_steps"].values()))


if __name__ == "__main__":
    sys.exit(main(FINDING, body))
