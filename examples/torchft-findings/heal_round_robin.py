"""torchft heals each rank of a recovering replica group from its own source group (round robin, offset by the
group rank), and keeps its promise per group rank: at every group rank r, every group holds the same weights.

Setup: a Lighthouse (--min_replicas 2), three replica groups of two ranks running torchft.local_sgd.DiLoCo
(sync_every 4, one fragment; trainers.py), every timeout explicit. Both ranks of a group train on the group's
data, i.e. data parallel inside the group: the layout diloco-chaos's torchft_diloco trainer used, which
torchft's DiLoCo does not support (it averages per group rank over that rank's cross-group process group;
torchft's integration tests use one rank per group, torchtitan shards the model across a group's ranks).
Every rank holds before manager step HOLD (a gate: the script acts on progress). The script SIGKILLs group 2's
two ranks there, starts a new generation of group 2 (new ports, step 0), waits until its Managers exist and lets
groups 0 and 1 go: the next quorum heals group 2. Observed on torchft 0.2.0: group 2's rank 0 and rank 1 fetch
their checkpoints from different source replica groups (`recover_src_replica_rank` and the source address in
torchft's logs), every group rank stays in agreement across the three groups at every later sync (torchft's
promise), and the ranks *inside* a group, equal before the heal, differ after it: not a torchft promise.
Run: python examples/torchft-findings/heal_round_robin.py   (one JSON line on stdout)
"""

from __future__ import annotations

import re
import signal
import sys
from typing import Any

from reprolib import Child, Cluster, free_port, main
from trainers import Group, Spec, diloco, finish, first, launch, syncs

FINDING = "heal_round_robin"
GROUPS, RANKS = 3, 2
HOLD = 2  # every rank holds before manager step HOLD; group 2 is restarted there
STEPS = 5
# the Python side, in each rank's own log (torchft/manager.py _async_quorum)
SRC = re.compile(r"fetching checkpoint from recover_src_replica_rank=(\d+)")
ADDR = re.compile(r"recover_src_manager_address='http://127.0.0.1:(\d+)' max_step=(\d+)")
# the Rust side: the group's ManagerServer (in rank 0's process) answers both ranks' quorum requests
RUST = re.compile(r"healing is required step=\d+, max_step=\d+, recover_src_replica_rank=(\d+)")


def spec(c: Cluster, label: str, group: int, rank: int, gates: tuple[int, ...]) -> Spec:
    return Spec(c.dir, label, group, rank=rank, world=RANKS, steps=STEPS, min_replicas=2, quorum_retries=0,
                timeout_s=10, quorum_timeout_s=30, connect_timeout_s=5, gates=gates, sync_every=4)



def body(c: Cluster, facts: dict[str, Any]) -> bool:
    port = free_port()
    c.lighthouse("lighthouse", port=port, min_replicas=2, join_ms=2000, heartbeat_ms=1000)
    procs: dict[str, Child] = {}
    groups = [Group(g, RANKS) for g in range(GROUPS)]
    for g, grp in enumerate(groups):
        for r in range(RANKS):
            s = spec(c, f"g{g}r{r}", g, r, (0, HOLD))
            procs[s.label] = launch(c, diloco, s, grp, port)
    labels = list(procs)
    c.wait(lambda: all(first(c.records(), lb, "ready") for lb in labels), 120, "every rank's Manager")
    for lb in labels:
        c.touch(f"go-{lb}-0")
    c.wait(lambda: all(first(c.records(), lb, "held", step=HOLD) for lb in labels), 90, f"every rank at {HOLD}")
    for r in range(RANKS):
        c.signal(procs[f"g2r{r}"], signal.SIGKILL)
    for r in range(RANKS):
        c.wait_exit(procs[f"g2r{r}"], 20)
    grp2 = Group(2, RANKS)  # the new generation: new ports, new Manager ids, step 0
    healed = [f"g2r{r}new" for r in range(RANKS)]
    for r, lb in enumerate(healed):
        procs[lb] = launch(c, diloco, spec(c, lb, 2, r, ()), grp2, port)
    c.wait(lambda: all(first(c.records(), lb, "ready") for lb in healed), 90, "the restarted group's Managers")
    for g in range(GROUPS - 1):
        for r in range(RANKS):
            c.touch(f"go-g{g}r{r}-{HOLD}")
    alive = [lb for lb in procs if not lb.startswith("g2r") or lb.endswith("new")]
    facts["exits"] = {lb: finish(c, procs[lb], 120) for lb in alive}
    recs = c.records()
    manager_ports = {grp.manager_port: grp.group for grp in groups}
    src: dict[str, Any] = {}
    for r, lb in enumerate(healed):
        msgs = [rec.get("msg", "") for rec in recs if rec["label"] == lb and rec["ev"] == "log"]
        rank = next((int(m.group(1)) for msg in msgs for m in [SRC.search(msg)] if m), None)
        addr = next((m for msg in msgs for m in [ADDR.search(msg)] if m), None)
        src[f"rank{r}"] = {"recover_src_replica_rank": rank,
                           "max_step": None if addr is None else int(addr.group(2)),
                           "source_group": None if addr is None else manager_ports.get(int(addr.group(1)))}
    facts["manager_server_log"] = sorted(int(m) for m in RUST.findall(c.text(healed[0])))
    facts["heal_sources"] = src
    facts["healed_loaded"] = [lb for lb in healed if first(recs, lb, "heal_load")]
    # digests of committed syncs: step -> {(group, rank): digest}
    table: dict[int, dict[tuple[int, int], str]] = {}
    for lb in alive:
        for rec in syncs(recs, lb):
            if rec["committed"]:
                table.setdefault(rec["step"], {})[(rec["group"], rec["rank"])] = rec["digest"]
    full = {s: d for s, d in table.items() if len(d) == GROUPS * RANKS}
    facts["steps_compared"] = sorted(full)
    facts["per_rank_agree"] = all(len({d[(g, r)] for g in range(GROUPS)}) == 1 for d in full.values()
                                  for r in range(RANKS))
    facts["ranks_of_a_group_agree_before_heal"] = all(
        table[s].get((g, 0)) == table[s].get((g, 1)) for s in table if s <= HOLD for g in range(GROUPS - 1))
    facts["ranks_of_a_group_differ_after_heal"] = sorted(s for s, d in full.items()
                                                         if any(d[(g, 0)] != d[(g, 1)] for g in range(GROUPS)))
    sources = [v["source_group"] for v in src.values()]
    facts["different_sources"] = None not in sources and len(set(sources)) == RANKS
    return bool(facts["different_sources"] and facts["per_rank_agree"] and full
                and all(code == 0 for code in facts["exits"].values()))


if __name__ == "__main__":
    sys.exit(main(FINDING, body))
