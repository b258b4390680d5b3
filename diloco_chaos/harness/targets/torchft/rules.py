"""The torchft target's own validation rules (`Target.rules`, called by diloco_chaos/harness/config/target_check.py
once a scenario runs on torchft), each naming its key: a `kill_syncer` (the Lighthouse) without
torchft.quorum_retries >= 1 (every replica would fail after quorum_timeout_s) or without recovery.syncer_policy =
'restart'; a launch mode the target does not support yet (local or netns hosts, local backend); a link fault
without netns hosts and links.backend = 'kernel' (only there does one rule cover a group's every TCP port); its
timeout hierarchy (connect_timeout_s <= timeout_s <
quorum_timeout_s < timeouts.run_s, heartbeat_timeout_s + join_timeout_s < quorum_timeout_s, quorum_tick_ms below
both Lighthouse timeouts), min_replicas <= topology.learners, and for torchft_diloco one rank per replica group
(topology.chips_per_learner = 1: the only layout of torchft's DiLoCo with a full model copy per rank) and
Streaming DiLoCo's constraints (diloco.sync_every % diloco.fragments == 0 and diloco.overlap < sync_every /
fragments, overlap being torchft's fragment_sync_delay). `ddp_api_rule` (torchft.ddp_api = 'ddp_module' only with
algorithm = 'torchft_ddp') is called by diloco_chaos/harness/config/target_check.py for every scenario, since a
builtin algorithm would otherwise ignore the key silently.

Why here: the target brings its rules with its descriptor (diloco_chaos/harness/targets/torchft/__init__.py), so
validation has no branch on a system's name; it imports nothing heavy (validation imports it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diloco_chaos.chaos import faults
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.targets import base as targets

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found


DDP_MODULE_ALGORITHM = "torchft_ddp"
"""The one algorithm torchft.ddp_api = 'ddp_module' applies to (its per-step gradient allreduce)."""


def ddp_api_rule(sc: Scenario, found: Found) -> None:
    """torchft.ddp_api = 'ddp_module' with another algorithm than torchft_ddp: refused, naming the key and why."""
    if sc.torchft.ddp_api == "ddp_module" and sc.algorithm != DDP_MODULE_ALGORITHM and found.ok("torchft.ddp_api"):
        found.add("torchft.ddp_api", f"torchft.ddp_api = 'ddp_module': only with algorithm = "
                                     f"{DDP_MODULE_ALGORITHM!r}, not {sc.algorithm!r} (torchft's DDP module "
                                     "replaces its per-step Manager.allreduce of the gradients; torchft_diloco "
                                     "syncs through torchft's DiLoCo and the builtin algorithms run no torchft "
                                     "Manager)")


def rules(sc: Scenario, keys: list[str], found: Found) -> None:
    """Every error of a torchft scenario's own settings (see the module doc)."""
    t, la = sc.torchft, sc.launch
    for key, f in zip(keys, sc.faults, strict=True):
        if f.action != "kill_syncer":
            continue
        if t.quorum_retries < 1 and found.ok("torchft.quorum_retries"):
            found.add("torchft.quorum_retries", f"torchft.quorum_retries = {t.quorum_retries}: {key} kills the "
                                                "Lighthouse; with no quorum retry every replica group fails after "
                                                "torchft.quorum_timeout_s (set it to at least 1)")
        if sc.recovery.syncer_policy != "restart" and found.ok("recovery.syncer_policy"):
            found.add(key, f"{key}.action = 'kill_syncer': needs recovery.syncer_policy = 'restart' (the Lighthouse "
                           "is restarted after its repair delay)")
    if (la.hosts, la.backend) not in (("local", "local"), ("netns", "local")) and found.ok("launch.hosts",
                                                                                         "launch.backend"):
        found.add("launch.hosts", f"launch.hosts = {la.hosts!r}, launch.backend = {la.backend!r}: target 'torchft' "
                                  "runs on this machine only for now (launch.hosts = 'local' or 'netns', "
                                  "launch.backend = 'local')")
    target = targets.get("torchft")
    if (la.hosts, sc.links_in_effect.backend) != ("netns", "kernel") and found.ok("launch.hosts", "links.backend"):
        for key, f in zip(keys, sc.faults, strict=True):
            if faults.get(f.action).target == "link" and f.action in (target.fault_kinds or ()):
                why = f": {target.fault_refusal(f.action)}" if target.fault_refusal is not None else ""
                found.add(key, f"{key}.action = {f.action!r}: target 'torchft' carries link faults only on netns "
                               f"hosts with the kernel link backend (launch.hosts = {la.hosts!r}, links.backend = "
                               f"{sc.links_in_effect.backend!r}){why}")
    if t.min_replicas > sc.topology.learners and found.ok("torchft.min_replicas", "topology.learners"):
        found.add("torchft.min_replicas", f"torchft.min_replicas = {t.min_replicas}: must be in [1, "
                                          f"topology.learners = {sc.topology.learners}]")
    if t.connect_timeout_s > t.timeout_s and found.ok("torchft.connect_timeout_s", "torchft.timeout_s"):
        found.add("torchft.connect_timeout_s", f"torchft.connect_timeout_s = {t.connect_timeout_s}: must be at most "
                                               f"torchft.timeout_s = {t.timeout_s} (timeout hierarchy)")
    if not t.timeout_s < t.quorum_timeout_s and found.ok("torchft.timeout_s", "torchft.quorum_timeout_s"):
        found.add("torchft.timeout_s", f"torchft.timeout_s = {t.timeout_s}: must be below torchft.quorum_timeout_s "
                                       f"= {t.quorum_timeout_s} (timeout hierarchy)")
    lh = t.heartbeat_timeout_s + t.join_timeout_s
    if not lh < t.quorum_timeout_s and found.ok("torchft.heartbeat_timeout_s", "torchft.join_timeout_s",
                                                 "torchft.quorum_timeout_s"):
        found.add("torchft.quorum_timeout_s", f"torchft.quorum_timeout_s = {t.quorum_timeout_s}: must be above "
                                              f"heartbeat_timeout_s + join_timeout_s = {lh:g} (a quorum after a "
                                              "lost replica forms within those)")
    if not t.quorum_timeout_s < sc.timeouts.run_s and found.ok("torchft.quorum_timeout_s", "timeouts.run_s"):
        found.add("torchft.quorum_timeout_s", f"torchft.quorum_timeout_s = {t.quorum_timeout_s}: must be below "
                                              f"timeouts.run_s = {sc.timeouts.run_s} (timeout hierarchy)")
    tick_s = t.quorum_tick_ms / 1000
    if not tick_s < min(t.join_timeout_s, t.heartbeat_timeout_s) and found.ok(
            "torchft.quorum_tick_ms", "torchft.join_timeout_s", "torchft.heartbeat_timeout_s"):
        found.add("torchft.quorum_tick_ms", f"torchft.quorum_tick_ms = {t.quorum_tick_ms}: must be below "
                                            "torchft.join_timeout_s and torchft.heartbeat_timeout_s")
    if (algorithms.get(sc.algorithm).merge_unit == "round" and sc.topology.chips_per_learner > 1
            and found.ok("topology.chips_per_learner")):
        found.add("topology.chips_per_learner", f"topology.chips_per_learner = {sc.topology.chips_per_learner}: "
                  f"{sc.algorithm} runs one rank per replica group. torchft's DiLoCo averages each fragment per group "
                  "rank across the groups and heals each rank of a group from its own source group, so full copies "
                  "at several ranks of one group drift apart; torchft supports several ranks only with the model "
                  "sharded across them (set topology.chips_per_learner = 1)")
    if algorithms.get(sc.algorithm).merge_unit == "round" and found.ok("diloco.fragments", "diloco.sync_every",
                                                            "diloco.overlap"):
        d = sc.diloco
        if d.sync_every % d.fragments:
            found.add("diloco.sync_every", f"diloco.sync_every = {d.sync_every}: must be a multiple of "
                                           f"diloco.fragments = {d.fragments} (torchft's DiLoCo)")
        elif not d.overlap < d.sync_every // d.fragments:
            found.add("diloco.overlap", f"diloco.overlap = {d.overlap}: must be below diloco.sync_every / "
                                        f"diloco.fragments = {d.sync_every // d.fragments} (torchft's "
                                        "fragment_sync_delay)")
