"""The `Hosts` protocol: where a run's learners live, as the supervisor sees it, whatever the launch mode.

Why: four launch modes (`[launch] hosts` x `backend`, docs/multi-host.md) differ in where the syncer listens,
what carries link faults, how a learner's processes start and how process chaos reaches them, and what must be
removed at the end. The supervisor (diloco_chaos/harness/run/supervisor.py) asks one `Hosts` object for each
of those and has no branch on the launch mode; diloco_chaos/harness/hosts/launch.py `open_hosts` alone reads
`[launch]` and picks the class. A new launch (a third-party trainer's launcher) is one more class implementing
`Hosts` and one more line in `open_hosts`.

The valid (hosts, backend) pairs (diloco_chaos/harness/config/check.py) and their classes:

- ("local", "local"): diloco_chaos/harness/hosts/local.py `LocalHosts`, the default: this machine's forkserver
  and loopback, link faults through Toxiproxy proxies (diloco_chaos/harness/hosts/link_proxies.py).
- ("netns", "local"): diloco_chaos/harness/hosts/netns_run.py `NetnsRun`: the same forked chips, each learner's
  in its own network namespace; link faults through tc and nft on its veth (links.backend = "kernel").
- ("netns", "torchrun"): diloco_chaos/harness/hosts/torchrun.py `TorchrunHosts` over a `NetnsRun`: each
  learner's chips are one torchrun job in its namespace; process chaos through each host's agent.
- ("remote", "torchrun"): diloco_chaos/harness/hosts/remote.py `RemoteHosts`: other machines' agents start
  torchrun; no link faults.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from diloco_chaos.chaos.links import LinkChaos
    from diloco_chaos.harness.learner.chip import ChipSpec


class HostsUnavailable(RuntimeError):
    """The launch mode cannot run here (not root, a tool missing, an agent unreachable or refusing us, a command
    that failed); the message says which and names the scenario key (the supervisor raises it as a RunFailed)."""


class Proc(Protocol):
    """A process of the run as the supervisor watches it (a multiprocessing.Process, a torchrun, a remote
    learner): `sentinel` becomes readable when it ends, `exitcode` is None until then."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    @property
    def sentinel(self) -> int: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...


class Spawner(Protocol):
    """The supervisor's registry of the run's processes: every process the hosts start goes through it, so it
    is watched, listed in processes.json and stopped at the end."""

    def start_process(self, name: str, target: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """Fork `target(*args)` from the run's forkserver as `name` and register it."""

    def register_process(self, name: str, proc: Proc) -> None:
        """Register a process started otherwise (a torchrun, a remote learner)."""


@dataclass(frozen=True)
class Routes:
    """Where each learner's chips connect to the syncer."""

    ports: dict[int, int]
    """Learner -> the port its link connects to for shard 0 (a proxy's, or the syncer's own)."""
    shard_ports: dict[int, tuple[int, ...]]
    """Learner -> the ports for shards 1..S-1 (syncer.shards = S > 1)."""

    @classmethod
    def direct(cls, learners: int, syncer_ports: list[int]) -> Routes:
        """Every learner straight to the syncer's shards."""
        return cls({m: syncer_ports[0] for m in range(learners)},
                   {m: tuple(syncer_ports[1:]) for m in range(learners)})


class Links(Protocol):
    """What carries a run's link faults: Toxiproxy proxies (diloco_chaos/harness/hosts/link_proxies.py RunLinks)
    or tc and nft rules on netns hosts' veths (diloco_chaos/harness/hosts/netns_run.py KernelRunLinks)."""

    @property
    def chaos(self) -> LinkChaos:
        """The link fault API (diloco_chaos/chaos/links.py) over them."""

    def close(self, timeout_s: float) -> None:
        """Remove every fault and what was made for them."""


class Hosts(Protocol):
    """One run's learner hosts. The supervisor calls, in this order: `open_hosts` (launch.py; before anything starts),
    `listen`, `connect` (once the syncer listens), `start_learner` / `start_chip` / `chip_pids` / `send` while
    the run goes on, and `close` exactly once on every way out (after it has stopped every process), even when
    `open_hosts` returned but `connect` raised. Nothing here waits longer than `timeouts.startup_s` (opening,
    connecting, a request to an agent) or `timeouts.shutdown_s` (closing the links)."""

    @property
    def listen(self) -> str:
        """The address on this machine where the syncer and the store listen, reachable from every host."""

    def connect(self, syncer_ports: list[int]) -> Routes:
        """Once the syncer's shards listen on `syncer_ports`: make what the learners' links go through
        (Toxiproxy proxies, kernel rules; with a torchrun launch also each host's agent) and return where each
        learner connects. HostsUnavailable if a host cannot be used; what was made is undone by `close`."""

    @property
    def link_chaos(self) -> LinkChaos | None:
        """What link faults act through (the FaultRunner's); None when the run's links carry none."""

    def start_learner(self, spec: ChipSpec) -> dict[int, Proc]:
        """Start every chip of learner `spec.learner` (a new generation: `spec` with rank 0) through the
        spawner; returns rank -> the process the supervisor watches for that chip (one launcher process may
        stand for all of them). Returns once started, not once ready."""

    def start_chip(self, spec: ChipSpec) -> Proc:
        """Start one repaired chip (`spec.rank`) that joins its running learner (recovery policy shrink).
        Launches that restart learners only whole raise NotImplementedError (validation keeps shrink away)."""

    def chip_pids(self, learner: int, chips: list[Proc]) -> list[int]:
        """Live pids of the learner's chips by rank, as `send` names them; `chips` are the processes the
        supervisor watches for its current members (an agent's host may see them otherwise)."""

    def send(self, learner: int, pids: list[int], sig: signal.Signals, children: bool) -> list[int]:
        """Signal those chips of `learner` (with `children`: their child processes too); the pids hit
        (diloco_chaos/chaos/processes.py Signaller)."""

    def close(self) -> None:
        """Tear down what the hosts made, in order: agents hung up, link faults and proxies or rules removed,
        then namespaces. Never raises; bounded by `timeouts.shutdown_s` per step."""

