"""Records of the events the supervisor writes: the run's lifecycle, its processes' failures and repairs, and
the faults it injects (diloco_chaos/harness/run/supervisor.py, diloco_chaos/harness/run/fault_runner.py,
diloco_chaos/harness/hosts/link_proxies.py, and
diloco_chaos/chaos/processes.py / diloco_chaos/chaos/links.py through the `on_event` callback they are given)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diloco_chaos.harness.config.sections import LearnerPolicy
from diloco_chaos.harness.record.base import Event, event

SUPERVISOR = "supervisor (diloco_chaos/harness/run/supervisor.py)"


@event("run_start", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class RunStart(Event):
    """The run began; its scenario is in config.json."""

    algorithm: str
    """decoupled, diloco, ddp or elastic_ddp."""
    learners: int
    """Number of learners (M)."""
    chips_per_learner: int
    """Chips (processes) per learner."""
    seed: int
    """The scenario's seed."""
    learner_policy: LearnerPolicy
    """The recovery policy a failed learner gets (diloco_chaos/harness/config/scenario.py learner_policy)."""
    learner_policy_why: str
    """Why that policy (the scenario's recovery.policy as resolved for the algorithm)."""
    schema_version: int | None = None
    """Version of this event schema (diloco_chaos.harness.record.SCHEMA_VERSION); absent in runs written before it
    existed."""
    mutation: str | None = None
    """The mutation DILOCO_CHAOS_MUTATION switched on for the run (diloco_chaos/trainers/mutations.py): a known
    regression, not the algorithm; None (absent in older runs) when none was."""


@event("store_ready", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class StoreReady(Event):
    """The run's TCPStore (Gloo rendezvous) is listening."""

    port: int
    """Its TCP port on 127.0.0.1."""


@event("process_start", SUPERVISOR + ", diloco_chaos/harness/hosts/link_proxies.py")
@dataclass(frozen=True, kw_only=True)
class ProcessStart(Event):
    """A child process of the run started."""

    name: str
    """`syncer`, `learner<m>.chip<r>` or `toxiproxy`; with `[launch] backend = "torchrun"`, `learner<m>.agent`
    (the host's agent) and `learner<m>.torchrun` (its torchrun, whose workers are the learner's chips) instead of
    the chips; with `[launch] hosts = "remote"` only `learner<m>.torchrun`, whose pid is the remote host's."""
    child_pid: int
    """Its pid."""


@event("run_end", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class RunEnd(Event):
    """Every process of the run has stopped (written whether it succeeded or failed), and the post-run phase wrote
    its events (errors_labelled, the final eval): the log's last line, nothing is appended after it."""

    wall_s: float
    """Seconds from run start to every process stopped (the post-run phase not included)."""
    stopped_t: float | None = None
    """CLOCK_MONOTONIC when every process had stopped, before the post-run phase that this event follows; null
    in runs of older versions, which wrote run_end at that moment (`ended`)."""

    @property
    def ended(self) -> float:
        """When the run itself ended: `stopped_t`, else (older runs) this event's `t`."""
        return self.stopped_t if self.stopped_t is not None else self.t


@event("run_interrupted", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class RunInterrupted(Event):
    """The run was interrupted (Ctrl-C or SIGTERM)."""

    reason: str
    """The exception's class name: KeyboardInterrupt or _Terminate."""


@event("errors_labelled", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class ErrorsLabelled(Event):
    """After the run: each error its processes logged, expected (an injected fault explains it) or not."""

    expected: int
    """Errors an injected fault explains."""
    unexpected: int
    """Errors none explains."""
    errors: list[dict[str, Any]]
    """Each error (diloco_chaos/harness/report/errors.py RunError.as_dict): proc, ev, error, t_s, expected, cause."""


@event("syncer_down", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class SyncerDown(Event):
    """The syncer exited with an error; it is restarted after `repair_s`."""

    exitcode: int
    """Its exit code (negative: killed by that signal)."""
    repair_s: float
    """Seconds until the restart."""
    shard: int = 0
    """The synchronizer shard that went down (0 without sharding: syncer.shards = 1)."""


@event("syncer_restart", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class SyncerRestart(Event):
    """A new syncer started, restoring from the checkpoint."""

    restarts: int
    """Syncer restarts so far in the run."""
    port: int
    """Port it listens on (the same as before)."""
    child_pid: int
    """Its pid."""
    shard: int = 0
    """The synchronizer shard restarted (0 without sharding)."""


@event("learner_shrink", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class LearnerShrink(Event):
    """Policy shrink: non-host chips of a learner died; the survivors go on as a smaller group."""

    learner: int
    """The learner."""
    lost: list[int]
    """Ranks of the chips lost."""
    members: list[int]
    """Chip ranks of the new, smaller group."""
    generation: int
    """The group's new generation."""
    step: int
    """The learner's step when it was noticed."""
    repair_s: float
    """Seconds until the lost chips are restarted (then `learner_grow`)."""


@event("learner_grow", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class LearnerGrow(Event):
    """A repaired chip started and is joining its learner's group."""

    learner: int
    """The learner."""
    chip: int
    """The chip's rank."""
    members: list[int]
    """Chip ranks of the grown group."""
    generation: int
    """The group's new generation."""
    step: int
    """The learner's step when the chip started."""


@event("chip_join_abandoned", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class ChipJoinAbandoned(Event):
    """The learner finished before a repaired chip joined: the chip is stopped."""

    learner: int
    """The learner."""
    chip: int
    """The chip's rank."""


@event("chip_repair_skipped", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class ChipRepairSkipped(Event):
    """A lost chip is not restarted (too near the end of training)."""

    learner: int
    """The learner."""
    chip: int
    """The chip's rank."""
    step: int
    """The learner's step."""
    reason: str
    """Why."""


@event("learner_down", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class LearnerDown(Event):
    """A learner failed (a chip died and the group cannot go on); its survivors were stopped."""

    learner: int
    """The learner."""
    exitcodes: dict[str, int | None]
    """Exit code of each of its chip processes by name (None: was still running)."""
    step: int
    """Its last reported step."""
    repair_s: float
    """Seconds until it is restarted (`learner_restart`)."""


@event("learner_restart", SUPERVISOR)
@dataclass(frozen=True, kw_only=True)
class LearnerRestart(Event):
    """A failed learner was started again as a new Gloo group."""

    learner: int
    """The learner."""
    generation: int
    """Its group's generation."""
    start_step: int
    """The step it resumes from."""
    restarts: int
    """Its restarts so far."""


FAULTS = "supervisor (diloco_chaos/harness/run/fault_runner.py)"


@dataclass(frozen=True, kw_only=True)
class _FaultTransition(Event):
    index: int
    """The fault's index in the scenario's `faults`."""
    action: str
    """Its action, a fault kind of the registry (diloco_chaos/chaos/faults/): {fault_kinds}."""
    learner: int | None
    """The learner it hits (None: kill_syncer)."""
    describe: str
    """One-line description, e.g. "kill_chip learner 1 chip 0"."""
    reason: str
    """Which trigger fired, e.g. "learner 0 reached step 20" or "end of run"."""
    elapsed_s: float
    """Seconds since run start."""
    progress: dict[str, Any]
    """Training progress then: {"steps": {learner: step}, "merges": n}."""


@event("fault_start", FAULTS)
@dataclass(frozen=True, kw_only=True)
class FaultStart(_FaultTransition):
    """A scheduled fault started."""

    missed: str | None = None
    """Set when the fault hit nothing (its learner was already down): why."""
    applied_from_t: float | None = None
    """When the supervisor began applying it (CLOCK_MONOTONIC, like `t`): a fault acts before it is logged, by
    the time its signals or toxics take (a host agent's round trip), and errors it causes in between are its own.
    Absent in runs written before it existed."""


@event("fault_end", FAULTS)
@dataclass(frozen=True, kw_only=True)
class FaultEnd(_FaultTransition):
    """A scheduled fault ended: its effect is over. A lasting fault (the link actions, freeze, slow) ends when
    its `until` trigger clears it; a kill (kill_chip, kill_learner, crash_host, kill_syncer) when what it killed
    has recovered (`reason` says how: "until the syncer was restored", ...), as the supervisor sees it in the
    log, or at the end of the run ("not recovered by run end"). Every view of the run (the live output, the
    final table, report.json's faults, the HTML report's bands) takes a fault's end from this event
    (`ended_t`, else `t`). Runs written before kills ended at their recovery end every kill "end of run"."""

    ended_t: float | None = None
    """A kill's recovery: the `t` of the record that showed it (the restarted learner's first step, the
    repaired chip's chip_joined, the syncer's syncer_restore, the dropped learner's learner_join), which the
    supervisor reads a little before it writes this event. Absent: the fault ended at `t`."""
    reaction: str | None = None
    """A recovered kill: its first reaction (learner_down, learner_shrink, learner_leave, syncer_down)."""


PROCESSES = "supervisor (diloco_chaos/chaos/processes.py)"


@event("process_fault", PROCESSES)
@dataclass(frozen=True, kw_only=True)
class ProcessFault(Event):
    """A process fault acted: signals sent (kill_*, freeze) or a slow-down started."""

    kind: str
    """A process fault kind (diloco_chaos/chaos/faults/): {process_fault_kinds}."""
    learner: int | None
    """The learner hit (None: kill_syncer)."""
    pids: list[int] | None = None
    """Processes signalled (absent for slow)."""
    signal: str | None = None
    """Signal name, e.g. SIGKILL, SIGSTOP (absent for slow)."""
    chip: int | None = None
    """kill_chip, freeze: the chip rank hit (absent: all the learner's chips)."""
    speed: float | None = None
    """slow: target fraction of full speed."""
    period_s: float | None = None
    """slow: seconds of one run+stop cycle."""
    jitter: float | None = None
    """slow: relative variation of the target speed per period."""
    mode: str | None = None
    """slow: "progress" (paced on the other learners' steps) or "duty" (a fixed duty cycle)."""
    shard: int | None = None
    """kill_syncer: the synchronizer shard killed (absent: every shard)."""


@event("process_fault_off", PROCESSES)
@dataclass(frozen=True, kw_only=True)
class ProcessFaultOff(Event):
    """A freeze or slow-down ended (SIGCONT sent)."""

    kind: str
    """freeze or slow."""
    learner: int | None
    """The learner."""
    pids: list[int] | None = None
    """freeze: processes resumed."""
    cycles: int | None = None
    """slow: stop/continue cycles made."""
    stopped_s: float | None = None
    """slow: seconds the learner was held stopped in all."""


LINKS = "supervisor (diloco_chaos/chaos/links.py)"


@event("links_ready", "supervisor (diloco_chaos/harness/hosts/link_proxies.py, diloco_chaos/harness/hosts/netns.py)")
@dataclass(frozen=True, kw_only=True)
class LinksReady(Event):
    """The learners' links are ready for faults: through Toxiproxy proxies, or (backend "kernel") through tc and
    nftables on each netns host's veth."""

    backend: str
    """Which Toxiproxy: "embedded" (diloco_chaos/chaos/toxiproxy_server), "toxiproxy-server" or "external"; or
    "kernel"."""
    url: str
    """Its HTTP API; for the kernel backend the syncer's address the hosts connect to (tcp://host:port)."""
    version: str | None
    """The server's version string; for the kernel backend the kernel's release."""
    proxies: dict[str, int]
    """Learner -> the proxy port its link connects to (the kernel backend: the syncer's port)."""
    shard_proxies: dict[str, list[int]] | None = None
    """syncer.shards > 1: learner -> the proxy ports of its connections to shards 1..S-1 (shard 0's is in
    `proxies`); absent without sharding."""


@event("link_fault_on", LINKS)
@dataclass(frozen=True, kw_only=True)
class LinkFaultOn(Event):
    """A link fault's toxics are in place (only the parameters that are set are written)."""

    learner: int
    """The learner whose link it hits."""
    kind: str
    """The link fault kind (diloco_chaos/chaos/faults/): {link_fault_kinds}."""
    latency_ms: float | None = None
    """degrade: added round-trip time."""
    jitter_ms: float | None = None
    """degrade: +- round-trip jitter."""
    bandwidth_kbps: float | None = None
    """degrade: link rate in kilobits/s."""
    mode: str | None = None
    """partition, flap: blackhole or refuse."""
    period_s: float | None = None
    """flap: seconds of one down+up cycle."""
    duty: float | None = None
    """flap: fraction of each period down."""
    timeout_ms: int | None = None
    """reset_peer: reset after this many ms."""
    average_size: int | None = None
    """slice: average bytes per slice."""
    size_variation: int | None = None
    """slice: +- bytes of slice size."""
    delay_us: int | None = None
    """slice: microseconds between slices."""
    limit_bytes: int | None = None
    """slice: connections are cut after this many bytes."""
    bytes: int | None = None
    """limit_data: connections are closed after this many bytes."""
    params: dict[str, float | int | str] | None = None
    """Kinds made of plain toxics (diloco_chaos/chaos/links.py add_toxics, e.g. corrupt): their set parameters by name,
    so a fault kind added as one module needs no field here."""


@event("link_fault_off", LINKS)
@dataclass(frozen=True, kw_only=True)
class LinkFaultOff(Event):
    """A link fault's toxics were removed."""

    learner: int
    """The learner."""
    kind: str
    """The fault's kind (as in link_fault_on)."""


@event("link_flap", LINKS)
@dataclass(frozen=True, kw_only=True)
class LinkFlap(Event):
    """A flapping link went down or came back up."""

    learner: int
    """The learner."""
    down: bool
    """True: it went down; False: it came back."""


@event("link_connections_dropped", LINKS)
@dataclass(frozen=True, kw_only=True)
class LinkConnectionsDropped(Event):
    """reset_connections: the link's live connections were dropped once."""

    learner: int
    """The learner."""
    already_refused: bool
    """True when a refuse partition already held the link down (nothing to drop)."""


HOSTS = "supervisor (diloco_chaos/harness/hosts/netns.py)"


@event("hosts_swept", HOSTS)
@dataclass(frozen=True, kw_only=True)
class HostsSwept(Event):
    """Before its own hosts were made, the run removed what a supervisor that died without its clean-up (e.g.
    SIGKILLed) left behind: namespaces, veths and bridges named after a pid that no longer runs."""

    removed: list[str]
    """The names removed (namespaces, then links)."""


@event("hosts_ready", HOSTS)
@dataclass(frozen=True, kw_only=True)
class HostsReady(Event):
    """`[launch] hosts = "netns"`: each learner host is a network namespace with a veth on the run's bridge."""

    prefix: str
    """What every name the run made starts with (dc<pid, 6 hex><run, 2 hex>)."""
    bridge: str
    """The bridge in the root namespace."""
    syncer_address: str
    """The bridge's address: where the syncer (and the rendezvous store) listen for the hosts."""
    hosts: dict[str, dict[str, str]]
    """Learner -> {"netns", "address", "veth"}: its namespace, its address on the bridge, its veth end on the
    bridge."""


@event("hosts_removed", HOSTS)
@dataclass(frozen=True, kw_only=True)
class HostsRemoved(Event):
    """The run's namespaces, veths, bridge, qdiscs and nft tables were removed (at the end of every run)."""

    left: list[str]
    """What could not be removed, one line each (empty: nothing left)."""


@event("agent_connected", "supervisor (diloco_chaos/harness/hosts/remote.py)")
@dataclass(frozen=True, kw_only=True)
class AgentConnected(Event):
    """`[launch] hosts = "remote"`: the supervisor reached learner `learner`'s host agent and proved the agents'
    secret; the workers' events it ships are appended to this log from now on."""

    learner: int
    """The learner the agent's host runs."""
    address: str
    """The agent's host:port (`launch.agents`)."""
    agent_pid: int
    """The agent's pid on its host."""
    work_dir: str
    """This run's directory on the agent's host (the learner's spec, its workers' events, torchrun's log)."""
    local_address: str
    """This machine's address on its connection to the agent: where the syncer and the store listen."""
    clock_offset_s: float
    """The agent's CLOCK_MONOTONIC minus this machine's (0 when they are one clock), subtracted from the `t` of
    every event the agent ships."""
    rtt_s: float
    """Round trip of the clock sample the offset comes from (the offset's uncertainty is half of it)."""
    same_clock: bool
    """The agent's clock reading fell inside that round trip: one clock (one machine), `t` kept as written."""
