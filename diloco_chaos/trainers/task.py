"""The task interface: what a learner trains, on which data, with which loss.

What: a `Task` builds the model (seeded: the same seed gives the same weights in every process), yields the
training batch of (learner, chip, step) from that learner's shard as a pure function of its arguments (a
restarted or replayed learner sees the same data), yields held-out eval batches, computes the loss, says how
many tokens (or samples) a batch counts for the token weights, and names the tensors the merge treats as
embeddings. A scenario names its task by `[task] factory = "package.module:function"`; the function is
called as `function(ctx: TaskContext, **args)` with `[task.args]` and returns a `Task`. The byte-level LM the
harness started with is one task (diloco_chaos/trainers/tasks/byte_lm.py) among the built-in ones (`BUILTIN_TASKS`).

Why here, beside the model and the loops: the learners, the syncer, the evaluator and the report all need the
same model and loss, and diloco_chaos/trainers/ must not import the harness; `load_task` resolves a factory with
importlib alone, so a child process imports it by the same path as the process that checked it.

Generic over the model: the parameters are `model.named_parameters()` (tied weights appear once, under their
first name: `embedding_names` maps an alias the task names to it); buffers (batch-norm running statistics) are
not averaged across learners, each replica keeps its own, and the global model's are re-estimated on training
batches before every evaluation (`recalibrate_buffers`, the way SWA re-estimates an averaged model's).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from diloco_chaos.trainers.data import DataConfig
from diloco_chaos.trainers.model import ModelConfig

Batch = tuple[Tensor, Tensor]
"""(inputs, targets) of one chip's step, or of one eval batch."""

BUILTIN_TASKS: dict[str, str] = {
    "byte_lm": "diloco_chaos.trainers.tasks.byte_lm:byte_lm",
    "image_cnn": "diloco_chaos.trainers.tasks.image_cnn:image_cnn",
    "regression_mlp": "diloco_chaos.trainers.tasks.regression_mlp:regression_mlp",
}
"""Short name -> factory of the tasks that ship with the harness (`diloco-chaos tasks` lists them)."""

DEFAULT_FACTORY = BUILTIN_TASKS["byte_lm"]


@dataclass(frozen=True)
class TaskConfig:
    """The scenario's `[task]` table: which task the learners train."""

    factory: str = DEFAULT_FACTORY
    """"package.module:function" returning a Task when called as function(ctx: TaskContext, **args), or the name
    of a built-in task (byte_lm, image_cnn, regression_mlp; `diloco-chaos tasks`). The module is imported from
    sys.path, else from `path`, else from the working directory. Default: the byte LM."""
    args: dict[str, Any] = field(default_factory=dict)
    """`[task.args]`: keyword arguments passed through to the factory (a table; its keys are the factory's)."""
    path: str = ""
    """Directory the factory's module is imported from in every process. Empty: filled in before the run with
    the directory it was found under (unless that is where the harness itself is, as for the built-in tasks), so
    the run's processes (and a replay) import the same module."""


@dataclass(frozen=True)
class TaskContext:
    """What a task factory is told about the run it is built for."""

    seed: int = 0
    """The scenario's seed (model init, data order)."""
    learners: int = 1
    """M, the number of learners: the training data is cut into this many disjoint shards."""
    batch_size: int = 8
    """Examples per chip per inner step (the scenario's data.batch_size)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The scenario's [model] table: the byte LM's shape (other tasks take their shape from [task.args])."""
    data: DataConfig = field(default_factory=DataConfig)
    """The scenario's [data] table: the byte LM's corpus and holdout (other tasks ignore it but batch_size)."""


class Task(ABC):
    """A training setup the harness runs under faults. Subclass it and return one from a factory."""

    name: str = "task"
    """Shown in listings and errors."""
    embedding_tensors: tuple[str, ...] = ()
    """Parameter names merged by a plain weighted mean instead of RDA (the paper: embeddings lack
    near-orthogonality). Default: none. An alias of a tied tensor counts for the tensor."""

    @abstractmethod
    def build_model(self, seed: int) -> nn.Module:
        """The model with weights drawn from `seed` (same seed, same weights, in every process)."""

    @abstractmethod
    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        """The batch chip `chip` of learner `learner` trains on at inner step `step` (from 1), from that
        learner's shard; a pure function of its arguments and the task's seed."""

    @abstractmethod
    def eval_batches(self, max_batches: int) -> list[Batch]:
        """Up to `max_batches` fixed held-out batches, in order (the same on every call)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        """The scalar mean loss of `model` on `batch` (differentiable)."""

    def batch_tokens(self, batch: Batch) -> int:
        """What a batch counts for the token weights (c_tokens): its number of examples by default."""
        return int(batch[0].shape[0])

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, float]:
        """Extra held-out figures of one eval batch (e.g. accuracy), averaged over the eval batches and
        reported beside the loss. Default: none."""
        return {}


class TaskError(ValueError):
    """A task factory cannot be resolved or its task is unusable; the message names what is wrong."""


def split_factory(factory: str) -> tuple[str, str]:
    """("package.module", "function") of "package.module:function"; TaskError when malformed."""
    module, sep, func = factory.partition(":")
    if not sep or not module or not func or not all(p.isidentifier() for p in module.split(".")) \
            or not all(p.isidentifier() for p in func.split(".")):
        raise TaskError(f"task.factory = {factory!r}: must be 'package.module:function'")
    return module, func


def import_factory(factory: str, path: str = "") -> tuple[Any, str]:
    """Import the factory function; returns (function, the directory its top-level package was found under).

    The module is looked up on sys.path, then under `path` (task.path) and the working directory, which are
    put on sys.path when it is found there: a module beside a user's scenario imports with the console script
    too, and a child process imports it by the same directory."""
    factory = resolve_factory(factory)
    module, func = split_factory(factory)
    extra = [d for d in (path, os.getcwd()) if d]
    try:
        mod = _import(module, extra)
    except ModuleNotFoundError as e:
        if _is_prefix(e.name, module):
            raise TaskError(f"task.factory = {factory!r}: no module named {e.name!r} (looked on sys.path, "
                            f"in {', '.join(repr(d) for d in extra)})") from None
        raise TaskError(f"task.factory = {factory!r}: importing {module!r} failed: {type(e).__name__}: {e}") from e
    except Exception as e:
        raise TaskError(f"task.factory = {factory!r}: importing {module!r} failed: {type(e).__name__}: {e}") from e
    obj: Any = mod
    for part in func.split("."):
        if not hasattr(obj, part):
            raise TaskError(f"task.factory = {factory!r}: module {module!r} has no function {func!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TaskError(f"task.factory = {factory!r}: {func!r} in {module!r} is not callable")
    return obj, _root_of(mod, module)


def _is_prefix(name: str | None, module: str) -> bool:
    """Whether `name` (a ModuleNotFoundError's) is `module` or one of its parent packages."""
    return name is not None and (module == name or module.startswith(name + "."))


def _import(module: str, extra: list[str]) -> Any:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if not _is_prefix(e.name, module):
            raise  # the module itself imports something missing: report that
        importlib.invalidate_caches()
        for d in extra:
            d = os.path.abspath(d)
            if d not in sys.path:
                sys.path.insert(0, d)
                try:
                    return importlib.import_module(module)
                except ModuleNotFoundError as again:
                    if not _is_prefix(again.name, module):
                        raise  # found there, but it imports something missing
                    sys.path.remove(d)
        raise


def _root_of(mod: Any, module: str) -> str:
    f = getattr(mod, "__file__", None)
    if not f:
        return ""
    root = os.path.dirname(os.path.abspath(f))
    depth = module.count(".") + (1 if os.path.basename(f) == "__init__.py" else 0)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def resolve_factory(factory: str) -> str:
    """The "module:function" of `factory`, a built-in task's name resolved."""
    return BUILTIN_TASKS.get(factory, factory)


def load_task(factory: str, args: Mapping[str, Any], ctx: TaskContext, path: str = "") -> Task:
    """Build the task a scenario names: import `factory` (or a built-in name), call it with `ctx` and `args`,
    check the result. TaskError names what is wrong (module, function, arguments or return type)."""
    factory = resolve_factory(factory)
    fn, _ = import_factory(factory, path)
    try:
        inspect.signature(fn).bind(ctx, **args)
    except TypeError as e:
        raise TaskError(f"task.factory = {factory!r}: task.args {dict(args)!r} do not fit its signature: {e}") \
            from None
    except ValueError:
        pass  # no signature to inspect (a builtin): the call below says
    try:
        task = fn(ctx, **args)
    except Exception as e:
        raise TaskError(f"task.factory = {factory!r} with task.args {dict(args)!r} failed: "
                        f"{type(e).__name__}: {e}") from e
    if not isinstance(task, Task):
        raise TaskError(f"task.factory = {factory!r} returned {type(task).__name__}, "
                        "not a diloco_chaos.trainers.task.Task "
                        "(subclass it: build_model, train_batch, eval_batches, loss)")
    return task


def parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The model's parameters by name, each once (a tied tensor under its first name): what is trained,
    partitioned into fragments, sent and merged."""
    return dict(model.named_parameters())


def embedding_names(model: nn.Module, names: Iterable[str]) -> tuple[str, ...]:
    """The parameter names (as `parameters` keys them) of the tensors `names` lists, aliases of tied tensors
    resolved to their first name. KeyError for a name that is no parameter of the model."""
    first: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), n)
    by_name = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
    out: list[str] = []
    for n in names:
        if n not in by_name:
            raise KeyError(n)
        if by_name[n] not in out:
            out.append(by_name[n])
    return tuple(out)


def has_running_stats(model: nn.Module) -> bool:
    """Whether the model holds normalisation running statistics (batch norm) that an eval mode uses."""
    return any(isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats for m in model.modules())


def recalibrate_buffers(task: Task, model: nn.Module, batches: Iterable[Batch]) -> None:
    """Re-estimate the running statistics of `model` (averaged parameters, whose statistics no replica
    measured) as the plain average over `batches`, as torch.optim.swa_utils.update_bn does. No-op without."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats]
    if not norms:
        return
    momenta = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average
    was_training = model.training
    model.train()
    with torch.no_grad():
        for b in batches:
            task.loss(model, b)
    for m, mom in zip(norms, momenta, strict=True):
        m.momentum = mom
    model.train(was_training)


RECALIBRATE_BATCHES = 8
"""Training batches (steps past any run's, from the learners' shards in turn) on which the global model's
normalisation statistics are re-estimated before an evaluation (a model with batch norm only)."""


def recalibration_batches(task: Task, learners: int) -> list[Batch]:
    """The RECALIBRATE_BATCHES batches `recalibrate_buffers` re-estimates the global model's statistics on."""
    return [task.train_batch(i % learners, 0, 10**9 + i) for i in range(RECALIBRATE_BATCHES)]


def evaluate(task: Task, model: nn.Module, batches: list[Batch]) -> tuple[float, dict[str, float]]:
    """Mean loss over `batches` (weighted by examples) and the mean of each of the task's metrics, in eval
    mode."""
    was_training = model.training
    model.eval()
    total = 0.0
    n = 0
    sums: dict[str, float] = {}
    try:
        with torch.no_grad():
            for b in batches:
                k = int(b[0].shape[0])
                total += float(task.loss(model, b)) * k
                n += k
                for name, v in task.metrics(model, b).items():
                    sums[name] = sums.get(name, 0.0) + float(v) * k
    finally:
        model.train(was_training)
    return total / max(n, 1), {name: s / max(n, 1) for name, s in sums.items()}


def model_finite(model: nn.Module) -> bool:
    """Every parameter and floating-point buffer finite (the NaN/Inf guard of any module)."""
    return all(bool(torch.isfinite(t).all()) for t in [*model.parameters(), *model.buffers()]
               if t.is_floating_point())


def load_params(model: nn.Module, params: Mapping[str, Tensor]) -> None:
    """Copy `params` (keyed as `parameters` keys them) into the model (tied aliases follow)."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(params[n])
