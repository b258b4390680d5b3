"""The training loops of the torchft algorithms, one per descriptor `merge_unit` (diloco_chaos/harness/algorithms/
torchft_ddp.py "step", torchft_diloco.py "round"), run by a trainer rank (diloco_chaos/harness/targets/torchft/
trainer.py) on its `Rank`: the scenario's task, model and inner optimizer in a `LearnerCore`
(diloco_chaos/trainers/learner/core.py, reused so the inner step, its schedule, clipping and token count are the
built-in learners'), torchft's Manager, and the callbacks that write the records.

torchft_ddp: per step `start_quorum`, forward/backward, the gradients averaged inside the group (LearnerCore's
collective) and then across the quorum (`Manager.allreduce`), the optimizer step only when `should_commit`.
With torchft.ddp_api = "ddp_module" (`ddp_module_loop`) the same step goes through torchft's own DDP module, as
torchft's README trains: `OptimizerWrapper.zero_grad` starts the quorum, the loss is computed through
`torchft.ddp.DistributedDataParallel` (its comm hook allreduces each gradient bucket across the quorum during
backward), the gradients are then averaged inside the group, and `OptimizerWrapper.step` steps the inner AdamW
only if `should_commit`.
torchft_diloco: `torchft.local_sgd.DiLoCo` around the same inner loop; its optimizer hooks start the quorum,
allreduce one fragment's pseudo-gradient and apply the outer step; the loop sees a sync through the commit the
`torchft_commits` logger reported (observe.py `TorchftLogs.take_commit`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from diloco_chaos.harness.algorithms.base import MergeUnit
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.targets.torchft.observe import TorchftLogs, digest
from diloco_chaos.trainers.learner.core import LearnerCore
from diloco_chaos.trainers.messages import flatten, unflatten_into


@dataclass
class Rank:
    """One trainer rank's state, shared by the loops and the trainer."""

    sc: Scenario
    learner: int
    rank: int
    size: int
    core: LearnerCore
    manager: Any
    """torchft.Manager."""
    logs: TorchftLogs
    on_step: Callable[[int, float, int, float], None]
    """(inner step, loss, learner tokens, seconds spent in torchft) -> None: the `step` record."""
    on_sync: Callable[[int, bool, str], None]
    """(inner step, committed, global-weights digest) -> None: the `torchft_sync` record."""
    global_params: Callable[[], dict[str, torch.Tensor]] = field(default=lambda: {})
    """The global weights by parameter name (what global.pt holds), set by the loop."""
    tokens_per_sync: int = 0
    """Tokens one committed manager step of one replica group stands for (tokens_merged)."""


def _tokens(r: Rank, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    return r.core.task.batch_tokens(batch) * r.size



def _record_step(r: Rank, batch: tuple[torch.Tensor, torch.Tensor], loss: float, committed: bool,
                 t: tuple[float, float, float, float]) -> None:
    """One torchft_ddp step's records, on either path: its tokens, its compute time (t1..t2), the step (if
    committed; its time in torchft is the quorum t0..t1 and the commit t2..t3) and the sync with its digest."""
    core, named = r.core, r.core.named
    tokens = _tokens(r, batch)
    r.tokens_per_sync = tokens
    core.last_compute_s = t[2] - t[1]
    if committed:
        r.on_step(core.step, loss, tokens, (t[1] - t[0]) + (t[3] - t[2]))
    r.on_sync(core.step, committed, digest(named[n] for n in sorted(named)))

def ddp_loop(r: Rank) -> None:
    """torchft_ddp: train.steps manager steps, one quorum and one cross-group allreduce each."""
    core, m = r.core, r.manager
    named = core.named
    r.global_params = lambda: {n: p.detach().clone() for n, p in named.items()}
    while m.current_step() < r.sc.train.steps:
        t0 = time.perf_counter()
        m.start_quorum()
        step = m.current_step() + 1
        t1 = time.perf_counter()
        batch = core.task.train_batch(r.learner, r.rank, step)
        loss = core.forward_backward(*batch)
        core.allreduce_grads()  # inside the group (its ranks), when it has several
        t2 = time.perf_counter()
        grads = core.grads()
        flat = flatten(grads)
        m.allreduce(flat).wait()  # the average over the quorum's participants
        unflatten_into(flat, grads)
        committed = bool(m.should_commit())
        t3 = time.perf_counter()
        if committed:
            core.optimizer.step(step)  # also zeroes the gradients
            core.step = m.current_step()
        else:
            core.optimizer.opt.zero_grad(set_to_none=False)
        _record_step(r, batch, loss, committed, (t0, t1, t2, t3))


def ddp_module_loop(r: Rank) -> None:
    """torchft_ddp through torchft.ddp.DistributedDataParallel and torchft.optim.OptimizerWrapper (torchft's
    README): train.steps manager steps. The cross-group allreduce runs inside backward (the module's comm hook,
    one `Manager.allreduce` per bucket), so the step's compute time includes it; the time in torchft is the
    quorum (zero_grad) and the commit (step). With several ranks the hook averages each rank's gradients over
    the quorum and LearnerCore's collective then averages those inside the group: both are means, so the result
    is the mean over every rank of every participating group, as on the manager path. The inner optimizer's
    clipping and lr schedule are applied before `OptimizerWrapper.step` (a step it discards wastes them)."""
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    core, m = r.core, r.manager
    named = core.named
    r.global_params = lambda: {n: p.detach().clone() for n, p in named.items()}
    model = DistributedDataParallel(m, core.model)
    opt = OptimizerWrapper(m, core.optimizer.opt)
    while m.current_step() < r.sc.train.steps:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)  # start_quorum (healing, with use_async_quorum=False), then zeroes
        step = m.current_step() + 1
        t1 = time.perf_counter()
        batch = core.task.train_batch(r.learner, r.rank, step)
        loss_t = core.task.loss(model, batch)
        loss_t.backward()  # the comm hook: Manager.allreduce of each gradient bucket across the quorum
        loss = float(loss_t.detach())
        core.allreduce_grads()  # inside the group (its ranks), when it has several
        core.optimizer.prepare(step)
        t2 = time.perf_counter()
        before = m.current_step()
        opt.step()  # should_commit; the inner AdamW steps only if it is True
        committed = m.current_step() > before
        t3 = time.perf_counter()
        if committed:
            core.step = m.current_step()
        _record_step(r, batch, loss, committed, (t0, t1, t2, t3))


def fragments(core: LearnerCore) -> list[nn.Module]:
    """The model's parameters in diloco.fragments modules, by the built-in partition of its tensors
    (diloco_chaos/trainers/fragments.py `partition_tensors`): the same Parameter objects, so torchft's outer step
    writes the model's own parameters."""
    out = []
    for names in core.partition:
        frag = nn.Module()
        for name in names:
            frag.register_parameter(name.replace(".", "__"), core.named[name])
        out.append(frag)
    return out


def diloco_loop(r: Rank) -> None:
    """torchft_diloco: train.steps inner steps; a fragment sync (one manager step) every sync_every / fragments."""
    from torchft.local_sgd import DiLoCo

    core, m, d = r.core, r.manager, r.sc.diloco
    frags = fragments(core)
    outer = [torch.optim.SGD(f.parameters(), lr=d.outer_lr, momentum=d.outer_momentum, nesterov=True) for f in frags]
    syncs = r.sc.train.steps * d.fragments // d.sync_every
    with DiLoCo(m, frags, core.optimizer.opt, outer, sync_every=d.sync_every, fragment_sync_delay=d.overlap,
                backup_device=torch.device("cpu"), pin_memory=False) as diloco:

        def global_params() -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {}
            for frag in diloco._fragments:  # torchft 0.2.0 private: the last synced (global) weights
                for key, t in frag.original_parameters.items():
                    out[key.replace("__", ".")] = t.detach().clone()
            return out

        r.global_params = global_params
        while m.current_step() < syncs:
            t0 = time.perf_counter()
            batch = core.task.train_batch(r.learner, r.rank, core.step + 1)
            loss = core.forward_backward(*batch)
            core.allreduce_grads()
            t1 = time.perf_counter()
            core.step += 1
            core.optimizer.step(core.step)  # DiLoCo's hooks: quorum, fragment allreduce, should_commit, outer step
            t2 = time.perf_counter()
            tokens = _tokens(r, batch)
            r.tokens_per_sync = tokens * d.sync_every // d.fragments
            commit = r.logs.take_commit()
            core.last_compute_s = t1 - t0
            r.on_step(core.step, loss, tokens, t2 - t1)
            if commit is not None:
                g = global_params()
                r.on_sync(core.step, commit, digest(g[n] for n in sorted(g)))


LOOPS: dict[MergeUnit, Callable[[Rank], None]] = {"step": ddp_loop, "round": diloco_loop}
"""The loop of each torchft descriptor's merge unit."""


def loop_of(sc: Scenario, unit: MergeUnit) -> Callable[[Rank], None]:
    """The loop a trainer runs: its merge unit's, or torchft's DDP module for torchft.ddp_api = "ddp_module"
    (validation allows that for torchft_ddp, merge unit "step", only)."""
    if unit == "step" and sc.torchft.ddp_api == "ddp_module":
        return ddp_module_loop
    return LOOPS[unit]
