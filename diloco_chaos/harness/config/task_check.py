"""The scenario's task, resolved and checked before any process starts; and the run's memory estimate.

What: `scenario_task(sc)` builds the task a scenario names (diloco_chaos/trainers/task.py) with the scenario's context,
cached per (factory, args, path, context), so that every process of the harness side (validation, supervisor,
syncer, evaluator, report) builds it the same way and validating a scenario again costs nothing.
`task_rules` is the scenario check's part for `[task]`: the factory imports, its arguments fit, it returns a
Task whose model builds, has enough tensors for diloco.fragments, names existing embeddings, and whose first
training batch gives a finite scalar loss; each failure is an error naming `task.factory` or `task.args` (exit
2). `with_task_path` fills task.path with the directory the module was found under, so child processes
(forkserver children, whose sys.path is the forkserver's) and replays import the same module.

`memory_estimate` is the run's resident memory by its parts (chips' replicas with gradients and AdamW
moments, the link processes' snapshots, the syncer's global model, outer momentum, pushes and anchors, and a
fixed cost per process), compared against the machine's available RAM by `check_memory`: a run that cannot
fit is refused before it starts, with the figures, instead of being killed by the OOM killer halfway.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
import torch
from torch.overrides import TorchFunctionMode

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.sections import Found, ScenarioError
from diloco_chaos.trainers.task import (
    Task,
    TaskContext,
    TaskError,
    embedding_names,
    import_factory,
    load_task,
    parameters,
)

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario

_CACHE: dict[tuple[Any, ...], Task] = {}
_CACHE_MAX = 16


def task_context(sc: Scenario) -> TaskContext:
    return TaskContext(seed=sc.seed, learners=sc.topology.learners, batch_size=sc.data.batch_size,
                       model=sc.model, data=sc.data)


def _key(sc: Scenario) -> tuple[Any, ...]:
    try:
        args = json.dumps(sc.task.args, sort_keys=True)
    except (TypeError, ValueError):
        args = repr(sorted(sc.task.args.items()))
    return (sc.task.factory, args, sc.task.path, task_context(sc))


def scenario_task(sc: Scenario) -> Task:
    """The task `sc` names, built with its context (cached). Raises TaskError naming what is wrong."""
    key = _key(sc)
    task = _CACHE.get(key)
    if task is None:
        if not isinstance(sc.task.args, dict):
            raise TaskError(f"task.args = {sc.task.args!r}: must be a table ([task.args])")
        task = load_task(sc.task.factory, sc.task.args, task_context(sc), sc.task.path)
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = task
    return task


_RANDOM_FILLS = frozenset({"normal_", "uniform_", "random_", "bernoulli_", "exponential_", "log_normal_",
                           "cauchy_", "geometric_", "erfinv_"})


class _SkipMetaInit(TorchFunctionMode):
    """Leaves a meta tensor's random initialization undone: a meta tensor holds no values to fill, and torch
    runs `normal_` on meta through its Python reference, whose first call imports torch._dynamo (about 2 s of
    CPU that every `diloco-chaos run` would pay before its first process starts)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _RANDOM_FILLS:
            t = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(t, torch.Tensor) and t.is_meta:
                return t
        return func(*args, **kwargs)


def shape_model(task: Task) -> torch.nn.Module:
    """The task's model built on the meta device (shapes, no storage, no initial values), so a model too large
    for this machine can be counted; built for real when its code cannot run on meta."""
    try:
        with torch.device("meta"), _SkipMetaInit():
            return task.build_model(0)
    except Exception:  # noqa: BLE001 - e.g. a factory that reads values back; the real build reports its errors
        return task.build_model(0)


def param_count(sc: Scenario) -> int:
    """Elements of the task's model parameters (each tied tensor once)."""
    return sum(p.numel() for p in parameters(shape_model(scenario_task(sc))).values())


def tokens_per_batch(sc: Scenario) -> int:
    """What one chip's batch counts for the token weights (the same at every step for the built-in tasks)."""
    task = scenario_task(sc)
    return task.batch_tokens(task.train_batch(0, 0, 1))


def with_task_path(sc: Scenario) -> Scenario:
    """`sc` with task.path set to the directory its factory's module was found under; unchanged when set, or
    when that is where the harness itself is imported from (the built-in tasks: every process finds them)."""
    import dataclasses

    import diloco_chaos.trainers.task as own

    if sc.task.path:
        return sc
    _, root = import_factory(sc.task.factory)
    if not root or root == os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(str(own.__file__))))):
        return sc
    return dataclasses.replace(sc, task=dataclasses.replace(sc.task, path=root))


_RULES_CACHE: dict[tuple[Any, ...], list[tuple[str, str]]] = {}


def task_rules(sc: Scenario, found: Found) -> None:
    """Report what is wrong with the scenario's task (see the module doc); nothing when its inputs were refused.
    The verdict is cached per task and the fields it reads, so validating the same scenario again is free."""
    import dataclasses

    inputs = [f"{table}.{f.name}" for table in ("task", "data", "model")
              for f in dataclasses.fields(getattr(sc, table))]
    if not found.ok("seed", "topology.learners", *inputs):
        return
    key = (*_key(sc), sc.diloco.fragments, sc.diloco.embedding_tensors, found.ok("diloco.fragments"))
    if key not in _RULES_CACHE:
        mine = Found()
        _task_problems(sc, mine, found.ok("diloco.fragments"))
        if len(_RULES_CACHE) >= _CACHE_MAX:
            _RULES_CACHE.pop(next(iter(_RULES_CACHE)))
        _RULES_CACHE[key] = [(k, str(e)) for k, e in zip(mine.keys, mine.errors, strict=True)]
    for k, msg in _RULES_CACHE[key]:
        found.add(k, msg)


def _task_problems(sc: Scenario, found: Found, fragments_ok: bool) -> None:
    try:
        task = scenario_task(sc)
    except TaskError as e:
        found.add("task.factory", str(e))
        return
    f = sc.task.factory
    try:
        shape = shape_model(task)
    except Exception as e:
        found.add("task.factory", f"task.factory = {f!r}: build_model failed: {type(e).__name__}: {e}")
        return
    if not isinstance(shape, torch.nn.Module):
        found.add("task.factory", f"task.factory = {f!r}: build_model returned {type(shape).__name__}, "
                                  "not a torch.nn.Module")
        return
    n_tensors = len(parameters(shape))
    if n_tensors == 0:
        found.add("task.factory", f"task.factory = {f!r}: the model has no parameters to train")
        return
    if sc.diloco.fragments > n_tensors and fragments_ok:
        found.add("diloco.fragments", f"diloco.fragments = {sc.diloco.fragments}: must be in [1, {n_tensors}] "
                                      "(tensors in the model)")
    names = sc.diloco.embedding_tensors or task.embedding_tensors
    try:
        embedding_names(shape, names)
    except KeyError as e:
        key = "diloco.embedding_tensors" if sc.diloco.embedding_tensors else "task.factory"
        found.add(key, f"{key}: embedding tensor {e.args[0]!r} is no parameter of the model "
                       f"(its parameters: {', '.join(list(parameters(shape))[:8])}...)")
    if 4 * 4 * sum(p.numel() for p in parameters(shape).values()) > psutil.virtual_memory().available:
        return  # one replica with its gradients and moments cannot even be tried here: check_memory refuses it
    try:
        model = task.build_model(sc.seed)
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"build_model returned {type(model).__name__}, not a torch.nn.Module")
        batch = task.train_batch(0, 0, 1)
        if not (isinstance(batch, tuple) and len(batch) == 2):
            raise TypeError(f"train_batch returned {type(batch).__name__}, not an (inputs, targets) tuple")
        loss = task.loss(model, batch)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and bool(torch.isfinite(loss))):
            raise TypeError(f"loss returned {loss!r}, not a finite scalar tensor")
        tokens = task.batch_tokens(batch)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise TypeError(f"batch_tokens returned {tokens!r}, not a positive int")
        if not task.eval_batches(1):
            raise TypeError("eval_batches(1) returned no batch")
    except Exception as e:
        found.add("task.factory", f"task.factory = {f!r}: {type(e).__name__}: {e}")


PROCESS_OVERHEAD_BYTES = 64 * 2**20
"""Unique resident memory of one run process (chip, link process, syncer) besides its model: they fork from a
forkserver that imported torch, so what they share with it is counted once, in FIXED_OVERHEAD_BYTES. Twice the
largest measured (docs/api.md)."""
FIXED_OVERHEAD_BYTES = 512 * 2**20
"""The supervisor and the forkserver, each with torch imported (docs/api.md has the measured figures)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """A run's resident memory by its parts, in bytes."""

    params: int
    """Elements of the model's parameters."""
    chips: int
    """Every chip: replica, gradients, two AdamW moments and the step's snapshot copy (5 x params x 4 B)."""
    links: int
    """Every learner's link process: its shared snapshot and the merged fragments it holds (2 x params x 4 B)."""
    syncer: int
    """The syncer: global model, outer momentum, eval copy, one push per learner and the anchored versions."""
    processes: int
    """PROCESS_OVERHEAD_BYTES for each chip, link process and the syncer, plus FIXED_OVERHEAD_BYTES."""

    @property
    def total(self) -> int:
        return self.chips + self.links + self.syncer + self.processes


def memory_estimate(sc: Scenario) -> MemoryEstimate:
    n = param_count(sc)
    m, c = sc.topology.learners, sc.topology.chips_per_learner
    anchors = sc.diloco.anchor_history if sc.diloco.outer_anchor == "base" else 0
    fp = 4 * n
    return MemoryEstimate(params=n, chips=m * c * 5 * fp, links=m * 2 * fp, syncer=(3 + m + anchors) * fp,
                          processes=(m * c + m + 1) * PROCESS_OVERHEAD_BYTES + FIXED_OVERHEAD_BYTES)


def check_memory(sc: Scenario, available: int | None = None) -> MemoryEstimate:
    """The run's estimate; ScenarioError naming the figures when it exceeds the available RAM."""

    est = memory_estimate(sc)
    avail = psutil.virtual_memory().available if available is None else available
    if est.total > avail:
        mib = 2**20
        raise ScenarioError(
            f"memory: the run needs about {math.ceil(est.total / mib):,} MiB but {avail // mib:,} MiB are available: "
            f"{sc.topology.learners} learners x {sc.topology.chips_per_learner} chips x {est.params:,} parameters "
            f"x 5 copies (weights, gradients, AdamW moments, snapshot) = {est.chips // mib:,} MiB, link processes "
            f"{est.links // mib:,} MiB, syncer {est.syncer // mib:,} MiB, "
            f"{(est.processes - FIXED_OVERHEAD_BYTES) // PROCESS_OVERHEAD_BYTES} processes x "
            f"{PROCESS_OVERHEAD_BYTES // mib} MiB + {FIXED_OVERHEAD_BYTES // mib} MiB (supervisor, forkserver) = "
            f"{est.processes // mib:,} MiB; use fewer learners or chips, or a smaller model")
    return est


def fragment_bytes(sc: Scenario) -> int:
    """Average bytes of one fragment on the wire (float32), for scaling WAN profiles."""
    n = param_count(sc)
    return n * 4 // (sc.diloco.fragments if algorithms.get(sc.algorithm).fragmented else 1)
