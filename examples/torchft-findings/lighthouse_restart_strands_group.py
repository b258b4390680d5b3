"""Standalone reproduction (torchft 0.2.0 only; nothing of diloco-chaos is imported): a Lighthouse restarted on its
port during torchft DDP training strands a replica group, which then exits with torchft's quorum TimeoutError.

What: 3 replica groups of 1 rank (torchft Manager + ProcessGroupGloo, a linear model, 400 manager steps),
min_replicas 2, quorum_retries 2, timeouts 3 s (Manager, Gloo, connect) and quorum_timeout 8 s, Lighthouse join
and heartbeat timeouts 1 s: the settings of the built-in torchft-ddp-explore scenario. Groups 0 and 1 start
first, group 2 once group 0 has committed step 4 (it may join before or after the kill: its quorum ids say).
When group 0 reaches step 120 the Lighthouse is SIGKILLed and a new one is started on the same port 2 s later.
Each run prints, per group, the quorum ids it logged (torchft_quorums, consecutive repeats folded), its last
step, its error and whether its log shows "got exception in pg configure"; and every exit code. Every process
is killed (its process group) however a run ends.

Why: `diloco-chaos explore` on torchft (docs/targets/torchft.md "Explore against torchft") saw every
kill_syncer schedule either fail quorum_ids_monotonic or end with one group exiting 1 that no fault had hit;
this shows the second outcome without the harness.

Usage: ``python examples/torchft-findings/lighthouse_restart_strands_group.py OUTDIR [--runs N]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

STEPS, KILL_AT, REPAIR_S, DEADLINE_S = 400, 120, 2.0, 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(gid: int, lh_port: int, store_port: int, events: str) -> None:
    import logging

    import torch
    import torch.distributed as dist
    from torchft import Manager, ProcessGroupGloo

    ev = open(events, "a", buffering=1)

    def emit(kind: str, **kw: object) -> None:
        ev.write(json.dumps({"t": time.time(), "ev": kind, "group": gid, **kw}) + "\n")

    class H(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            if r.name == "torchft_quorums":
                emit("quorum", quorum_id=int(r.__dict__["quorum_id"]), step=int(r.__dict__["step"]))

    lg = logging.getLogger("torchft_quorums")
    lg.setLevel(logging.INFO)
    lg.addHandler(H())
    lg.propagate = False
    store = dist.TCPStore("127.0.0.1", store_port, 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=10))
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    t = timedelta(seconds=3)
    m = Manager(pg=ProcessGroupGloo(timeout=t), min_replica_size=2, use_async_quorum=False,
                load_state_dict=lambda sd: model.load_state_dict(sd), state_dict=lambda: model.state_dict(),
                replica_id=f"group{gid}", rank=0, world_size=1, store_addr="127.0.0.1", store_port=store_port,
                lighthouse_addr=f"http://127.0.0.1:{lh_port}", hostname="127.0.0.1", timeout=t,
                quorum_timeout=timedelta(seconds=8), connect_timeout=t, init_sync=False, quorum_retries=2)
    gen = torch.Generator().manual_seed(gid)
    try:
        while m.current_step() < STEPS:
            m.start_quorum()
            opt.zero_grad()
            x = torch.randn(32, 16, generator=gen)
            model(x).pow(2).mean().backward()
            for p in model.parameters():
                m.allreduce(p.grad).wait()
            if m.should_commit():
                opt.step()
            emit("step", step=m.current_step())
        emit("done", step=m.current_step())
    except Exception as e:  # noqa: BLE001
        emit("error", error=f"{type(e).__name__}: {e}"[:300])
        os._exit(1)
    finally:
        del store
    os._exit(0)


def lighthouse(port: int, log: str) -> subprocess.Popen[bytes]:
    exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    return subprocess.Popen([exe, "--min_replicas", "2", "--join_timeout_ms", "1000", "--heartbeat_timeout_ms",
                             "1000", "--quorum_tick_ms", "100", "--bind", f"127.0.0.1:{port}"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def ready(port: int, until: float) -> None:
    while time.time() < until:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)  # polling a port with a deadline
    raise TimeoutError(f"lighthouse not listening on {port}")


def read(path: str) -> list[dict[str, object]]:
    try:
        return [json.loads(x) for x in open(path) if x.strip()]
    except FileNotFoundError:
        return []


def wait_for(path: str, pred, until: float) -> None:  # type: ignore[no-untyped-def]
    while time.time() < until:
        if pred(read(path)):
            return
        time.sleep(0.05)
    raise TimeoutError("condition not reached")


def one_run(out: str) -> dict[str, object]:
    os.makedirs(out, exist_ok=True)
    events = os.path.join(out, "events.jsonl")
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    lh = lighthouse(port, os.path.join(out, "lighthouse.log"))
    t_end = time.time() + DEADLINE_S
    try:
        ready(port, time.time() + 20)

        def start(g: int) -> None:
            procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(g), str(port), str(free_port()),
                                           events], stdout=open(os.path.join(out, f"group{g}.log"), "ab"),
                                          stderr=subprocess.STDOUT, start_new_session=True))
        start(0)
        start(1)
        wait_for(events, lambda es: any(e["ev"] == "step" and e["group"] == 0 and e["step"] >= 4 for e in es), t_end)
        start(2)
        wait_for(events, lambda es: any(e["ev"] == "step" and e["group"] == 0 and e["step"] >= KILL_AT for e in es),
                 t_end)
        os.killpg(lh.pid, signal.SIGKILL)
        lh.wait(10)
        t_kill = time.time()
        while time.time() < t_kill + REPAIR_S:
            time.sleep(0.05)  # the repair delay itself
        lh = lighthouse(port, os.path.join(out, "lighthouse.log"))
        ready(port, time.time() + 20)
        codes = [p.wait(max(1.0, t_end - time.time())) for p in procs]
    finally:
        for p in [*procs, lh]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
    es = read(events)
    res: dict[str, object] = {"exit": codes}
    for g in range(3):
        ids = [e["quorum_id"] for e in es if e["ev"] == "quorum" and e["group"] == g]
        dedup = [x for i, x in enumerate(ids) if i == 0 or ids[i - 1] != x]
        res[f"group{g}"] = {"quorum_ids": dedup, "last_step": max([e["step"] for e in es if e["ev"] == "step"
                                                                  and e["group"] == g], default=None),
                            "error": next((e["error"] for e in es if e["ev"] == "error" and e["group"] == g), None),
                            "pg_configure_failed": "got exception in pg configure" in
                            open(os.path.join(out, f"group{g}.log"), errors="replace").read()}
    return res


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    import torchft

    print("torchft", getattr(torchft, "__version__", "0.2.0"), flush=True)
    for i in range(a.runs):
        print(json.dumps(one_run(os.path.join(a.out, f"run{i}"))), flush=True)
