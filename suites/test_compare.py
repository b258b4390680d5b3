"""The same chip loss under ddp, diloco and decoupled (harness.compare, `diloco-chaos compare`).

The paper's availability claim in one table: with a chip lost and repaired, Decoupled DiLoCo keeps the global
model advancing (higher uptime) and its chips doing more useful work (higher goodput) than the synchronous
baselines, which stall everywhere until the learner is back, at a final eval loss close to fault-free ddp.
Public API only. Scaled down from the built-in `chip-loss` scenario (4 x 2, 300 steps) to 2 x 2, 160 steps.
"""

from __future__ import annotations

from harness.compare import compare, table
from harness.scenario import builtin

LOSS_TOLERANCE = 0.7
"""Final eval loss of decoupled with the fault may exceed fault-free ddp's by at most this (nats). ddp takes a
full AdamW step on the global batch every step, so at equal steps it is ahead of both DiLoCo variants (README:
1.78 vs 2.31 on the default scenario). Measured here: +0.35 and +0.52 in two runs (asynchronous runs spread);
0.5 flaked, 0.7 is that spread with room."""


def test_compare_failure_decoupled_beats_the_synchronous_baselines(tmp_path):
    sc = builtin("chip-loss")
    sc = sc.replace(topology=type(sc.topology)(learners=2, chips_per_learner=2),
                    train=type(sc.train)(steps=160, warmup_steps=10),
                    diloco=type(sc.diloco)(fragments=4, sync_every=8, overlap=2, min_quorum=1),
                    recovery=type(sc.recovery)(policy="restart", repair_s=2.0),
                    faults=[{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 40, "learner": 0}}])
    rows = {r["run"]: r for r in compare(sc, tmp_path)}
    print("\n" + table(list(rows.values())))
    dec, ddp, dil = rows["decoupled, with faults"], rows["ddp, with faults"], rows["diloco, with faults"]
    for base in (ddp, dil):
        assert dec["uptime"] > base["uptime"], f"uptime: decoupled {dec['uptime']} vs {base['run']} {base['uptime']}"
        # goodput (docs/metrics.md): time on steps that reached the global model, net of barrier waits and stalls
        assert dec["goodput"] > base["goodput"], \
            f"goodput: decoupled {dec['goodput']} vs {base['run']} {base['goodput']}"
    assert dec["vs_fault_free_ddp"] <= LOSS_TOLERANCE, \
        f"final eval {dec['final_eval_loss']} vs fault-free ddp: +{dec['vs_fault_free_ddp']} > {LOSS_TOLERANCE}"
