"""The built-in tasks (diloco_chaos/trainers/task.py's interface): a byte-level LM, an image classifier and a regression
MLP.

Each builds its data procedurally or from text inside CPython, so none needs a download. `as_task` lets the
trainers' classes take a bare `ModelConfig` (the byte LM of that shape), as the harness did before tasks.
"""

from __future__ import annotations

from diloco_chaos.trainers.model import ModelConfig
from diloco_chaos.trainers.task import Task, TaskContext


def as_task(model: Task | ModelConfig, seed: int = 0, learners: int = 1) -> Task:
    """`model` itself when it is a Task, else the byte LM of that shape."""
    if isinstance(model, Task):
        return model
    from diloco_chaos.trainers.tasks.byte_lm import ByteLM

    return ByteLM(TaskContext(seed=seed, learners=learners, model=model))
