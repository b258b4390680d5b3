"""What a Python thread in the chip process costs the training loop: the GIL it holds while it runs.

Not a test: it prints a table. The same inner-step loop as bench/harness_overhead.py's bare loop (1 chip,
no Gloo peer), alone and next to a background thread that runs pure Python for `--bg-ms` of every 20 ms
(the link threads' measured share, about 2 ms per step), under the harness's switch interval (0.2 ms) and
CPython's default (5 ms). Main-thread CPU shows whether the loop did more work or only waited for the GIL.

    python bench/gil_contention.py [--bg-ms 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time

STEPS, WARMUP = 350, 50


def loop(switch_s: float, bg_ms: float, out: mp.Queue) -> None:
    import torch

    from diloco_chaos.harness.config.scenario import builtin
    from diloco_chaos.trainers.data import make_splits, train_batch
    from diloco_chaos.trainers.learner.core import LearnerCore

    torch.set_num_threads(1)
    sys.setswitchinterval(switch_s)
    stop = threading.Event()

    def background() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            x = 0
            while time.perf_counter() - t < bg_ms / 1e3:
                x += 1
            stop.wait(0.02)

    if bg_ms > 0:
        threading.Thread(target=background, daemon=True).start()
    sc = builtin("fault-free")
    core = LearnerCore(0, sc.model, sc.train, sc.diloco, sc.seed)
    shard = make_splits(sc.data, sc.topology.learners).shards[0]
    t0 = c0 = 0.0
    for step in range(1, STEPS + 1):
        if step == WARMUP:
            t0, c0 = time.perf_counter(), time.thread_time()
        core.inner_step(*train_batch(shard, sc.model.seq_len, sc.data.batch_size, sc.seed, 0, 0, step))
    n = STEPS - WARMUP
    stop.set()
    out.put((1e3 * (time.perf_counter() - t0) / n, 1e3 * (time.thread_time() - c0) / n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bg-ms", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    ctx = mp.get_context("forkserver")
    configs = {"alone, 5 ms switch": (0.005, 0.0), f"thread {a.bg_ms:g} ms/20 ms, 0.2 ms switch": (0.0002, a.bg_ms),
               f"thread {a.bg_ms:g} ms/20 ms, 5 ms switch": (0.005, a.bg_ms)}
    rows: dict[str, list[tuple[float, float]]] = {}
    for _ in range(a.repeats):  # interleaved, so a noisy phase of the machine hits every configuration
        for name, (switch, bg) in configs.items():
            q = ctx.Queue()
            p = ctx.Process(target=loop, args=(switch, bg, q))
            p.start()
            rows.setdefault(name, []).append(q.get(timeout=600))
            p.join(timeout=60)
    print(f"inner steps {WARMUP}..{STEPS}, median of {a.repeats} interleaved runs")
    print(f"{'configuration':36} {'wall ms/step':>12} {'main CPU ms/step':>17}")
    for name, vals in rows.items():
        print(f"{name:36} {statistics.median(w for w, _ in vals):12.2f} {statistics.median(c for _, c in vals):17.2f}")


if __name__ == "__main__":
    main()
