"""The scenario check's part for the system under test (`[target]`, `[torchft]`; docs/targets.md).

What: `target_rules` reports, each naming its key: a `target.system` the algorithm does not run on (a builtin
algorithm on torchft or a torchft algorithm on builtin); a fault kind the target cannot carry (naming target
and kind, and the target's reason); for torchft, a `kill_syncer` (the Lighthouse) without torchft.quorum_retries
>= 1 (every replica would fail after quorum_timeout_s) or without recovery.syncer_policy = 'restart'; a launch
mode the target does not support yet (torchft: local or netns hosts, local backend); for torchft, a link fault
without netns hosts and links.backend = 'kernel' (only there does one rule cover a group's every TCP port);
for torchft, its timeout hierarchy
(connect_timeout_s <= timeout_s < quorum_timeout_s < timeouts.run_s, heartbeat_timeout_s + join_timeout_s <
quorum_timeout_s, quorum_tick_ms below both Lighthouse timeouts), min_replicas <= topology.learners, and
Streaming DiLoCo's constraints for torchft_diloco (diloco.sync_every % diloco.fragments == 0 and
diloco.overlap < sync_every / fragments, overlap being torchft's fragment_sync_delay).

Why here: diloco_chaos/harness/config/check.py runs every cross-field rule; this module keeps the target's rules
together beside the task's (task_check.py), reading the target's descriptor (diloco_chaos/harness/targets/base.py)
rather than a list of names.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from diloco_chaos.chaos import faults
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.targets import base as targets

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found


def target_rules(sc: Scenario, keys: list[str], found: Found) -> None:
    """Every error of the scenario's target settings (see the module doc); `keys[i]` names `sc.faults[i]`."""
    if not found.ok("algorithm", "target.system"):
        return
    alg = algorithms.get(sc.algorithm)
    system = targets.system_of(sc)
    if system != alg.system:
        found.add("target.system", f"target.system = {sc.target.system!r}: algorithm = {sc.algorithm!r} runs on "
                                   f"the {alg.system!r} system, not {system!r} (use 'auto' or {alg.system!r})")
        return
    target = targets.get(system)
    if target.needs_module and importlib.util.find_spec(target.needs_module) is None:
        found.add("target.system", f"target.system = {system!r}: needs the Python module {target.needs_module!r} "
                                   f"(pip install 'diloco-chaos[{target.needs_module}]')")
    if target.fault_kinds is not None:
        for key, f in zip(keys, sc.faults, strict=True):
            if f.action not in target.fault_kinds:
                allowed = ", ".join(sorted(target.fault_kinds)) or "none yet"
                why = f": {target.fault_refusal(f.action)}" if target.fault_refusal is not None else ""
                found.add(key, f"{key}.action = {f.action!r}: target {system!r} cannot carry this fault kind{why} "
                               f"(it carries: {allowed}; docs/targets.md)")
    if system == "torchft":
        _torchft(sc, keys, found)


def builtin_syncer(sc: Scenario) -> bool:
    """Whether a `kill_syncer` of `sc` hits the built-in syncer (its rules apply: diloco_chaos/harness/config/
    check.py); False when the scenario's target has its own coordinator (torchft: the Lighthouse). An unknown
    algorithm or system counts as built-in (their own errors are reported elsewhere)."""
    try:
        return targets.get(targets.system_of(sc)).builtin_syncer
    except ValueError:
        return True


def _torchft(sc: Scenario, keys: list[str], found: Found) -> None:
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
    if (la.hosts, sc.links.backend) != ("netns", "kernel") and found.ok("launch.hosts", "links.backend"):
        for key, f in zip(keys, sc.faults, strict=True):
            if faults.get(f.action).target == "link" and f.action in (target.fault_kinds or ()):
                why = f": {target.fault_refusal(f.action)}" if target.fault_refusal is not None else ""
                found.add(key, f"{key}.action = {f.action!r}: target 'torchft' carries link faults only on netns "
                               f"hosts with the kernel link backend (launch.hosts = {la.hosts!r}, links.backend = "
                               f"{sc.links.backend!r}){why}")
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
