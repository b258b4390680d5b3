"""report.json: the run's summary, computed from the event log and the checkpoint alone.

Definitions (see docs/metrics.md):
* tokens_trained: tokens of every inner step any learner took.
* tokens_merged: tokens whose contribution reached the global model. For
  decoupled, each merge adds the participants' c_tokens divided by P (a
  token contributes to all P fragments); for diloco and ddp, the tokens of
  each completed round.
* longest_gap_s: the longest interval, between the first and the last inner
  step of the run, in which the global model did not advance (no merge).

The event log is read once, leniently (diloco_chaos.harness.record.RunLog.load: an older run directory still reports),
into typed records that every figure here and in diloco_chaos/harness/report/metrics.py reads.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from diloco_chaos.harness.algorithms import base as algorithms
from diloco_chaos.harness.config.scenario import Scenario, from_dict
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record import Event, RunLog
from diloco_chaos.harness.record.events import EventLog
from diloco_chaos.harness.record.learner import ChipStart, FrameRejected, GlooGroup, LinkDown, LinkUp, Rtt, Step
from diloco_chaos.harness.record.run import FaultEnd, FaultStart, LinksReady, RunEnd, RunStart, SyncerRestart
from diloco_chaos.harness.record.syncer import Eval, LinkStats, Merge, Push, PushRejected, PushSuperseded
from diloco_chaos.harness.report.errors import classify_errors, settle_window_s
from diloco_chaos.harness.report.metrics import achieved_speeds, downtime, goodput, learner_availability, merge_stats
from diloco_chaos.harness.report.shard_metrics import shard_figures
from diloco_chaos.harness.report.timeline import fault_bands, fault_response, records, run_span
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, CONFIG_FILE, read_json
from diloco_chaos.harness.syncer.evaluator import recalibration_batches
from diloco_chaos.harness.syncer.shards import shard_of
from diloco_chaos.harness.wire.precision import wire_dtype_for
from diloco_chaos.trainers.task import evaluate, has_running_stats, load_params, recalibrate_buffers


def final_model(run_dir: str | os.PathLike[str], sc: Scenario) -> tuple[torch.nn.Module, dict[str, Any]] | None:
    """The run's model (its task's) with the final global checkpoint's parameters loaded and its running
    statistics (batch norm) re-estimated on training batches, and the checkpoint; None without a checkpoint."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.exists():
        return None
    state = torch.load(path, weights_only=True)
    task = scenario_task(sc)
    model = task.build_model(sc.seed)
    load_params(model, state["params"])
    if has_running_stats(model):
        recalibrate_buffers(task, model, recalibration_batches(task, sc.topology.learners))
    return model, state


def final_eval(run_dir: str | os.PathLike[str], sc: Scenario, events: EventLog) -> float | None:
    """Eval loss of the final global checkpoint on the whole held-out split; logged as an event."""
    loaded = final_model(run_dir, sc)
    if loaded is None:
        return None
    model, state = loaded
    task = scenario_task(sc)
    loss, metrics = evaluate(task, model, task.eval_batches(10**9))
    finite = all(bool(torch.isfinite(t).all()) for t in state["params"].values())
    extra = {"metrics": {k: round(v, 5) for k, v in metrics.items()}} if metrics else {}
    events.log("eval", kind="final", loss=loss, version=state["merges"], tokens_merged=state["tokens_merged"],
               finite=finite, **extra)
    return loss


def longest_gap(merge_times: list[float], start: float, end: float) -> float:
    """Longest interval within [start, end] containing no merge time."""
    points = [start, *sorted(x for x in merge_times if start <= x <= end), end]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)


def build_report(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    run_dir = Path(run_dir)
    sc = from_dict(read_json(run_dir / CONFIG_FILE))
    log = RunLog.load(run_dir)
    recs = log.records
    run_start, run_end = log.first(RunStart), log.first(RunEnd)
    start = run_start.t if run_start is not None else (recs[0].t if recs else 0.0)
    end = run_end.t if run_end is not None else (recs[-1].t if recs else 0.0)
    steps = log.of(Step)
    merges = log.of(Merge)
    per: dict[int, dict[str, Any]] = defaultdict(lambda: {"steps": 0, "tokens": 0, "first_t": None, "last_t": None})
    for e in steps:
        d = per[e.learner]
        d["steps"] = max(d["steps"], e.step)
        d["tokens"] += e.tokens
        d["first_t"] = e.t if d["first_t"] is None else min(d["first_t"], e.t)
        d["last_t"] = e.t if d["last_t"] is None else max(d["last_t"], e.t)
    per_learner = {}
    links = link_figures(recs)
    for m, d in sorted(per.items()):
        span = (d["last_t"] - d["first_t"]) if d["steps"] > 1 else 0.0
        per_learner[str(m)] = {"steps": d["steps"], "tokens": d["tokens"],
                               "steps_per_s": round((d["steps"] - 1) / span, 3) if span > 0 else None,
                               "link": links.get(m, {})}
    evals = log.of(Eval)
    periodic = [{"t": round(e.t - start, 3), "version": e.version, "tokens_merged": e.tokens_merged,
                 "loss": round(e.loss, 5)} for e in evals if e.kind == "periodic"]
    final = next((e for e in evals if e.kind == "final"), None)
    # Several processes append to one log, so file order is not time order: take extremes.
    train_start = min((e.t for e in steps), default=start)
    train_end = max((e.t for e in steps), default=end)
    groups = {e.group for e in log.of(GlooGroup)}
    errors = classify_errors(recs, start, settle_window_s(sc.timeouts.gloo_s, sc.timeouts.liveness_s))
    links_ready = log.first(LinksReady)
    last_per_shard = {shard_of(e.proc): e.tokens_merged for e in sorted(merges, key=lambda e: e.t)}
    """Each shard's cumulative count at its last merge (one entry, the syncer's, when unsharded)."""
    return {
        "name": sc.name,
        "algorithm": sc.algorithm,
        "seed": sc.seed,
        "learners": sc.topology.learners,
        "chips_per_learner": sc.topology.chips_per_learner,
        "wall_s": round(end - start, 3),
        "train_s": round(train_end - train_start, 3),
        "chip_pids": sorted({e.pid for e in log.of(ChipStart)}),
        "gloo_groups": sorted(groups),
        "per_learner": per_learner,
        "tokens_trained": sum(d["tokens"] for d in per_learner.values()),
        "tokens_merged": round(sum(last_per_shard.values()), 1),
        "merge_count": len(merges),
        "pushes": log.count(Push),
        "pushes_rejected": log.count(PushRejected),
        "pushes_superseded": log.count(PushSuperseded),
        "frames_rejected": log.count(FrameRejected),
        # wire precision (diloco_chaos/harness/wire/precision.py): frame bytes on the links, as the syncer sent and
        # received them
        "wire_dtype": wire_dtype_for(sc.algorithm, sc.diloco.wire_dtype),
        "wire_bytes_up": sum(d["link"].get("wire_bytes_up", 0) for d in per_learner.values()),
        "wire_bytes_down": sum(d["link"].get("wire_bytes_down", 0) for d in per_learner.values()),
        "initial_eval_loss": periodic[0]["loss"] if periodic else None,
        "final_eval_loss": round(final.loss, 5) if final else None,
        "final_eval_metrics": (final.metrics or {}) if final else {},
        "global_model_finite": final.finite if final else None,
        "eval_curve": periodic,
        "longest_gap_s": round(longest_gap([e.t for e in merges], train_start, train_end), 3),
        "errors": [e.as_dict() for e in errors],
        "unexpected_errors": sum(1 for e in errors if not e.expected),
        "links": ({"backend": links_ready.backend, "version": links_ready.version} if links_ready is not None
                  else {"backend": "off"}),
        "faults": fault_timeline(recs, start),
        "goodput": goodput(recs, sc.algorithm, sc.topology.learners, sc.topology.chips_per_learner,
                           sc.diloco.fragments, sc.diloco.sync_every).to_dict(),
        "availability": downtime([e.t for e in merges], train_start, train_end),
        "speed_profiles": achieved_speeds(recs, sc.topology.learners),
        "learner_availability": learner_availability(recs, sc.topology.learners, train_start, train_end),
        "fault_response": fault_response(recs),
        "merges": merge_stats(recs, sc.diloco.fragments if algorithms.get(sc.algorithm).fragmented else 1),
        "syncer_restarts": log.count(SyncerRestart),
        "syncer_shards": sc.syncer.shards,
        "shards": shard_figures(recs, start, train_start, train_end),
    }


def link_figures(evs: Sequence[Event]) -> dict[int, dict[str, Any]]:
    """Per learner: push throughput as the syncer received it, round trip as the learner measured it.

    push_KBps = bytes of data frames that arrived after their frame's header / seconds from each header to
    the frame's last byte, over all the learner's connections (KB = 1000 bytes, Toxiproxy's unit); None when
    frames arrived whole (an unthrottled loopback link: too fast to measure this way).
    rtt_ms: PING->PONG as the learner measured it, median and min.
    wire_bytes_up / wire_bytes_down: every frame's bytes on the learner's connections, as the syncer received
    and sent them (link_stats).
    """
    out: dict[int, dict[str, Any]] = defaultdict(dict)
    stats: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for e in evs:
        if isinstance(e, LinkStats):
            acc = stats[e.learner]
            acc[0] += e.data_bytes
            acc[1] += e.data_rx_s
            acc[2] += e.data_frames
            acc[3] += e.data_late_bytes
            # wire precision: every frame's bytes, learner -> syncer (up) and back (down)
            out[e.learner]["wire_bytes_up"] = out[e.learner].get("wire_bytes_up", 0) + e.bytes_in
            out[e.learner]["wire_bytes_down"] = out[e.learner].get("wire_bytes_down", 0) + e.bytes_out
    for m, (nbytes, secs, frames, late) in stats.items():
        out[m]["push_bytes"] = int(nbytes)
        out[m]["push_frames"] = int(frames)
        out[m]["push_KBps"] = round(late / secs / 1000, 3) if secs > 0.01 else None
    rtts: dict[int, list[float]] = defaultdict(list)
    for e in evs:
        if isinstance(e, Rtt):
            rtts[e.learner].append(e.ms)
    for m, xs in rtts.items():
        out[m]["rtt_ms_median"] = round(statistics.median(xs), 3)
        out[m]["rtt_ms_min"] = round(min(xs), 3)
        out[m]["rtt_samples"] = len(xs)
    ups: dict[int, int] = defaultdict(int)
    downs: dict[int, int] = defaultdict(int)
    for e in evs:
        if isinstance(e, LinkUp):
            ups[e.learner] += 1
        elif isinstance(e, LinkDown):
            downs[e.learner] += 1
    for m, n in ups.items():
        out[m]["reconnects"] = max(0, n - 1)
        out[m]["link_downs"] = downs[m]
    return dict(out)


def fault_timeline(evs: Sequence[Event], start: float) -> list[dict[str, Any]]:
    """Each scheduled fault: what, when it started and ended (seconds since run start), and why: the spans of
    diloco_chaos.harness.report.timeline.fault_bands (a kill ends at its recovery), so report.json, the HTML report and
    the CLI's table give every fault the same start and end."""
    bands = {b["index"]: b for b in fault_bands(evs)}
    shift = run_span(records(evs))[0] - start if evs else 0.0  # 0 in a run: both count from its run_start
    out: dict[int, dict[str, Any]] = {}
    for e in evs:
        if isinstance(e, FaultStart):
            b = bands[e.index]
            out[e.index] = {"index": e.index, "describe": e.describe, "start_s": round(b["start_s"] + shift, 3),
                            "start_reason": e.reason, "start_progress": e.progress,
                            "end_s": round(b["end_s"] + shift, 3),
                            "end_reason": b["until"], "end_progress": None}
        elif isinstance(e, FaultEnd) and e.index in out:
            out[e.index]["end_progress"] = e.progress
    return [out[i] for i in sorted(out)]
