"""Inner-step throughput per chip with and without the harness around the same training loop.

Not a test: it prints a table. "bare" runs LearnerCore.inner_step on C chip
processes in one Gloo group and nothing else (no syncer, no link, no event
log, no snapshots). "harness" runs the same learner through the full harness
(syncer process, TCP link, pulls and merges, event log, host-RAM snapshots),
once with periodic eval of the global model and once with it effectively off.
Overhead = 1 - harness steps/s / bare steps/s.

    python bench/harness_overhead.py [--steps 200] [--chips 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import tempfile
import time

import torch
import torch.distributed as dist

from harness.scenario import builtin
from harness.supervisor import run_scenario
from trainers.data import make_splits, train_batch
from trainers.learner import LearnerCore


def bare_chip(rank: int, size: int, port: int, steps: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)
    sc = builtin()
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=60))

    class Gloo:
        def __init__(self) -> None:
            self.rank, self.size = rank, size

        def allreduce_mean_(self, flat: torch.Tensor) -> None:
            dist.all_reduce(flat)
            flat.div_(size)

        def broadcast_(self, flat: torch.Tensor, src: int = 0) -> None:
            dist.broadcast(flat, src)

    core = LearnerCore(0, sc.model, sc.train, sc.diloco, sc.seed, Gloo())
    shard = make_splits(sc.data, sc.topology.learners).shards[0]
    first = None
    for step in range(1, steps + 1):
        core.inner_step(*train_batch(shard, sc.model.seq_len, sc.data.batch_size, sc.seed, 0, rank, step))
        if step == 1:
            first = time.perf_counter()
    if rank == 0:
        out.put((steps - 1) / (time.perf_counter() - first))
    dist.destroy_process_group()


def bare(steps: int, chips: int) -> float:
    ctx = mp.get_context("forkserver")
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    q = ctx.Queue()
    procs = [ctx.Process(target=bare_chip, args=(r, chips, store.port, steps, q)) for r in range(chips)]
    for p in procs:
        p.start()
    rate = q.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    return rate


def harness(steps: int, chips: int, eval_every_s: float) -> float:
    sc = builtin()
    sc = sc.replace(topology=type(sc.topology)(learners=1, chips_per_learner=chips),
                    train=type(sc.train)(steps=steps), eval=type(sc.eval)(every_s=eval_every_s),
                    diloco=type(sc.diloco)(fragments=8, sync_every=8, overlap=2, min_quorum=1))
    with tempfile.TemporaryDirectory() as d:
        rep = run_scenario(sc, d).report
    return rep["per_learner"]["0"]["steps_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--chips", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for _ in range(a.repeats):
        rows.append(("bare loop (Gloo only)", bare(a.steps, a.chips)))
        rows.append(("harness, eval every 3 s", harness(a.steps, a.chips, 3.0)))
        rows.append(("harness, eval off", harness(a.steps, a.chips, 3600.0)))
    best: dict[str, float] = {}
    for name, rate in rows:
        best[name] = max(best.get(name, 0.0), rate)
    base = best["bare loop (Gloo only)"]
    print(f"{a.chips} chips x 1 learner, {a.steps} steps, best of {a.repeats}; steps/s per learner (= per chip)")
    print(f"{'configuration':28} {'steps/s':>8} {'overhead':>9}")
    for name, rate in best.items():
        print(f"{name:28} {rate:8.2f} {100 * (1 - rate / base):8.1f}%")


if __name__ == "__main__":
    main()
