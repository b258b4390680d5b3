"""A restarted Lighthouse issues quorum id 1 again: a Manager that already holds quorum 1 skips reconfiguring its
process group for a different membership, and the step fails once.

Setup: a Lighthouse (--min_replicas 1), two replica groups of one rank, DDP-style torchft loop, quorum_retries 9,
every timeout explicit. Both groups train in quorum 1 (both members) to step K and hold there (a gate: the
script acts on progress). The script SIGKILLs the Lighthouse and group 1 together, lets group 0 go on, waits
until group 0's Manager has seen the dead Lighthouse ("lighthouse quorum failed"), and starts a new Lighthouse
on the same port. Observed on torchft 0.2.0: the new Lighthouse's first quorum is id 1 again, with group 0
alone; group 0 already has quorum id 1, so `Manager._async_quorum` does not call `pg.configure` (torchft/manager.py
`if quorum_id != self._quorum_id`), its allreduce runs on the process group of the old, two-member quorum and
fails (the peer is dead), the step is not committed; the new Lighthouse sees the commit failure and bumps the id
to 2 (src/lighthouse.rs `_quorum_tick`), group 0 reconfigures and commits again.
Run: python examples/torchft-findings/lighthouse_quorum_id_reuse.py   (one JSON line on stdout)
"""

from __future__ import annotations

import re
import sys
from typing import Any

from reprolib import Cluster, free_port, main
from trainers import Group, Spec, ddp, first, launch, syncs

FINDING = "lighthouse_quorum_id_reuse"
HOLD = 4  # both groups hold before the quorum of manager step HOLD
STEPS = 10
LH = {"min_replicas": 1, "join_ms": 5000, "heartbeat_ms": 1000, "tick_ms": 100}
RECONF = re.compile(r"reconfiguring for quorum_id=(\d+)")


def body(c: Cluster, facts: dict[str, Any]) -> bool:
    port = free_port()
    c.lighthouse("lighthouse1", port=port, **LH)
    groups = [Group(g, 1) for g in (0, 1)]
    specs = [Spec(c.dir, f"g{g}", g, steps=STEPS, min_replicas=1, quorum_retries=9, quorum_timeout_s=30,
                  timeout_s=3, connect_timeout_s=3, gates=(0, HOLD)) for g in (0, 1)]
    procs = [launch(c, ddp, s, grp, port) for s, grp in zip(specs, groups, strict=True)]
    c.wait(lambda: all(first(c.records(), s.label, "ready") for s in specs), 90, "both groups' Managers")
    for s in specs:  # both Managers heartbeat: the first quorum waits for both (join timeout 5 s)
        c.touch(f"go-{s.label}-0")
    c.wait(lambda: all(first(c.records(), s.label, "held", step=HOLD) for s in specs), 60, f"both at step {HOLD}")
    before = syncs(c.records(), "g0")[-1]
    facts["quorum_before"] = {k: before[k] for k in ("step", "quorum_id", "participants", "committed")}
    facts["quorum_ids_before"] = sorted({r["quorum_id"] for r in syncs(c.records(), "g0")})
    c.kill(c.children[0])  # the Lighthouse
    c.kill(procs[1])  # and group 1, together
    c.touch(f"go-g0-{HOLD}")
    c.wait(lambda: "lighthouse quorum failed" in c.text("g0"), 60, "group 0 to find the Lighthouse gone")
    c.lighthouse("lighthouse2", port=port, **LH)
    released = c.wait(lambda: first(c.records(), "g0", "released", step=HOLD), 10, "group 0 released")
    c.wait(lambda: first(c.records(), "g0", "done") or procs[0].poll() is not None, 60, "group 0's last step")
    rc = c.wait_exit(procs[0], 20)
    recs = c.records("g0")
    after = [r for r in syncs(recs, "g0") if r["t"] >= released["t"]]
    reconf = [(int(m.group(1)), r["t"]) for r in recs if r["ev"] == "log"
              for m in [RECONF.search(r.get("msg", ""))] if m]
    facts["group0_exit"] = rc
    facts["retries_logged"] = c.text("g0").count("lighthouse quorum failed")
    facts["after_restart"] = [{k: r[k] for k in ("step", "quorum_id", "participants", "committed", "error")}
                              for r in after[:4]]
    facts["reconfigured_for"] = [q for q, _ in reconf]
    facts["reconfigured_after_restart"] = [q for q, t in reconf if t >= released["t"]]
    bump = re.findall(r"Detected commit failures in \[[^\]]*\], bumping quorum_id to (\d+)", c.text("lighthouse2"))
    facts["lighthouse2_commit_failure_bumps"] = [int(b) for b in bump]
    if not after:
        return False
    first_after = after[0]
    same_id = first_after["quorum_id"] == before["quorum_id"]
    facts["same_quorum_id_other_membership"] = same_id and first_after["participants"] != before["participants"]
    facts["skipped_reconfigure"] = same_id and first_after["quorum_id"] not in facts["reconfigured_after_restart"]
    facts["failed_commit"] = not first_after["committed"]
    recovered = next((r for r in after if r["committed"]), None)
    facts["recovered"] = None if recovered is None else {k: recovered[k] for k in ("step", "quorum_id",
                                                                                     "participants")}
    facts["failed_commits_after_restart"] = sum(not r["committed"] for r in after)
    return bool(facts["same_quorum_id_other_membership"] and facts["skipped_reconfigure"]
                and facts["failed_commit"] and recovered is not None and rc == 0)


if __name__ == "__main__":
    sys.exit(main(FINDING, body))
