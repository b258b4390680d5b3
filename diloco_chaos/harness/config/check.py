"""Every error of a scenario document at once: what `diloco-chaos validate` prints and `from_dict` raises.

A person fixing a scenario file should see all its mistakes in one run, not one per run. The builder
(diloco_chaos/harness/config/scenario.py `build(table)`) walks the whole parsed document with this module's
`read_section` / `entry_value` and collects each error as a `ScenarioError` naming its key: every unknown key or
table, every bad value of every table (each table checked on its own), every `[[faults]]` entry on its own,
then the rules here that tie fields together (K <= M, the timeout hierarchy, faults that can fire, ...). A rule
runs only when all of its inputs were valid, so an error that merely follows from one already reported (a
fault's learner out of range when topology.learners itself was refused) is not reported again.

What the size of the work depends on is checked before the work is done: a `[random_faults]` table is drawn
only once topology and train.steps have passed their range checks, so no input can make validation allocate
more than the caps allow. The errors of faults the draw made are the table's, reported once per kind with a
count; at most MAX_REPORTED errors are kept per document.

Imports point down only: scenario.py -> check.py -> sections.py (and task_check.py); the rules read a
`Scenario` without importing its module.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.schedule import (
    KILL_ACTIONS,
    FaultSpec,
    ScheduleError,
    missing_reaction,
    never_fires,
    parse_fault,
)
from diloco_chaos.chaos.toxiproxy_backend import resolve_backend
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.explore_check import explore_rules
from diloco_chaos.harness.config.sections import (
    DATA_RANGES,
    MODEL_RANGES,
    NAME_PATTERN,
    Found,
    ScenarioError,
    Topology,
    learner_policy,
    read_toml,
)
from diloco_chaos.harness.config.target_check import builtin_syncer, target_rules
from diloco_chaos.harness.config.task_check import task_rules
from diloco_chaos.trainers.config import did_you_mean
from diloco_chaos.trainers.data import CORPUS_NAMES

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario

SECTION_RANGES: dict[str, dict[str, tuple[float, float]]] = {"model": MODEL_RANGES, "data": DATA_RANGES}
MAX_LEARNERS = int(next(f for f in dataclasses.fields(Topology) if f.name == "learners").metadata["range"][1])


def entry_value(key: str, f: dataclasses.Field, value: Any, ranges: dict[str, tuple[float, float]]) -> Any:
    """One entry's value, type-checked and range-checked; raises ScenarioError naming `key`."""
    default = f.default
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScenarioError(f"{key} = {value!r}: must be true or false")
    elif isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{key} = {value!r}: must be an integer")
    elif isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{key} = {value!r}: must be a number")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise ScenarioError(f"{key} = {value!r}: must be a string")
    elif isinstance(default, tuple):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ScenarioError(f"{key} = {value!r}: must be a list of strings")
        value = tuple(value)
    _range(key, f, value, ranges)
    return value


def _range(key: str, f: dataclasses.Field, value: Any, ranges: dict[str, tuple[float, float]]) -> None:
    lo_hi = f.metadata.get("range") or ranges.get(f.name)
    if lo_hi is not None and not (lo_hi[0] <= value <= lo_hi[1]):
        raise ScenarioError(f"{key} = {value!r}: must be in [{lo_hi[0]}, {lo_hi[1]}]")
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ScenarioError(f"{key} = {value!r}: must be one of {', '.join(choices)}")


def read_section(cls: type, table: Any, prefix: str, found: Found) -> Any:
    """`cls` from the valid entries of `table`, defaults for the rest; every bad entry reported."""
    if not isinstance(table, dict):
        found.add(prefix, f"{prefix}: must be a table")
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in sorted(set(table) - set(fields), key=str):
        found.add(f"{prefix}.{name}", f"unknown key {prefix}.{name}{did_you_mean(name, fields)} in [{prefix}]; "
                                      f"allowed: {', '.join(fields)}")
    kwargs: dict[str, Any] = {}
    for name, value in table.items():
        if name in fields:
            try:
                kwargs[name] = entry_value(f"{prefix}.{name}", fields[name], value, SECTION_RANGES.get(prefix, {}))
            except ScenarioError as e:
                found.add(f"{prefix}.{name}", str(e))
    return cls(**kwargs)


def check_name(value: Any, found: Found) -> None:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        found.add("name", f"name = {value!r}: must be a letter or digit, then letters, digits, '.', '_' or '-', "
                          "at most 64 characters (it names the run directory)")


def scenario_problems(sc: Scenario) -> list[ScenarioError]:
    """Every error of an already built Scenario (e.g. one `Scenario.replace` made): ranges, faults, rules."""
    found = Found()
    check_name(sc.name, found)
    for f in dataclasses.fields(sc):
        value = getattr(sc, f.name)
        if dataclasses.is_dataclass(value):
            ranges = SECTION_RANGES.get(f.name, {})
            for g in dataclasses.fields(value):
                try:
                    _range(f"{f.name}.{g.name}", g, getattr(value, g.name), ranges)
                except ScenarioError as e:
                    found.add(f"{f.name}.{g.name}", str(e))
        elif f.name != "name":
            try:
                _range(f.name, f, value, {})
            except ScenarioError as e:
                found.add(f.name, str(e))
    learners = sc.topology.learners if found.ok("topology.learners") else MAX_LEARNERS
    specs: list[tuple[str, FaultSpec]] = []
    for i, spec in enumerate(sc.faults):
        try:
            specs.append((f"faults[{i}]", parse_fault(spec, f"faults[{i}]", learners)))
        except ScheduleError as e:
            found.add(f"faults[{i}]", str(e))
    rules(dataclasses.replace(sc, faults=tuple(s for _, s in specs)), [k for k, _ in specs], found)
    return found.capped()


def rules(sc: Scenario, keys: Sequence[str], found: Found) -> None:
    """The rules that tie fields together, each run only when its inputs were not refused. `keys[i]` is how
    `sc.faults[i]` is named in errors (`faults[3]`)."""
    steps = sc.train.steps if found.ok("train.steps") else sys.maxsize
    run_s = sc.timeouts.run_s if found.ok("timeouts.run_s") else math.inf
    for n, (key, f) in enumerate(zip(keys, sc.faults, strict=True)):
        why = never_fires(f, steps, run_s) or missing_reaction(n, sc.faults)
        if why is not None:
            found.add(key, f"{key}.{why} (the fault could never fire)")
        if (any(t is not None and t.after == "rejoin" for t in (f.at, f.until)) and sc.recovery.policy == "fail"
                and found.ok("recovery.policy")):
            found.add(key, f"{key}: after = 'rejoin' needs a recovery.policy that brings a learner back, not "
                           "'fail' (the first failure ends the run)")
        chips = sc.topology.chips_per_learner
        if f.chip is not None and f.chip >= chips and found.ok("topology.chips_per_learner"):
            found.add(key, f"{key}.chip = {f.chip}: must be in [0, {chips - 1}] (topology.chips_per_learner)")
        kind = faults.get(f.action)
        if (kind.target == "process" and f.action in KILL_ACTIONS and sc.recovery.policy == "fail"
                and found.ok("recovery.policy")):
            found.add(key, f"{key}.action = {f.action!r}: needs recovery.policy = 'restart' "
                           "(with 'fail' the first lost chip ends the run)")
        if kind.target == "syncer" and builtin_syncer(sc):
            if not algorithms.get(sc.algorithm).restorable_syncer and found.ok("algorithm"):
                found.add(key, f"{key}.action = {f.action!r}: supported for {_having('restorable_syncer')} "
                               f"only, not {sc.algorithm!r} (its syncer keeps no checkpoint to restore)")
            if ((sc.recovery.syncer_policy != "restart" or sc.recovery.syncer_checkpoint != "every_merge")
                    and found.ok("recovery.syncer_policy", "recovery.syncer_checkpoint")):
                found.add(key, f"{key}.action = {f.action!r}: needs recovery.syncer_policy = 'restart' "
                               "and recovery.syncer_checkpoint = 'every_merge'")
        shard = getattr(f.options, "shard", None)
        if kind.target == "syncer" and shard is not None and shard >= sc.syncer.shards and found.ok("syncer.shards"):
            found.add(key, f"{key}.shard = {shard}: must be in [0, {sc.syncer.shards - 1}] (syncer.shards)")
    _shards(sc, found)
    target_rules(sc, list(keys), found)
    if (sc.recovery.policy == "shrink" and found.ok("recovery.policy", "algorithm")
            and not algorithms.get(sc.algorithm).elastic):
        found.add("recovery.policy", f"recovery.policy = 'shrink': supported for {_having('elastic')} "
                                     f"only, not {sc.algorithm!r}; use 'restart', or 'elastic' (shrink where the "
                                     "algorithm has it, restart elsewhere)")
    _launch(sc, found)
    _elastic(sc, found)
    _remote(sc, found)
    if found.ok("links.proxy", "links.backend", "launch.hosts"):
        _link_backend(sc, keys, found)
    m = sc.topology.learners
    if sc.diloco.min_quorum > m and found.ok("diloco.min_quorum", "topology.learners"):
        found.add("diloco.min_quorum",
                  f"diloco.min_quorum = {sc.diloco.min_quorum}: must be in [1, topology.learners = {m}]")
    if sc.model.d_model % sc.model.n_heads and found.ok("model.d_model", "model.n_heads"):
        found.add("model.n_heads", f"model.n_heads = {sc.model.n_heads}: must divide model.d_model = "
                                   f"{sc.model.d_model}")
    if (found.ok("data.corpus") and sc.data.corpus not in CORPUS_NAMES
            and not os.path.isfile(sc.data.corpus)):
        found.add("data.corpus", f"data.corpus = {sc.data.corpus!r}: no such file; use one of "
                                 f"{', '.join(CORPUS_NAMES)} or a text file path")
    task_rules(sc, found)  # the model's tensors bound diloco.fragments; a bad factory exits 2 here
    explore_rules(sc, found)
    _timeouts(sc, found)


def _having(trait: algorithms.Trait) -> str:
    """The algorithms with `trait`, as a check's message names them: "algorithm = 'x'" or "algorithm in (...)"."""
    names = algorithms.with_trait(trait)
    return f"algorithm = {names[0]!r}" if len(names) == 1 else f"algorithm in {names}"


def _shards(sc: Scenario, found: Found) -> None:
    """syncer.shards > 1: what a sharded synchronizer needs (docs/sharded-syncer.md)."""
    s = sc.syncer.shards
    if s == 1 or not found.ok("syncer.shards"):
        return
    if found.ok("algorithm") and not algorithms.get(sc.algorithm).shardable_syncer:
        found.add("syncer.shards", f"syncer.shards = {s}: supported for {_having('shardable_syncer')} only, not "
                                   f"{sc.algorithm!r} (the synchronous baselines' barrier needs every tensor in "
                                   "one process)")
    elif s > sc.diloco.fragments and found.ok("diloco.fragments"):
        found.add("syncer.shards", f"syncer.shards = {s}: must be in [1, diloco.fragments = "
                                   f"{sc.diloco.fragments}] (a shard would own no fragment)")
    if sc.recovery.syncer_checkpoint != "every_merge" and found.ok("recovery.syncer_checkpoint"):
        found.add("syncer.shards", f"syncer.shards = {s}: needs recovery.syncer_checkpoint = 'every_merge' "
                                   "(shard 0's evaluations read the other shards' fragments from their slots)")
    if sc.links_in_effect.backend == "kernel" and found.ok("links.backend"):
        found.add("syncer.shards", f"syncer.shards = {s}: not with {_kernel_backend(sc)} (its nft rules match one "
                                   "syncer port; docs/multi-host.md)")


def _kernel_backend(sc: Scenario) -> str:
    """How an error names the kernel link backend: as written, or as what links.backend = 'auto' became."""
    if sc.links.backend == "auto":
        return "links.backend = 'auto', the kernel backend on netns hosts with link faults"
    return f"links.backend = {sc.links.backend!r}"


def _timeouts(sc: Scenario, found: Found) -> None:
    t = sc.timeouts
    chain = [("timeouts.socket_op_s", t.socket_op_s), ("timeouts.liveness_s", t.liveness_s),
             ("timeouts.gloo_s", t.gloo_s), ("timeouts.barrier_s", t.barrier_s), ("timeouts.run_s", t.run_s)]
    for (lo_key, lo), (hi_key, hi) in zip(chain, chain[1:], strict=False):
        if not lo < hi and found.ok(lo_key, hi_key):
            found.add(lo_key, f"{lo_key} = {lo}: must be below {hi_key} = {hi} (timeout hierarchy)")
    if t.barrier_s + t.gloo_s >= t.run_s and found.ok("timeouts.barrier_s", "timeouts.gloo_s", "timeouts.run_s"):
        found.add("timeouts.barrier_s", f"timeouts.barrier_s = {t.barrier_s}: barrier_s + gloo_s must be below "
                                        f"timeouts.run_s = {t.run_s} (baseline chips wait up to barrier_s + gloo_s)")
    if not t.socket_op_s < t.final_flush_s and found.ok("timeouts.socket_op_s", "timeouts.final_flush_s"):
        found.add("timeouts.final_flush_s", f"timeouts.final_flush_s = {t.final_flush_s}: must be above "
                                            f"timeouts.socket_op_s = {t.socket_op_s} (timeout hierarchy)")
    if t.heartbeat_s * 3 > t.liveness_s and found.ok("timeouts.heartbeat_s", "timeouts.liveness_s"):
        found.add("timeouts.heartbeat_s", f"timeouts.heartbeat_s = {t.heartbeat_s}: must be at most "
                                          f"timeouts.liveness_s / 3 = {t.liveness_s / 3:g}")


def _launch(sc: Scenario, found: Found) -> None:
    """The kernel link backend acts on netns hosts' veths, and proxies on loopback cannot reach netns hosts."""
    if sc.links.backend == "kernel" and sc.launch.hosts != "netns" and found.ok("links.backend", "launch.hosts"):
        found.add("links.backend", "links.backend = 'kernel': needs launch.hosts = 'netns' (the faults are made on "
                                   "each learner host's veth)")
    if (sc.launch.hosts != "local" and sc.links_in_effect.proxy != "off"
            and found.ok("launch.hosts", "links.proxy")):
        found.add("links.proxy", f"links.proxy = {sc.links.proxy!r}: {sc.launch.hosts} hosts reach the syncer "
                                 "directly (the proxies listen on this machine's loopback); set links.proxy = 'auto' "
                                 "or 'off'" + (" (link faults go through the kernel backend there)"
                                               if sc.launch.hosts == "netns" else ""))
    if sc.launch.backend == "torchrun":
        if sc.launch.hosts == "local" and found.ok("launch.backend", "launch.hosts"):
            found.add("launch.backend", "launch.backend = 'torchrun': needs launch.hosts = 'netns' or 'remote' "
                                        "(each learner's torchrun and host agent run on its own host)")
        policy, _ = learner_policy(sc.recovery.policy, sc.algorithm)
        if policy == "shrink" and found.ok("launch.backend", "recovery.policy"):
            found.add("recovery.policy", f"recovery.policy = {sc.recovery.policy!r} resolves to 'shrink' for "
                                         f"{sc.algorithm}: launch.backend = 'torchrun' restarts a failed learner as "
                                         "a whole (a new torchrun), it cannot regrow one chip; use 'restart' or "
                                         "'fail'")


def _elastic(sc: Scenario, found: Found) -> None:
    """elastic.engine = "torchrun": elastic_ddp on this machine's chips, torchrun restarting them all."""
    e = sc.elastic
    if e.engine != "torchrun" or not found.ok("elastic.engine"):
        return
    if found.ok("algorithm") and not algorithms.get(sc.algorithm).torchrun_engine:
        found.add("elastic.engine", f"elastic.engine = 'torchrun': algorithm = "
                                    f"{' or '.join(repr(a) for a in algorithms.with_trait('torchrun_engine'))} "
                                    f"only, not {sc.algorithm!r}")
    if sc.launch.hosts != "local" or sc.launch.backend != "local":
        found.add("elastic.engine", "elastic.engine = 'torchrun': needs launch.hosts = 'local' and launch.backend "
                                    "= 'local' (the job's workers run on this machine)")
    if sc.syncer.shards != 1 and found.ok("syncer.shards"):
        found.add("elastic.engine", "elastic.engine = 'torchrun': needs syncer.shards = 1")
    if not e.rdzv_timeout_s < sc.timeouts.run_s and found.ok("elastic.rdzv_timeout_s", "timeouts.run_s"):
        found.add("elastic.rdzv_timeout_s", f"elastic.rdzv_timeout_s = {e.rdzv_timeout_s}: must be below "
                                            f"timeouts.run_s = {sc.timeouts.run_s} (timeout hierarchy)")


def _remote(sc: Scenario, found: Found) -> None:
    """`[launch] hosts = "remote"`: torchrun, one agent address per learner, the agents' secret file."""
    la, m = sc.launch, sc.topology.learners
    if la.hosts != "remote":
        if la.agents and found.ok("launch.agents", "launch.hosts"):
            found.add("launch.agents", "launch.agents: only with launch.hosts = 'remote'")
        return
    if la.backend != "torchrun" and found.ok("launch.backend", "launch.hosts"):
        found.add("launch.hosts", "launch.hosts = 'remote': needs launch.backend = 'torchrun' (a remote host's "
                                  "agent starts the learner's chips with torchrun)")
    if found.ok("launch.agents", "topology.learners"):
        from diloco_chaos.harness.hosts.agent_wire import parse_agent

        if len(la.agents) != m:
            found.add("launch.agents", f"launch.agents: {len(la.agents)} given, needs one per learner "
                                       f"(topology.learners = {m})")
        for i, address in enumerate(la.agents):
            try:
                parse_agent(address)
            except ValueError as e:
                found.add("launch.agents", f"launch.agents[{i}] = {e}")
        dup = sorted({a for a in la.agents if la.agents.count(a) > 1})
        if dup:
            found.add("launch.agents", f"launch.agents: {', '.join(dup)} given more than once (one host per learner)")
    if not la.agent_secret_file and found.ok("launch.agent_secret_file"):
        found.add("launch.agent_secret_file", "launch.agent_secret_file: needed with launch.hosts = 'remote' (the "
                                              "secret the agents were started with)")
    elif not os.path.isfile(la.agent_secret_file) and found.ok("launch.agent_secret_file"):
        found.add("launch.agent_secret_file", f"launch.agent_secret_file = {la.agent_secret_file!r}: no such file")


def _link_backend(sc: Scenario, keys: Sequence[str], found: Found) -> None:
    """Every link fault must be one the run's Toxiproxy server implements (e.g. corrupt is an extension of the
    embedded server): decided from links.proxy and the environment (TOXIPROXY_URL, toxiproxy-server on PATH)
    the way the supervisor will decide it, before any process starts."""
    link_faults = [(k, f) for k, f in zip(keys, sc.faults, strict=True) if faults.get(f.action).target == "link"]
    if not link_faults:
        return
    links = sc.links_in_effect
    if links.backend == "kernel":
        for key, f in link_faults:
            why = faults.get(f.action).backend_problem("kernel", f)
            if why is not None:
                found.add(key, f"{key}.action = {f.action!r}: not supported by the kernel backend "
                               f"({_kernel_backend(sc)}): {why}")
        return
    backend = resolve_backend(links.proxy)
    if backend.family is None:
        if sc.launch.hosts == "local":
            found.add("links.proxy", "links.proxy = 'off': link faults need proxies; use auto or embedded "
                                     "(or links.backend = 'kernel' with launch.hosts = 'netns')")
        elif sc.launch.hosts == "netns":
            found.add("links.backend", f"links.backend = {sc.links.backend!r}: on netns hosts no proxy can carry "
                                       "link faults; use links.backend = 'auto' or 'kernel'")
        else:
            found.add("launch.hosts", f"launch.hosts = {sc.launch.hosts!r}: no link faults there (no proxy can "
                                      "reach remote hosts and the kernel backend needs netns hosts; "
                                      "docs/multi-host.md)")
        return
    for key, f in link_faults:
        kind = faults.get(f.action)
        if backend.family not in kind.backends:
            found.add(key, f"{key}.action = {f.action!r}: not supported by the {backend.family} backend "
                           f"({backend.why}); {f.action} runs on: {', '.join(sorted(kind.backends))}"
                           + (" (links.proxy = 'embedded' picks the embedded server)"
                              if "embedded" in kind.backends else ""))


def incident_problems(path: str | os.PathLike[str], sc: Scenario | None) -> list[ScenarioError]:
    """Every error of an incident file whose `[[faults]]` go on top of scenario `sc` (None: the scenario has
    errors of its own; the incident's entries are then checked alone, without the rules that read the
    scenario). Each error names the incident file and the incident's own faults[i] (diloco_chaos/harness/run/replay.py
    `load_incident` applies the same checks, stopping at the first)."""
    where = f"incident file {str(path)!r}"
    try:
        table = read_toml(path, "incident file")
    except ScenarioError as e:
        return [e]
    found = Found()
    for name in sorted(set(table) - {"faults", "description"}, key=str):
        found.add(name, f"{where}: unknown key {name!r}; allowed: faults, description")
    raw = table.get("faults", [])
    if not isinstance(raw, list) or not raw:
        found.add("faults", f"{where}: needs at least one [[faults]] table")
        raw = []
    if not isinstance(table.get("description", ""), str):
        found.add("description", f"{where}: description must be a string")
    learners = sc.topology.learners if sc is not None else MAX_LEARNERS
    specs: list[tuple[str, FaultSpec]] = []
    for i, f in enumerate(raw):
        try:
            specs.append((f"faults[{i}]", parse_fault(f, f"faults[{i}]", learners)))
        except ScheduleError as e:
            found.add(f"faults[{i}]", f"{where}: {e}")
    if sc is not None:
        on_top = Found()
        own = [(f"scenario's faults[{i}]", f) for i, f in enumerate(sc.faults)]  # an incident's `after` may
        both = own + specs  # wait on a reaction to one of the scenario's faults
        rules(dataclasses.replace(sc, faults=tuple(s for _, s in both)), [k for k, _ in both], on_top)
        found.errors += [ScenarioError(f"{where} on top of scenario {sc.name!r}: {e}") for e in on_top.errors]
    return found.capped()

