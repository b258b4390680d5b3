"""The scenario's sections and the vocabulary of checking them: `ScenarioError` (a refused value, naming its
key), `Found` (every error of a document, collected), the section dataclasses (`[topology]`, `[timeouts]`,
`[links]`, `[launch]`, `[recovery]`, `[syncer]`, `[eval]`) with their ranges, and the small pure pieces both the
model (diloco_chaos/harness/config/scenario.py) and the rules (diloco_chaos/harness/config/check.py) read.

Why its own module: the scenario model builds and re-validates itself through the rules, and the rules read the
sections; with these at the bottom, scenario -> check -> sections is one direction and no import goes back up.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

from diloco_chaos.chaos.toxiproxy_backend import PROXY_MODES
from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.targets import base as targets
from diloco_chaos.trainers.config import bounded, choice

MODEL_RANGES: dict[str, tuple[float, float]] = {
    "seq_len": (8, 4096),
    "d_model": (8, 4096),
    "n_layers": (1, 64),
    "n_heads": (1, 64),
    "d_ff": (8, 16384),
}
LINK_BACKENDS = ("auto", "toxiproxy", "kernel")
"""links.backend's values (`LinksConfig.in_effect` resolves auto)."""
DATA_RANGES: dict[str, tuple[float, float]] = {"holdout_fraction": (0.01, 0.5), "batch_size": (1, 4096)}


class ScenarioError(ValueError):
    """A scenario value is missing, unknown or out of range; the message names the key.

    One raised for a whole document holds each of its errors in `problems` (its message: one per line)."""

    def __init__(self, message: str, problems: tuple[ScenarioError, ...] = ()) -> None:
        super().__init__(message)
        self.problems: tuple[ScenarioError, ...] = problems or (self,)
        """Each error on its own, each naming its key (just this one when it is a single error)."""

    @classmethod
    def of(cls, errors: list[ScenarioError]) -> ScenarioError:
        """One error for a list of them (non-empty): the error itself when there is one."""
        if len(errors) == 1:
            return errors[0]
        return cls("\n".join(str(e) for e in errors), tuple(errors))


@dataclass(frozen=True)
class Topology:
    """How many learners and chips run, each a real process."""

    learners: int = bounded(4, 1, 64)
    """M: independent learners; each is its own Gloo group and has its own link to the syncer."""
    chips_per_learner: int = bounded(2, 1, 64)
    """C: chip processes per learner, data-parallel inside the learner (all-reduce every step)."""


@dataclass(frozen=True)
class Timeouts:
    """One hierarchy of bounds; each level must be shorter than the one above it.

    socket_op_s < liveness_s < gloo_s < barrier_s < run_s, heartbeat_s * 3 <= liveness_s,
    socket_op_s < final_flush_s and barrier_s + gloo_s < run_s (validated before any process starts). In ddp,
    elastic_ddp and diloco a chip's collectives are bounded by barrier_s + gloo_s, since its host may wait
    barrier_s for the syncer. A socket call fails before the link is declared dead; a dead link is noticed before a Gloo
    collective gives up; a blocked baseline learner gives up before the whole run's deadline kills
    everything.
    """

    connect_s: float = bounded(2.0, 0.05, 600.0)
    """TCP connect plus handshake with the syncer."""
    socket_op_s: float = bounded(2.0, 0.05, 600.0)
    """One frame's send or receive on an established link."""
    heartbeat_s: float = bounded(0.5, 0.01, 600.0)
    """A learner host sends a heartbeat when its link has been idle this long."""
    liveness_s: float = bounded(3.0, 0.05, 600.0)
    """The syncer counts a learner as not alive after this long without a frame from it."""
    gloo_s: float = bounded(10.0, 0.5, 3600.0)
    """Timeout of every Gloo collective inside a learner (never Gloo's 30-minute default)."""
    barrier_s: float = bounded(60.0, 1.0, 36000.0)
    """How long a synchronous baseline learner waits for the syncer's result before failing."""
    startup_s: float = bounded(60.0, 1.0, 3600.0)
    """All processes must have started and joined their Gloo group within this."""
    final_flush_s: float = bounded(30.0, 0.1, 3600.0)
    """How long a finished learner's link keeps its final pushes (and the BYE) while the syncer, or a shard of
    it, is unreachable, waiting for it to come back (a restored syncer merges them); past it the link gives
    them up and says so (`final_pushes_given_up`). Above socket_op_s (run_s, the run's deadline, bounds it
    too); it must cover the syncer's repair time plus its restart (a few seconds here) for a learner that
    finishes during a syncer outage to keep its work."""
    run_s: float = bounded(900.0, 1.0, 86400.0)
    """Hard deadline of the whole run; past it every process is killed and the run fails."""
    shutdown_s: float = bounded(5.0, 0.1, 600.0)
    """Grace between SIGTERM and SIGKILL when the run's processes are stopped."""


@dataclass(frozen=True)
class LinksConfig:
    """The learner<->syncer links: one Toxiproxy proxy per learner, so any of them can be degraded."""

    proxy: str = choice("auto", PROXY_MODES)
    """auto: on local hosts TOXIPROXY_URL, else toxiproxy-server on PATH, else the embedded server; on netns and
    remote hosts off (the proxies listen on this machine's loopback, which those hosts cannot reach); embedded:
    always the embedded server (local hosts only); off: learners connect to the syncer directly (no link faults
    through proxies)."""
    http_timeout_s: float = bounded(5.0, 0.1, 600.0)
    """Timeout of every call to the Toxiproxy HTTP API (toxiproxy-python sets none of its own)."""
    step_time_s: float = bounded(0.15, 0.001, 3600.0)
    """Inner-step time WAN profiles are scaled to (0.15 s: the default scenario on 2 cores)."""
    backend: Literal["auto", "toxiproxy", "kernel"] = choice("auto", LINK_BACKENDS)
    """What carries link faults. auto: kernel on netns hosts when the scenario has link faults, toxiproxy
    everywhere else; toxiproxy: a proxy per learner (`proxy` picks the server); kernel: tc and nftables on each
    learner host's veth (diloco_chaos/chaos/kernel_links.py), which needs `[launch] hosts = "netns"` and `proxy`
    auto or off (learners reach the syncer over the kernel's network path); each fault kind says which backends
    carry it (docs/multi-host.md, the capability table)."""

    def in_effect(self, hosts: str, link_faults: bool) -> LinksConfig:
        """These links as a run on `hosts` uses them: the one place `auto` is resolved for the hosts (every
        check and every host kind reads this, through `Scenario.links_in_effect`). On netns and remote hosts
        proxy auto is off; on netns hosts backend auto is kernel when the scenario has a link fault (with none
        there is nothing to carry: no qdisc or nft table is made); elsewhere backend auto is toxiproxy. proxy
        auto stays auto on local hosts: which server it takes is decided when the run starts
        (diloco_chaos/chaos/toxiproxy_backend.py `resolve_backend`)."""
        proxy = "off" if self.proxy == "auto" and hosts != "local" else self.proxy
        backend = self.backend
        if backend == "auto":
            backend = "kernel" if hosts == "netns" and link_faults else "toxiproxy"
        if (proxy, backend) == (self.proxy, self.backend):
            return self
        return replace(self, proxy=proxy, backend=backend)


@dataclass(frozen=True)
class LaunchConfig:
    """How and where the run's processes start (docs/multi-host.md)."""

    backend: Literal["local", "torchrun"] = choice("local", ("local", "torchrun"))
    """local: the supervisor forks every process on this machine; torchrun: each learner's chips are started by
    `torch.distributed.run` on its host (c10d rendezvous), process chaos goes through a per-host agent; needs
    hosts = "netns" or "remote" and a recovery policy that restarts learners whole
    (diloco_chaos/harness/hosts/torchrun.py)."""
    hosts: Literal["local", "netns", "remote"] = choice("local", ("local", "netns", "remote"))
    """local: every process shares this machine's network (loopback); netns: each learner host gets its own
    Linux network namespace with a veth on a bridge, so learner<->syncer traffic crosses a real kernel network
    path (diloco_chaos/harness/hosts/netns.py; needs root, `ip` and `nft`; links.proxy and links.backend auto pick no
    proxy and the kernel backend there); remote: each learner host runs a host agent an operator started there
    (`agents`), which starts the learner's torchrun and ships its events back (diloco_chaos/harness/hosts/remote.py;
    needs backend = "torchrun" and links.proxy auto or "off")."""
    agents: tuple[str, ...] = ()
    """hosts = "remote": each learner's host agent, "host:port" (learner i's is the i-th; one per learner). The
    supervisor's machine must reach every one through the same local address: the syncer and the rendezvous
    store listen there."""
    agent_secret_file: str = ""
    """hosts = "remote": file (readable by its owner only) holding the secret, in hex, that every agent was
    started with (`--secret-file`); the supervisor proves it holds it."""


LearnerPolicy = Literal["fail", "restart", "shrink"]


def learner_policy(policy: str, algorithm: str) -> tuple[LearnerPolicy, str]:
    """The learner recovery in force for `algorithm` under `recovery.policy`, and why.

    Pure: 'elastic' resolves to 'shrink' for the algorithms that are elastic inside a learner (their
    descriptor's `elastic` trait, diloco_chaos/harness/algorithms/) and to 'restart' for the others (they wait for
    the repair); every other value is taken as written (validation keeps 'shrink' to the elastic ones)."""
    if policy == "elastic":
        if algorithms.get(algorithm).elastic:
            return "shrink", f"policy 'elastic': {algorithm} is elastic inside a learner"
        return "restart", f"policy 'elastic': {algorithm} is not elastic inside a learner, it waits for the repair"
    if policy in ("fail", "restart", "shrink"):
        return cast(LearnerPolicy, policy), f"policy {policy!r} as written"
    raise ValueError(f"recovery.policy = {policy!r}: not one of fail, restart, shrink, elastic")


@dataclass(frozen=True)
class RecoveryConfig:
    """What the supervisor does when a learner fails (a chip process dies or its Gloo group breaks)."""

    policy: Literal["fail", "restart", "shrink", "elastic"] = choice("fail", ("fail", "restart", "shrink",
                                                                             "elastic"))
    """fail: the run fails (any chip failure is a bug to see); restart: the whole learner is stopped and,
    after repair_s, started again as a new Gloo group; it pulls the global model and resumes its steps;
    shrink (decoupled and elastic_ddp only): when chips other than the host die, the survivors re-form a
    smaller group on a fresh store prefix and keep training with fewer tokens per step; each lost chip is
    started again after repair_s and joins at a step boundary. A lost host (chip 0, the link) falls back to
    restart. elastic: each algorithm's own recovery, so one scenario compares them: shrink for the algorithms
    that are elastic inside a learner (the `elastic` trait), restart for the others (ddp and diloco wait for
    the repair); `learner_policy` resolves it."""
    repair_s: float = bounded(2.0, 0.0, 3600.0)
    """Repair delay: seconds between a learner's failure and its restart."""
    max_restarts: int = bounded(3, 0, 1000)
    """Restarts allowed per learner (and for the syncer); one more failure fails the run."""
    syncer_policy: str = choice("fail", ("fail", "restart"))
    """fail: a syncer that dies fails the run; restart: after syncer_repair_s the supervisor starts a new
    syncer on the same port, which restores the per-fragment checkpoint (Decoupled DiLoCo only)."""
    syncer_repair_s: float = bounded(1.0, 0.0, 3600.0)
    """Seconds between the syncer's death and its restart (a kill_syncer fault's repair_s overrides it)."""
    syncer_checkpoint: str = choice("every_merge", ("every_merge", "off"))
    """every_merge: each merged fragment's state is written atomically (temp file, rename) before it is
    broadcast, so a restarted syncer loses nothing any learner has seen; off: no syncer checkpoint."""
    syncer_checkpoint_fsync: bool = False
    """Also fdatasync each fragment checkpoint slot (and its directory when the slot file is created) before the
    broadcast: survives the machine losing power, not only the syncer process dying (which the in-place write
    alone covers: the page cache outlives the process), at the cost of a disk flush per merge."""


@dataclass(frozen=True)
class ElasticConfig:
    """How elastic_ddp reacts to a lost chip or learner (`[elastic]`; docs/algorithm.md, "Elastic data parallel")."""

    engine: str = choice("regroup", ("regroup", "torchrun"))
    """regroup: the global group drops the lost learner in place and admits it again after its repair (the
    survivors never stop). torchrun: production's elastic data parallel: every chip of every learner is a
    worker of one torchrun elastic job (`--nnodes=1:1 --nproc-per-node=M*C --max-restarts`, c10d rendezvous on
    this machine); a lost chip or learner makes torchrun stop every worker, rendezvous again and restart them
    all from the last checkpoint (diloco_chaos/harness/hosts/elastic_torchrun.py). algorithm = "elastic_ddp"
    only."""
    checkpoint_every: int = bounded(20, 1, 1_000_000)
    """engine torchrun: global rank 0 writes the replica (parameters, AdamW moments, step) atomically every
    this many steps; a restart resumes after the last one and redoes, and counts as lost, the steps after it."""
    max_restarts: int = bounded(3, 0, 1000)
    """engine torchrun: torchrun's --max-restarts (restarts of the whole job); one more failure fails the run."""
    rdzv_timeout_s: float = bounded(30.0, 1.0, 3600.0)
    """engine torchrun: torchrun's rendezvous timeouts (--rdzv-conf join_timeout, and the store's timeout);
    below timeouts.run_s (timeout hierarchy, docs/algorithm.md)."""


MAX_SHARDS = 64
"""Most synchronizer shards a scenario may ask for (each is a process, with one proxy per learner)."""


@dataclass(frozen=True)
class SyncerConfig:
    """The synchronizer's processes (docs/sharded-syncer.md)."""

    shards: int = bounded(1, 1, MAX_SHARDS)
    """S: synchronizer shards, each its own process with its own port, checkpoint and restore, owning the
    fragments diloco_chaos/trainers/syncers/shards.py assigns it (balanced by size). Every learner reaches every
    shard, through
    one proxy per shard. S > 1: algorithm = "decoupled" only, S <= diloco.fragments, and
    recovery.syncer_checkpoint = "every_merge" (shard 0's evaluations read the other shards' fragments from
    their checkpoint slots). 1: one syncer, as before."""


@dataclass(frozen=True)
class EvalConfig:
    """Eval loss of the global model, computed by the syncer off the learners' hot path."""

    points: int = bounded(24, 0, 10_000)
    """Periodic evaluations spread evenly over the run's planned training: one each time its progress (tokens
    merged for the synchronous algorithms, learner-steps reported for decoupled) passes another 1/points of
    it, so a curve has about this many points whatever the run's length. 0: only `every_s` triggers."""
    every_s: float = bounded(3.0, 0.1, 3600.0)
    """Longest wall gap, in seconds, between two periodic evaluations of the global model (a wall-clock
    trigger besides `points`, for stretches where nothing is merged)."""
    max_share: float = bounded(0.05, 0.001, 1.0)
    """Largest share of one core the `points` evaluations may take (the last one's CPU time over the gap since
    it started): a milestone that comes sooner waits, so a run of a few seconds gets fewer points instead of
    slower chips. The `every_s` evaluations are not held back."""
    batches: int = bounded(4, 1, 10_000)
    """Held-out batches (of 16 sequences) per periodic evaluation; the final one uses them all."""



SYSTEMS = algorithms.Names(lambda: ("auto", *targets.names()))
"""`target.system` values: auto (the system the algorithm's descriptor names) or a registered target by name
(diloco_chaos/harness/targets/, a plugin's included), looked up each time it is read."""


@dataclass(frozen=True)
class TargetConfig:
    """The system under test: what trains (docs/targets.md)."""

    system: str = choice("auto", SYSTEMS)
    """builtin: this package's learners and syncer; torchft: torchft 0.2.0 replica groups and its Lighthouse
    (diloco_chaos/harness/targets/torchft/); auto: the system of the `algorithm` (torchft_ddp and torchft_diloco
    run on torchft, every other one on builtin). A system the algorithm does not run on is refused."""


DDP_APIS = ("manager", "ddp_module")
"""torchft.ddp_api's values."""


@dataclass(frozen=True)
class TorchftConfig:
    """The torchft target's settings (`[torchft]`, used when the system is torchft): its Lighthouse's flags and
    every timeout of its Manager and process group, explicit and short (torchft's defaults are 60 s)."""

    min_replicas: int = bounded(1, 1, 64)
    """Replica groups (learners) a quorum needs: the Lighthouse's --min_replicas; at most topology.learners."""
    join_timeout_s: float = bounded(2.0, 0.05, 600.0)
    """Lighthouse --join_timeout_ms: how long a quorum waits for heartbeating replicas that have not asked to join."""
    heartbeat_timeout_s: float = bounded(2.0, 0.05, 600.0)
    """Lighthouse --heartbeat_timeout_ms: a replica without a heartbeat this long is no longer healthy."""
    quorum_tick_ms: int = bounded(100, 1, 10_000)
    """Lighthouse --quorum_tick_ms: how often it re-evaluates the quorum; below the join and heartbeat timeouts."""
    quorum_timeout_s: float = bounded(30.0, 0.5, 3600.0)
    """Manager quorum_timeout: how long a quorum request waits (the crash delay when the Lighthouse is gone);
    above heartbeat_timeout_s + join_timeout_s and timeout_s, below timeouts.run_s."""
    timeout_s: float = bounded(10.0, 0.5, 3600.0)
    """Manager timeout (should_commit, checkpoint and allreduce futures) and ProcessGroupGloo's timeout (every
    collective, the store during reconfiguration): the stall when a participant freezes inside a collective."""
    connect_timeout_s: float = bounded(10.0, 0.1, 600.0)
    """Manager connect_timeout: connecting to the Lighthouse and the peers' manager servers; at most timeout_s."""
    quorum_retries: int = bounded(0, 0, 100)
    """Manager quorum_retries: failed quorum requests retried before the trainer fails (0: the Lighthouse is a
    single point of failure)."""
    ddp_api: Literal["manager", "ddp_module"] = choice("manager", DDP_APIS)
    """How algorithm = "torchft_ddp" averages gradients across replica groups. manager: the harness's loop calls
    Manager.allreduce on the flattened gradients and steps the optimizer when should_commit says so. ddp_module:
    the way torchft's README trains, torchft.ddp.DistributedDataParallel around the model (its comm hook
    allreduces each gradient bucket through the Manager during backward) and torchft.optim.OptimizerWrapper
    around the inner optimizer (zero_grad starts the quorum, step steps it only if should_commit); the task's
    loss is computed through the wrapped model. Only with algorithm = "torchft_ddp"; with several ranks per
    group, each rank's gradients are averaged across groups by the hook, then inside the group."""


MAX_EXPLORE_FAULTS = 16
"""Most faults one explored schedule may hold (`[explore] max_faults`)."""


@dataclass(frozen=True)
class ExploreConfig:
    """What `diloco-chaos explore` draws, runs and shrinks (docs/explore.md); `diloco-chaos run` ignores it."""

    kinds: tuple[str, ...] = ()
    """Fault kinds a schedule is drawn from (`action` names); empty: every link and process kind (and
    kill_syncer) that this scenario's validation accepts (its recovery policy, link backend and target)."""
    min_faults: int = bounded(1, 1, MAX_EXPLORE_FAULTS)
    """Fewest faults in one drawn schedule."""
    max_faults: int = bounded(3, 1, MAX_EXPLORE_FAULTS)
    """Most faults in one drawn schedule; at least min_faults."""
    steps: int = bounded(80, 1, 10_000_000)
    """Inner steps of every explored run (`--set train.steps`), or train.steps where that is smaller: short runs
    let a 10-minute budget on 2 cores run 20 schedules or more."""
    first_step: int = bounded(5, 1, 10_000_000)
    """Earliest step a drawn fault triggers at."""
    last_step: int = bounded(0, 0, 10_000_000)
    """Latest step a drawn fault triggers at; 0: the explored steps less a tenth (so a fault's repair ends
    before the learners finish). Above first_step, at most the explored steps."""
    min_duration_s: float = bounded(0.3, 0.0, 3600.0)
    """Shortest drawn duration: a kill's repair_s, a freeze's, slow's or link fault's `until = { after_s }`."""
    max_duration_s: float = bounded(3.0, 0.0, 3600.0)
    """Longest drawn duration; at least min_duration_s (keep freezes below timeouts.gloo_s)."""
    reaction_share: float = bounded(0.3, 0.0, 1.0)
    """Chance that a fault after a kill is triggered by the run's reaction to it (`at = { after = "rejoin" }`
    after a learner kill, `at = { after = "syncer_restored" }` after a syncer kill) instead of by a step."""
    targets: tuple[str, ...] = ()
    """Whom faults may hit: "learner<M>" names (e.g. ["learner0", "learner1"]) and "syncer"; empty: every learner
    and the syncer."""
    invariants: tuple[str, ...] = ()
    """Invariants whose violation is a finding; empty: every one that applies to the algorithm but faults_fired
    (with faults drawn at random, one can hit a target already down; its verdict is still recorded)."""
    max_loss: float = bounded(0.0, 0.0, 1e6)
    """Also check `converged` with this bound on the final eval loss; 0: not checked."""
    min_uptime: float = bounded(0.0, 0.0, 1.0)
    """Also check `availability` with this bound; 0: not checked."""
    bound_s: float = bounded(0.0, 0.0, 86400.0)
    """Also check `no_global_downtime` with this bound in seconds; 0: not checked."""
    within_s: float = bounded(0.0, 0.0, 86400.0)
    """Also check `rejoined` with this bound in seconds; 0: not checked."""
    tries: int = bounded(2, 1, 20)
    """n: a shrink candidate is run up to this many times (docs/explore.md, the measurement behind it)."""
    must_fail: int = bounded(1, 1, 20)
    """r: a candidate counts as failing when it fails the same invariant in at least this many of its `tries`
    runs (at most tries)."""
    shrink_runs: int = bounded(40, 0, 10_000)
    """Most runs shrinking one failure may make (each try of each candidate is a run; confirmation runs count
    too, but the schedule reached is always confirmed, so they may go past it); 0: no shrinking."""
    confirm_runs: int = bounded(5, 0, 50)
    """Fresh runs that confirm the schedule shrinking ends at repeats its failure; one that fails fewer than
    confirm_must_fail of them is backed out of (docs/explore.md); 0: no confirmation."""
    confirm_must_fail: int = bounded(5, 1, 50)
    """Failures among the confirm_runs that make a minimal incident (at most confirm_runs)."""
    shrink_learners: bool = True
    """Shrinking may also try fewer learners (topology.learners, never below 2 nor below the faults' targets)."""


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A scenario's name is part of its run directory's name: a letter or digit, then letters, digits, '.', '_' or
'-', at most 64 characters (no '/', no '..' path, nothing a shell or a file system would read otherwise)."""


def read_toml(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """Parse a TOML file; a missing file or bad TOML is a ScenarioError naming `what` and the path."""
    p = Path(path)
    if not p.is_file():
        raise ScenarioError(f"{what} {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{what} {str(p)!r} is not valid TOML: {e}") from e
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{what} {str(p)!r} is not UTF-8 text (byte {e.start}): TOML files are UTF-8") from e
    except OSError as e:
        raise ScenarioError(f"{what} {str(p)!r} cannot be read: {e.strerror or e}") from e



MAX_REPORTED = 50
"""Most errors reported for one document; past it one more line says how many were left out."""

class Found:
    """The errors found so far, and the keys whose values were refused (rules reading them are skipped)."""

    def __init__(self) -> None:
        self.errors: list[ScenarioError] = []
        """Each error, in the order found."""
        self.bad: set[str] = set()
        """Keys (`topology.learners`, `topology`, `faults[2]`) whose value was reported as wrong."""
        self.keys: list[str] = []
        """The key of each error in `errors`."""

    def add(self, key: str, message: str) -> None:
        self.errors.append(ScenarioError(message))
        self.keys.append(key)
        self.bad.add(key)

    def fold_drawn(self, first: int) -> None:
        """Report the errors of faults drawn by `[random_faults]` (faults[first] on) as the table's: one line
        per kind of error with how many draws it hit, not one per draw (a draw can hold 10,000 faults)."""
        kept: list[tuple[str, ScenarioError | str]] = []  # a str: what a drawn fault's error says after its key
        seen: dict[str, tuple[str, int]] = {}  # that text -> the first drawn key, and how many draws said it
        for key, e in zip(self.keys, self.errors, strict=True):
            m = re.fullmatch(r"faults\[(\d+)\]", key)
            if m is None or int(m.group(1)) < first or not str(e).startswith(key):
                kept.append((key, e))
                continue
            what = str(e)[len(key):]
            if what not in seen:
                kept.append(("random_faults", what))
            first_key, n = seen.get(what, (key, 0))
            seen[what] = (first_key, n + 1)
        self.keys = [k for k, _ in kept]
        self.errors = [e if isinstance(e, ScenarioError) else ScenarioError(
            f"random_faults: the draw's {seen[e][0]}{e}"
            + (f" (and {seen[e][1] - 1} more drawn faults alike)" if seen[e][1] > 1 else "")) for _, e in kept]

    def ok(self, *keys: str) -> bool:
        """Whether none of `keys`, nor a table holding one, was reported: a rule on them may run."""
        return not any(k == b or k.startswith(b + ".") or k.startswith(b + "[") for k in keys for b in self.bad)

    def capped(self) -> list[ScenarioError]:
        if len(self.errors) <= MAX_REPORTED:
            return list(self.errors)
        left = len(self.errors) - MAX_REPORTED
        return [*self.errors[:MAX_REPORTED], ScenarioError(f"... and {left} more errors (first {MAX_REPORTED} shown)")]


