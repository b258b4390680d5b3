"""The sharded synchronizer's names and shared files: which process, state directory and checkpoint is whose.

With `syncer.shards = S` > 1 each shard k is a syncer process of its own (`syncer.s<k>`, its own port, its own
per-fragment checkpoint slots under `syncer_state.s<k>/` and final checkpoint `global.s<k>.pt`) that merges only
the fragments diloco_chaos/trainers/syncers/shards.py assigns it. S = 1 keeps the names of the unsharded syncer
(`syncer`,
`syncer_state/`, `global.pt`), so runs and tests written before sharding read as they did.

Two things need every fragment at once, and read the other shards' files:
* shard 0's periodic evaluations: the other shards' newest checkpoint slots (written before each broadcast, so a
  slot is never behind what any learner was sent), `assembled_params`;
* the final eval: after every shard has exited, the supervisor writes `global.pt` from the shards' final
  checkpoints (`assemble_final`), so everything that reads a run's final model reads one file as before.
See docs/sharded-syncer.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, atomic_torch_save
from diloco_chaos.harness.syncer.accounting import STATE_DIR
from diloco_chaos.harness.syncer.fragment_checkpoint import FragmentCheckpoints
from diloco_chaos.trainers.fragments import partition_tensors
from diloco_chaos.trainers.syncers.shards import assign_shards, fragment_sizes
from diloco_chaos.trainers.task import parameters

__all__ = ["assemble_final", "assembled_params", "checkpoint_name", "fragment_owners", "proc_name", "state_dir"]


def proc_name(shard: int, shards: int) -> str:
    """The process (and event `proc`) name of a shard."""
    return "syncer" if shards == 1 else f"syncer.s{shard}"


def state_dir(shard: int, shards: int) -> str:
    """A shard's checkpoint-slot directory, relative to the run directory."""
    return STATE_DIR if shards == 1 else f"{STATE_DIR}.s{shard}"


def checkpoint_name(shard: int, shards: int) -> str:
    """A shard's final checkpoint file, relative to the run directory."""
    return CHECKPOINT_FILE if shards == 1 else f"global.s{shard}.pt"


def _numel(sc: Scenario) -> dict[str, int]:
    """Each parameter's element count, for the run's task's model (tied tensors once), as the learners count."""
    return {n: p.numel() for n, p in parameters(scenario_task(sc).build_model(0)).items()}


def fragment_owners(sc: Scenario) -> list[int]:
    """The owning shard of each fragment (all 0 when unsharded or the algorithm has no fragments)."""
    if not algorithms.get(sc.algorithm).fragmented:
        return [0]
    numel = _numel(sc)
    partition = partition_tensors(numel, sc.diloco.fragments)
    return assign_shards(fragment_sizes(partition, numel), sc.syncer.shards)


def assembled_params(run_dir: str, sc: Scenario, own: Mapping[str, torch.Tensor], owners: list[int],
                     shard: int, max_frame: int) -> tuple[dict[str, torch.Tensor], int, float]:
    """The global model as far as shard `shard` can see it: its own fragments as they are, every other shard's
    from that shard's newest valid checkpoint slot (its initial value if it has none yet). Returns (params,
    versions of the other shards' fragments summed, their tokens merged)."""
    params = {n: t.detach().clone() for n, t in own.items()}
    versions, tokens = 0, 0.0
    for k in sorted(set(owners) - {shard}):
        states, _ = FragmentCheckpoints(os.path.join(run_dir, state_dir(k, sc.syncer.shards))).load(max_frame)
        for st in states:
            if owners[int(st["fragment"])] != k:
                continue
            for n, t in st["params"].items():
                params[n].copy_(t)
            versions += int(st["version"])
            tokens += float(st["tokens_merged"])
    return params, versions, tokens


def assemble_final(run_dir: str, sc: Scenario) -> str | None:
    """Write `global.pt` from the shards' final checkpoints (each shard's own fragments; merges and tokens
    summed); None, and nothing written, unless every shard left one. S = 1: the syncer wrote it itself."""
    s = sc.syncer.shards
    if s == 1:
        return None
    paths = [os.path.join(run_dir, checkpoint_name(k, s)) for k in range(s)]
    if not all(os.path.exists(p) for p in paths):
        return None
    owners = fragment_owners(sc)
    numel = _numel(sc)
    partition = partition_tensors(numel, sc.diloco.fragments)
    states = [torch.load(p, weights_only=True) for p in paths]
    out = dict(states[0])
    params = dict(states[0]["params"])
    versions = list(states[0].get("versions", [0] * len(partition)))
    for p, names in enumerate(partition):
        st = states[owners[p]]
        for n in names:
            params[n] = st["params"][n]
        if "versions" in st:
            versions[p] = st["versions"][p]
    out.update(params=params, versions=versions, merges=sum(int(st["merges"]) for st in states),
               tokens_merged=sum(float(st["tokens_merged"]) for st in states), shards=s)
    out.pop("outer", None)  # each shard's outer momentum stays in its own file
    path = os.path.join(run_dir, CHECKPOINT_FILE)
    atomic_torch_save(out, path)
    return path
