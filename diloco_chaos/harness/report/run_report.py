"""report.json: the run's summary, computed from the event log and the checkpoint alone.

Definitions (see docs/metrics.md):
* tokens_trained: tokens of every inner step any learner took.
* tokens_merged: tokens whose contribution reached the global model. For
  decoupled, each merge adds the participants' c_tokens divided by P (a
  token contributes to all P fragments); for diloco and ddp, the tokens of
  each completed round; for torchft, the tokens of the inner steps each
  committed sync took in (diloco_chaos/harness/report/progress.py).
* merge_count: advances of the global model: the syncer's merges, torchft's
  committed manager steps (one per quorum and step).
* longest_gap_s: the longest interval, between the first and the last inner
  step of the run, in which the global model did not advance (no merge, no
  committed torchft step).

The run directory is read once (diloco_chaos.harness.run.rundir.FinishedRun: the event log leniently, so an older run
directory still reports) into typed records that every figure here and in diloco_chaos/harness/report/metrics.py
reads. Nothing here writes to the event log.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.record import Event
from diloco_chaos.harness.record.learner import ChipStart, FrameRejected, GlooGroup, LinkDown, LinkUp, Rtt, Step
from diloco_chaos.harness.record.run import LinksReady, RunEnd, RunStart, SyncerRestart
from diloco_chaos.harness.record.syncer import Eval, LinkStats, Push, PushRejected, PushSuperseded
from diloco_chaos.harness.report.elastic_phases import summary as elastic_summary
from diloco_chaos.harness.report.errors import classify_errors, settle_window_s
from diloco_chaos.harness.report.metrics import achieved_speeds, downtime, goodput, learner_availability, merge_stats
from diloco_chaos.harness.report.progress import progress
from diloco_chaos.harness.report.shard_metrics import shard_figures
from diloco_chaos.harness.report.timeline import fault_response, fault_timeline
from diloco_chaos.harness.report.tokens import token_parts
from diloco_chaos.harness.run.rundir import CONFIG_FILE, FinishedRun, scenario_table
from diloco_chaos.harness.wire.precision import wire_dtype_for


def longest_gap(merge_times: list[float], start: float, end: float) -> float:
    """Longest interval within [start, end] containing no merge time."""
    points = [start, *sorted(x for x in merge_times if start <= x <= end), end]
    return max((b - a for a, b in zip(points, points[1:], strict=False)), default=0.0)


def build_report(run: FinishedRun | str | os.PathLike[str]) -> dict[str, Any]:
    """report.json of a finished run (a run directory's path: read once here)."""
    run = FinishedRun.of(run)
    if not run.config:
        raise FileNotFoundError(f"{run.run_dir}: no {CONFIG_FILE} (not a run directory)")
    sc = from_dict(scenario_table(run.config))
    log = run.log
    recs = log.records
    run_start, run_end = log.first(RunStart), log.first(RunEnd)
    start = run_start.t if run_start is not None else (recs[0].t if recs else 0.0)
    end = run_end.ended if run_end is not None else (recs[-1].t if recs else 0.0)
    steps = log.of(Step)
    prog = progress(recs, sc.algorithm, sc.diloco.fragments, sc.diloco.sync_every)
    advances = prog.advances
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
    last_per_shard = {a.shard: a.tokens_merged for a in sorted(advances, key=lambda a: a.t)}
    """Each shard's cumulative count at its last merge (one entry, the syncer's, when unsharded)."""
    tokens_merged = round(sum(last_per_shard.values()), 1)
    return {
        "name": sc.name,
        "algorithm": sc.algorithm,
        "seed": sc.seed,
        "mutation": run_start.mutation if run_start is not None else None,
        "learners": sc.topology.learners,
        "chips_per_learner": sc.topology.chips_per_learner,
        "wall_s": round(end - start, 3),
        "train_s": round(train_end - train_start, 3),
        "chip_pids": sorted({e.pid for e in log.of(ChipStart)}),
        "gloo_groups": sorted(groups),
        "per_learner": per_learner,
        "tokens_trained": sum(d["tokens"] for d in per_learner.values()),
        "tokens_merged": tokens_merged,
        "tokens": token_parts(recs, sc.algorithm, sc.diloco.fragments, sc.diloco.sync_every, tokens_merged).to_dict(),
        "merge_count": len(advances),
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
        "longest_gap_s": round(longest_gap(prog.times, train_start, train_end), 3),
        "errors": [e.as_dict() for e in errors],
        "unexpected_errors": sum(1 for e in errors if not e.expected),
        "links": ({"backend": links_ready.backend, "version": links_ready.version} if links_ready is not None
                  else {"backend": "off"}),
        "faults": fault_rows(recs, start),
        "goodput": goodput(recs, sc.algorithm, sc.topology.learners, sc.topology.chips_per_learner,
                           sc.diloco.fragments, sc.diloco.sync_every).to_dict(),
        "availability": downtime(prog.times, train_start, train_end),
        "speed_profiles": achieved_speeds(recs, sc.topology.learners),
        "learner_availability": learner_availability(recs, sc.topology.learners, train_start, train_end),
        "fault_response": fault_response(recs),
        "merges": merge_stats(recs, advances),
        "syncer_restarts": log.count(SyncerRestart),
        "syncer_shards": sc.syncer.shards,
        "shards": shard_figures(recs, start, train_start, train_end),
    } | _elastic(recs)


def _elastic(recs: Sequence[Event]) -> dict[str, Any]:
    """`elastic_restarts` (elastic.engine = "torchrun" only: every other run's report is unchanged)."""
    el = elastic_summary(recs)
    return {} if el is None else {"elastic_restarts": el}


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


def fault_rows(evs: Sequence[Event], start: float) -> list[dict[str, Any]]:
    """report.json `faults`: each scheduled fault that fired, by index, with what it was, when it started and ended
    (seconds since run start) and why: diloco_chaos.harness.report.timeline.fault_timeline's spans (a kill ends at its
    recovery), so report.json, the HTML report, the CLI's table and replay give every fault the same start and end."""
    rows = {f.index: f.report_row(start) for f in fault_timeline(evs)}
    return [rows[i] for i in sorted(rows)]
