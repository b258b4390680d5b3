"""Entry point of one torchft trainer process: rank `rank` of replica group `learner` (learner m is replica group
m, topology.chips_per_learner ranks), started from the run's forkserver by diloco_chaos/harness/targets/torchft/
run.py. On netns hosts (`[launch] hosts = "netns"`) it first enters its group's network namespace and a UTS
namespace of its own whose hostname is the group's address (`enter_group_host`).

It builds the scenario's task and model exactly as a built-in chip does (`scenario_task`, `LearnerCore`: the same
seed, so every group starts from the same weights; the batch of learner m's shard for (rank, step); the same
inner optimizer), joins its group's store (rank 0 hosts it) and, with several ranks, an intra-group Gloo group,
then torchft's `ProcessGroupGloo` and `Manager` with every timeout from `[torchft]` (never a library default;
the TORCHFT_* environment overrides are removed first), and runs the loop of its algorithm's merge unit
(loops.py; torchft's DDP module for torchft.ddp_api = "ddp_module"). It writes chip_start, step (rank 0),
torchft_sync (every rank), torchft_quorum / torchft_commit (observe.py), learner_done (rank 0) or chip_error (the
exception and where it was raised); rank 0 of group 0 also writes the initial eval (kind periodic, trigger
start); rank 0 of the first group to finish writes global.pt (`_save_first`), which the post-run phase evaluates:
any group may be the one a fault ended for good (a kill whose repair came after the others finished is not
restarted), and the replica groups' committed global weights agree (replicas_agree).
"""

from __future__ import annotations

import ctypes
import datetime
import math
import os
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog
from diloco_chaos.harness.record.learner import ChipError, ChipStart, LearnerDone, LearnerNonfinite, Step
from diloco_chaos.harness.record.syncer import Eval
from diloco_chaos.harness.record.torchft import TorchftSync
from diloco_chaos.harness.run.procutil import become_run_process, cpu_seconds, print_error, stderr_to_file
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, atomic_torch_save
from diloco_chaos.harness.targets.torchft.loops import Rank, loop_of
from diloco_chaos.harness.targets.torchft.observe import TorchftLogs
from diloco_chaos.trainers.learner.core import CollectiveFailed, LearnerCore
from diloco_chaos.trainers.task import evaluate

TORCHFT_ENV = ("TORCHFT_TIMEOUT_SEC", "TORCHFT_QUORUM_TIMEOUT_SEC", "TORCHFT_CONNECT_TIMEOUT_SEC",
               "TORCHFT_QUORUM_RETRIES", "TORCHFT_LIGHTHOUSE", "TORCHFT_MANAGER_PORT")
"""Environment variables that would override the Manager's explicit arguments: removed in the trainer."""
CLONE_NEWUTS = 0x04000000


@dataclass(frozen=True)
class TrainerSpec:
    """What one trainer rank needs (pickled to the forkserver child)."""

    run_dir: str
    scenario: Scenario
    learner: int
    rank: int
    size: int
    lighthouse: str
    """The Lighthouse's address, http://HOST:PORT."""
    store_port: int
    """The group's TCPStore (rank 0 hosts it)."""
    parent_pid: int
    plugins: tuple[algorithms.PluginRef, ...] = ()
    generation: int = 0
    """The group's generation: 0, then one more each time the supervisor restarts the group after a fault."""
    netns: str = ""
    """The group's network namespace on netns hosts ("": this machine's)."""
    address: str = "127.0.0.1"
    """The group's address: its store's, the one its Manager advertises, and (on netns hosts) its hostname."""


def enter_group_host(netns: str, address: str) -> None:
    """Enter the group's network namespace (diloco_chaos/harness/hosts/netns.py `enter_netns`), then a UTS namespace
    of this process whose hostname is `address`. Why the hostname: torchft's HTTP checkpoint server advertises
    http://{socket.gethostname()}:port to the peers that heal from it, and Gloo's default device is the address
    the hostname resolves to; the machine's name would resolve to each namespace's own loopback. Gloo must not be
    pinned to `lo` (enter_netns's choice for builtin chips): the pairs to other groups cross the veth. Called
    first thing in the process, while it has one thread (setns and unshare act on the calling thread)."""
    from diloco_chaos.harness.hosts.netns import enter_netns

    enter_netns(netns)
    os.environ.pop("GLOO_SOCKET_IFNAME", None)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.unshare(CLONE_NEWUTS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWUTS): {os.strerror(err)}")
    socket.sethostname(address)


class GroupCollective:
    """The Gloo group of one replica group's ranks (the default process group of the trainer process), bounded by
    torchft.timeout_s: LearnerCore averages the gradients over it (the `Collective` of
    diloco_chaos/trainers/learner/core.py). A replica group that loses a rank is not re-formed in this slice."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def allreduce_mean_(self, flat: torch.Tensor) -> None:
        try:
            dist.all_reduce(flat)
        except RuntimeError as e:
            raise CollectiveFailed(f"intra-group allreduce failed: {e}") from e
        flat /= self.size

    def broadcast_(self, flat: torch.Tensor, src: int = 0) -> None:
        dist.broadcast(flat, src)

    def pending_reform(self) -> bool:
        return False

    def reform(self) -> None:
        raise CollectiveFailed("a torchft replica group is not re-formed (it restarts as a whole)")


def raised_at(e: BaseException) -> str:
    """Where `e` was raised: its traceback's innermost frame, "file:line in function", the file relative to
    site-packages for a library's (torchft/ddp.py:76 in _comm_hook), so that a chip_error whose message says
    little (a bare AssertionError) still names the code that raised it."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return "unknown"
    f = frames[-1]
    path = f.filename.replace(os.sep, "/")
    path = path.split("site-packages/", 1)[1] if "site-packages/" in path else path
    return f"{path}:{f.lineno} in {f.name}"


def _initial_eval(sc: Scenario, core: LearnerCore, events: EventLog) -> None:
    loss, _ = evaluate(core.task, core.model, core.task.eval_batches(sc.eval.batches))
    events.write(Eval(kind="periodic", version=0, tokens_merged=0.0, loss=loss, trigger="start"))


def _save_first(state: dict[str, object], run_dir: str, m: int) -> None:
    """global.pt from group m, unless a group that finished earlier wrote it: saved whole under the group's own
    name, then hard-linked into place (atomic, and refused when the file exists), then the group's name removed."""
    own = os.path.join(run_dir, f"global.learner{m}.pt")
    atomic_torch_save(state, own)
    try:
        os.link(own, os.path.join(run_dir, CHECKPOINT_FILE))
    except FileExistsError:
        pass
    finally:
        os.unlink(own)


def trainer_main(spec: TrainerSpec) -> None:
    if spec.netns:  # before any thread or socket exists: everything the rank and torchft open lives there
        enter_group_host(spec.netns, spec.address)
    become_run_process(spec.parent_pid)
    algorithms.load_plugins(spec.plugins)
    for key in TORCHFT_ENV:
        os.environ.pop(key, None)
    m, r = spec.learner, spec.rank
    proc = f"learner{m}.chip{r}"
    stderr_to_file(spec.run_dir, proc)
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), proc)
    events.write(ChipStart(learner=m, rank=r, size=spec.size, generation=spec.generation))
    try:
        _train(spec, events)
    except Exception as e:
        print_error(e)
        events.write(ChipError(learner=m, rank=r, error=f"{type(e).__name__}: {e} (raised at {raised_at(e)})"))
        events.close()
        os._exit(1)  # torchft's threads (heartbeats, futures) would keep the interpreter from exiting
    events.close()
    os._exit(0)


def _train(spec: TrainerSpec, events: EventLog) -> None:
    from torchft import Manager, ProcessGroupGloo

    sc, m, r, t = spec.scenario, spec.learner, spec.rank, spec.scenario.torchft
    timeout = datetime.timedelta(seconds=t.timeout_s)
    store = dist.TCPStore(spec.address, spec.store_port, spec.size, is_master=(r == 0), wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=sc.timeouts.startup_s))
    task = scenario_task(sc)
    core = LearnerCore(m, task, sc.train, sc.diloco, sc.seed)
    task.train_batch(m, r, 1)  # loads the shard now, before the group waits on this rank
    if spec.size > 1:
        dist.init_process_group("gloo", store=dist.PrefixStore("intra", store), rank=r, world_size=spec.size,
                                timeout=timeout)
        core.collective = GroupCollective(r, spec.size)
    if m == 0 and r == 0 and spec.generation == 0:
        _initial_eval(sc, core, events)
    logs = TorchftLogs(events, m, r)
    logs.install()

    def state_dict() -> dict[str, object]:
        return {"model": core.model.state_dict(), "optimizer": core.optimizer.opt.state_dict(), "step": core.step}

    def load_state_dict(sd: dict[str, object]) -> None:
        core.model.load_state_dict(sd["model"])  # type: ignore[arg-type]
        core.optimizer.opt.load_state_dict(sd["optimizer"])  # type: ignore[arg-type]
        core.step = int(sd["step"])  # type: ignore[call-overload]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout), min_replica_size=t.min_replicas, load_state_dict=load_state_dict,
        state_dict=state_dict, use_async_quorum=False, replica_id=f"learner{m}", rank=r, world_size=spec.size,
        store_addr=spec.address, store_port=spec.store_port, lighthouse_addr=spec.lighthouse, hostname=spec.address,
        timeout=timeout, quorum_timeout=datetime.timedelta(seconds=t.quorum_timeout_s),
        connect_timeout=datetime.timedelta(seconds=t.connect_timeout_s), init_sync=False,
        quorum_retries=t.quorum_retries)
    nonfinite = False

    def on_step(step: int, loss: float, tokens: int, sync_s: float) -> None:
        nonlocal nonfinite
        if r != 0:
            return
        if not nonfinite and not math.isfinite(loss):
            nonfinite = True
            events.write(LearnerNonfinite(learner=m, step=step, loss=loss,
                                          error=f"training loss {loss} at step {step}: the learner's work is "
                                                "non-finite"))
        events.write(Step(learner=m, step=step, loss=round(loss, 5), tokens=tokens, chips=spec.size,
                          compute_s=round(core.last_compute_s, 5), sync_s=round(sync_s, 5)))

    last_step = 0  # the manager step at this rank's previous sync (a new process starts at 0)

    def on_sync(inner: int, committed: bool, digest: str) -> None:
        nonlocal last_step
        err = manager.errored()
        step = manager.current_step()
        # healed: torchft loaded a live peer's state in this step's quorum. `_healing` is already reset once
        # should_commit returned, so a jump of the step by more than one commit shows it too (a restarted
        # group's first sync, or a dropped group catching up)
        healed = bool(manager._healing) or step - last_step > 1
        last_step = step
        events.write(TorchftSync(learner=m, rank=r, step=step, inner_step=inner,
                                 quorum_id=int(manager._quorum_id), participants=manager.num_participants(),
                                 committed=committed, healed=healed, digest=digest,
                                 error=None if err is None else str(err)))

    rank = Rank(sc, m, r, spec.size, core, manager, logs, on_step, on_sync)
    t0 = time.monotonic()
    try:
        loop_of(sc, algorithms.get(sc.algorithm).merge_unit)(rank)
        if r == 0:
            tokens = float(manager.batches_committed() * rank.tokens_per_sync)
            _save_first({"params": rank.global_params(), "merges": manager.current_step(),
                         "algorithm": sc.algorithm, "tokens_merged": tokens}, spec.run_dir, m)
    finally:
        manager.shutdown(wait=False)
    if r == 0:
        events.write(LearnerDone(learner=m, steps=core.step, finite=core.finite(),
                                 timing={"train": round(time.monotonic() - t0, 4)}, cpu_s=cpu_seconds()))
    del store
