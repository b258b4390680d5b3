"""Inner-step throughput per chip with and without the harness around the same training loop.

Not a test: it prints a table. "bare" runs LearnerCore.inner_step on C chip
processes in one Gloo group and nothing else (no syncer, no link, no event
log, no snapshots). "harness" runs the same learner through the full harness
(syncer process, TCP link, pulls and merges, event log, host-RAM snapshots),
once with periodic eval of the global model and once with it effectively off.
Overhead = 1 - harness steps/s / bare steps/s, bracketed: the runs go bare, c1, bare, c2, ..., bare, so
every run has a bare run just before and just after it, and its overhead is taken against the mean of those
two; the table gives the median and quartiles over the runs. This VM's speed drifts by tens of percent
within a minute (the bare loop alone: 13 to 16 ms a step in one minute, pinned to one core with the other
idle), so a comparison of runs minutes apart, or even a pair next to each other, mistakes drift for overhead;
a linear drift over a bracket cancels. The steal column is the host's share.

    python bench/harness_overhead.py [--steps 300] [--chips 1] [--repeats 3] [--only eval3,noproxy]

Throughput is timed from step WARMUP_STEPS to the last step in both setups.

Both setups run with the numeric settings of every run process (one thread, subnormals flushed to zero,
no heap trimming: diloco_chaos/harness/run/procutil.py). Two more columns say where the harness's time goes on a 2-core
machine, where the syncer shares the chips' memory system: "link ms/step" is the CPU the host's link
process used (answering pulls, decoding merged fragments, loopback TCP) per step, which runs beside the
training process rather than in it, and a control row runs the bare loop next to a neighbour process that
does memory-bound torch work for the syncer's measured share of a core.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from diloco_chaos.harness.config.scenario import builtin
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.procutil import FLUSH_DENORMAL, keep_heap
from diloco_chaos.harness.run.supervisor import run_scenario
from diloco_chaos.trainers.data import make_splits, train_batch
from diloco_chaos.trainers.learner.core import LearnerCore

WARMUP_STEPS = 50
"""Steps before the timed window, in both setups: connection, first pulls, allocator warm-up."""


def bare_chip(rank: int, size: int, port: int, steps: int, out: mp.Queue) -> None:
    torch.set_num_threads(1)  # the numeric settings every run process has (diloco_chaos/harness/run/procutil.py)
    torch.set_flush_denormal(FLUSH_DENORMAL)
    keep_heap()
    sc = builtin("fault-free")
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

        def pending_reform(self) -> bool:
            return False

        def reform(self) -> None:
            raise RuntimeError("the bare loop never re-forms its group")

    core = LearnerCore(0, sc.model, sc.train, sc.diloco, sc.seed, Gloo())
    shard = make_splits(sc.data, sc.topology.learners).shards[0]
    first = cpu0 = 0.0
    for step in range(1, steps + 1):
        core.inner_step(*train_batch(shard, sc.model.seq_len, sc.data.batch_size, sc.seed, 0, rank, step))
        if step == WARMUP_STEPS:
            first, cpu0 = time.perf_counter(), time.process_time()
    if rank == 0:
        n = steps - WARMUP_STEPS
        out.put((n / (time.perf_counter() - first), 1e3 * (time.process_time() - cpu0) / n))
    dist.destroy_process_group()


def neighbour(duty: float, stop: Any) -> None:
    """Memory-bound torch work `duty` of every 10 ms: the load the syncer puts on the other core."""
    torch.set_num_threads(1)
    a, b = torch.randn(300_000), torch.randn(300_000)
    while not stop.is_set():
        t_end = time.perf_counter() + 0.01 * duty
        while time.perf_counter() < t_end:
            a.copy_((a * b + a).clamp_(-1, 1))
        stop.wait(0.01 * (1 - duty))


def bare(steps: int, chips: int, neighbour_duty: float = 0.0) -> tuple[float, float, float, float]:
    ctx = mp.get_context("forkserver")
    stop = ctx.Event()
    nb = ctx.Process(target=neighbour, args=(neighbour_duty, stop)) if neighbour_duty > 0 else None
    if nb is not None:
        nb.start()
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    q = ctx.Queue()
    procs = [ctx.Process(target=bare_chip, args=(r, chips, store.port, steps, q)) for r in range(chips)]
    for p in procs:
        p.start()
    rate, cpu = q.get(timeout=600)
    for p in procs:
        p.join(timeout=60)
    if nb is not None:
        stop.set()
        nb.join(timeout=10)
    return rate, cpu, 0.0, 0.0


def harness(steps: int, chips: int, eval_every_s: float, proxy: str,
            eval_points: int = 0) -> tuple[float, float, float, float]:
    sc = builtin("fault-free")
    sc = sc.replace(topology=type(sc.topology)(learners=1, chips_per_learner=chips),
                    train=type(sc.train)(steps=steps), eval=type(sc.eval)(every_s=eval_every_s, points=eval_points),
                    diloco=type(sc.diloco)(fragments=8, sync_every=8, overlap=2, min_quorum=1),
                    links=type(sc.links)(proxy=proxy))
    with tempfile.TemporaryDirectory() as d:
        res = run_scenario(sc, d)
        every = read_events(res.run_dir / EVENTS_FILE)
    evs = [e for e in every if e["ev"] == "step" and e["learner"] == 0]
    link_cpu = sum(e["cpu_s"] for e in every if e["ev"] == "link_cpu" and e["learner"] == 0)
    timing = next(e["timing"] for e in every if e["ev"] == "learner_done" and e["learner"] == 0)
    syncer = [e for e in every if e["ev"] == "syncer_done"]
    _SYNCER_SHARE.append(syncer[0]["cpu_s"] / res.report["wall_s"] if syncer and res.report["wall_s"] else 0.0)
    t = {e["step"]: e["t"] for e in evs}
    cpu = {e["step"]: e["cpu_s"] for e in evs if "cpu_s" in e}
    last = max(s for s in cpu if s <= steps)
    return ((steps - WARMUP_STEPS) / (t[steps] - t[WARMUP_STEPS]),
            1e3 * (cpu[last] - cpu[WARMUP_STEPS]) / (last - WARMUP_STEPS), 1e3 * link_cpu / steps,
            1e3 * (timing["apply"] + timing["publish"]) / steps)


_SYNCER_SHARE: list[float] = []
"""Syncer CPU seconds per wall second in each harness run: the neighbour control's duty."""


Run = Callable[[int, int], tuple[float, float, float, float]]
"""A configuration: (steps, chips) -> (steps/s, chip CPU ms/step, link ms/step, in-loop ms/step)."""


def bare_beside_syncer_load(steps: int, chips: int) -> tuple[float, float, float, float]:
    """The control: the bare loop next to a neighbour at the syncer's CPU share measured in the harness runs so
    far (0.2 before the first)."""
    return bare(steps, chips, statistics.median(_SYNCER_SHARE) if _SYNCER_SHARE else 0.2)


def _cpu_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies of the whole machine, from /proc/stat: a VM's host taking its cores away."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


Sample = tuple[float, float, float, float, float]
"""One run: (steps/s, chip CPU ms/step, link ms/step, in-loop ms/step, steal fraction while it ran)."""


def _timed(fn: Run, *args: int) -> Sample:
    """fn's (steps/s, chip CPU ms/step, link ms/step, in-loop ms/step) and the machine's steal fraction
    while it ran."""
    s0, t0 = _cpu_jiffies()
    rate, cpu, link, loop = fn(*args)
    s1, t1 = _cpu_jiffies()
    return rate, cpu, link, loop, (s1 - s0) / (t1 - t0) if t1 > t0 else 0.0


def bracketed_overheads(sequence: list[tuple[str, float]], bare_name: str) -> dict[str, list[float]]:
    """Per configuration, 1 - steps/s over the bare loop's steps/s interpolated at that run: the mean of the
    bare runs just before and just after it in `sequence` ((name, steps/s) in the order they ran). A bare run
    brackets every other run, so a drift of the machine's speed that is linear over a bracket cancels; a run
    with a bare neighbour on one side only is compared with that one."""
    out: dict[str, list[float]] = {}
    for i, (name, rate) in enumerate(sequence):
        if name == bare_name:
            continue
        before = next((r for n, r in reversed(sequence[:i]) if n == bare_name), None)
        after = next((r for n, r in sequence[i + 1:] if n == bare_name), None)
        refs = [r for r in (before, after) if r is not None]
        out.setdefault(name, []).append(1 - rate / statistics.fmean(refs))
    return out


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile); all three the value itself for one sample."""
    if len(xs) < 2:
        return xs[0], xs[0], xs[0]
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, q2, q3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--chips", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    ap.add_argument("--only", default="", help="comma-separated keys of the configurations to run: neighbour, "
                    "eval3, evaldefault, evaloff, noproxy (the bare loop always runs); fewer, so more repeats in "
                    "the same time")
    a = ap.parse_args()
    bare_row = "bare loop (Gloo only)"
    every: dict[str, tuple[str, Run]] = {
        "neighbour": ("bare + syncer-load neighbour", bare_beside_syncer_load),
        "eval3": ("harness, proxy, eval every 3 s", partial(harness, eval_every_s=3.0, proxy="embedded")),
        "evaldefault": ("harness, proxy, eval 24 points + every 3 s (default)",
                        partial(harness, eval_every_s=3.0, proxy="embedded", eval_points=24)),
        "evaloff": ("harness, proxy, eval off", partial(harness, eval_every_s=3600.0, proxy="embedded")),
        "noproxy": ("harness, no proxy, eval off", partial(harness, eval_every_s=3600.0, proxy="off")),
    }
    wanted = [w.strip() for w in a.only.split(",") if w.strip()] or list(every)
    unknown = sorted(set(wanted) - set(every))
    if unknown:
        ap.error(f"--only: unknown {unknown}; allowed {list(every)}")
    configs = [every[k] for k in every if k in wanted]
    # bare, c1, bare, c2, ..., bare, c1, ...: every run has a bare run right before and right after it
    plan: list[tuple[str, Run]] = [(bare_row, bare)]
    for _ in range(a.repeats):
        for cfg in configs:
            plan += [cfg, (bare_row, bare)]
    rows: dict[str, list[Sample]] = {bare_row: [], **{name: [] for name, _ in configs}}
    sequence: list[tuple[str, float]] = []
    for name, fn in plan:
        sample = _timed(fn, a.steps, a.chips)
        rows[name].append(sample)
        sequence.append((name, sample[0]))
    paired = bracketed_overheads(sequence, bare_row)
    base_cpu = statistics.median(r[1] for r in rows[bare_row])
    print(f"{a.chips} chip(s) x 1 learner, steps {WARMUP_STEPS}..{a.steps}, {a.repeats} run(s) of each "
          "configuration, each between two bare runs")
    print("steps/s: per learner (= per chip), wall clock, median; overhead: 1 - steps/s / the bare loop's steps/s")
    print("at that run (mean of the bare runs just before and after it: this machine's speed drifts by tens of")
    print("percent within a minute), median and quartiles over the runs; chip CPU ms/step: CPU time of the chip")
    print("process (host); in-loop: wall ms per step the training loop spends on the harness's side of a step")
    print("(poll, apply merged fragments, publish the snapshot, log the step: learner_done timing apply +")
    print("publish), which does not depend on neighbours; steal: the VM's CPU taken by its host")
    print(f"{'configuration':32} {'steps/s':>8} {'overhead':>9} {'q1':>7} {'q3':>7} {'CPU ms/step':>12} "
          f"{'link ms/step':>13} {'in-loop ms':>11} {'steal':>6}  runs (steps/s, in order)")
    for name, vals in rows.items():
        q1, q2, q3 = quartiles(paired[name]) if name in paired else (0.0, 0.0, 0.0)
        print(f"{name:32} {statistics.median(r[0] for r in vals):8.2f} {100 * q2:8.1f}% {100 * q1:6.1f}% "
              f"{100 * q3:6.1f}% {statistics.median(r[1] for r in vals):12.2f} "
              f"{statistics.median(r[2] for r in vals):13.2f} {statistics.median(r[3] for r in vals):11.2f} "
              f"{100 * statistics.median(r[4] for r in vals):5.1f}%  " + " ".join(f"{r[0]:.1f}" for r in vals))
    print(f"bare loop CPU ms/step, median: {base_cpu:.2f}")
    if _SYNCER_SHARE:
        print(f"neighbour duty (syncer CPU share, median): {statistics.median(_SYNCER_SHARE):.2f}")


if __name__ == "__main__":
    main()
