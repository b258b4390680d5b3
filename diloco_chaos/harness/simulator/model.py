"""Vectorised goodput simulator: N chips split into learners under a per-chip Poisson failure process.

Each learner (the whole job, for the data-parallel baselines) is a *lane*: a
job of n chips made of failure domains of `chips_per_domain` chips. Chips fail
as independent Poisson processes, so a lane's failures are one Poisson process
of rate n / mtbi_chip_s; each takes its domain out for a repair time drawn from
the repair distribution. What a failure costs depends on the method:

* ``dp`` (data-parallel, no elasticity): the whole job stops and restarts on a
  spare domain (``restart_s``), resuming from its last checkpoint: the progress
  since then (taken every ``checkpoint_every_s`` of training) is discarded.
* ``elastic_dp``: the job drops the failed domain and goes on with fewer chips
  after a reconfiguration (``downscale_s``), then takes the domain back after
  its repair (``upscale_s``); the step in flight (``step_s``) is discarded.
* ``decoupled``: M learners, each an elastic job of N/M chips failing on its
  own (the paper's rule: an M-learner system behaves like elastic data-parallel
  on N/M chips); a failure stalls only its learner, never the others. The
  synchronizer fails too (``syncer_mtbi_s``, ``syncer_repair_s``): learners keep
  stepping through its outage, the global model does not advance.

A stall triggered while the lane is already stalled is absorbed into it (the
reconfiguration or restart in progress picks up the new set of healthy
domains), so a lane's stalls are the greedy chain "first event at or after the
previous stall's end". That chain is found for all lanes at once by pointer
doubling over the sorted event array (O(E log E) numpy, no per-event loop).

Goodput = useful chip-seconds / allocated chip-seconds (docs/metrics.md): a
stalled lane's chips, a domain in repair and discarded work are lost.
Uptime = fraction of time the global model advances: for dp / elastic_dp the
job is not stalled, for decoupled at least K learners are training and the
syncer is up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from diloco_chaos.chaos.repair_times import draw_many

YEAR_S = 365.25 * 86400.0
"""Seconds in a year: the paper's per-chip MTBI is one year."""

Method = Literal["dp", "elastic_dp", "decoupled"]
METHODS: tuple[Method, ...] = ("dp", "elastic_dp", "decoupled")
Repair = Literal["fixed", "exponential", "lognormal", "exp_weibull"]
REPAIRS: tuple[Repair, ...] = ("fixed", "exponential", "lognormal", "exp_weibull")


class SimConfigError(ValueError):
    """A simulator parameter is out of range; the message names the key and the allowed range."""


@dataclass(frozen=True)
class FaultProcess:
    """The per-chip failure process (the scenario's `[random_faults]` vocabulary, in seconds)."""

    mtbi_chip_s: float = YEAR_S
    """Mean time between interruptions of one chip, seconds (paper: one year). Failures are Poisson."""
    chips_per_domain: int = 256
    """Chips a single failure takes out (one slice: the paper's elastic unit is a slice). Fitted, docs/simulator.md."""
    repair: Repair = "exp_weibull"
    """Repair-time distribution of a failed domain (paper: exponentiated Weibull)."""
    repair_mean_s: float = 3600.0
    """Mean repair time of a domain, seconds (fitted to the elastic data-parallel row)."""
    repair_sd_s: float = 3600.0
    """lognormal: standard deviation of the repair time, seconds."""
    repair_weibull_k: float = 0.8
    """exp_weibull: Weibull shape k (< 1: a heavy tail of long repairs)."""
    repair_weibull_a: float = 2.0
    """exp_weibull: exponentiation a (> 1: few very short repairs)."""
    repair_min_s: float = 0.0
    """Repair times are clamped to at least this, seconds."""
    repair_max_s: float = 1e9
    """Repair times are clamped to at most this, seconds."""

    def validate(self) -> None:
        _check("faults.mtbi_chip_s", self.mtbi_chip_s, 1e-3, 1e12)
        _check("faults.chips_per_domain", self.chips_per_domain, 1, 10**7)
        _choice("faults.repair", self.repair, REPAIRS)
        _check("faults.repair_mean_s", self.repair_mean_s, 0.0, 1e9)
        _check("faults.repair_sd_s", self.repair_sd_s, 0.0, 1e9)
        _check("faults.repair_weibull_k", self.repair_weibull_k, 0.05, 20.0)
        _check("faults.repair_weibull_a", self.repair_weibull_a, 0.05, 50.0)
        _check("faults.repair_min_s", self.repair_min_s, 0.0, 1e9)
        _check("faults.repair_max_s", self.repair_max_s, self.repair_min_s, 1e12)


@dataclass(frozen=True)
class TimeParams:
    """Time costs of recovery (the scenario's `[recovery]` vocabulary, plus the elastic reconfigurations)."""

    restart_s: float = 76.0
    """dp (and learners under policy "restart"): stop, swap in a spare domain, restart; seconds (fitted, DP row)."""
    downscale_s: float = 10.0
    """elastic: reconfigure to the surviving domains after a failure; seconds (fitted, elastic row)."""
    upscale_s: float = 10.0
    """elastic: take a repaired domain back; seconds (fitted, elastic row)."""
    checkpoint_every_s: float = 0.0
    """dp: training seconds between checkpoints; a restart discards the progress since the last one (0: none)."""
    step_s: float = 0.0
    """Inner step time, seconds: an elastic reconfiguration discards the step in flight (0: nothing)."""
    syncer_mtbi_s: float = YEAR_S / 8.0
    """decoupled: mean time between synchronizer failures, seconds (one host of 8 chips at the per-chip MTBI)."""
    syncer_repair_s: float = 60.0
    """decoupled: synchronizer restart from its checkpoint, seconds."""

    def validate(self) -> None:
        for key in ("restart_s", "downscale_s", "upscale_s", "checkpoint_every_s", "step_s", "syncer_repair_s"):
            _check(f"times.{key}", getattr(self, key), 0.0, 1e7)
        _check("times.syncer_mtbi_s", self.syncer_mtbi_s, 1e-3, 1e15)


@dataclass(frozen=True)
class Job:
    """What runs on the chips."""

    method: Method = "decoupled"
    """dp, elastic_dp or decoupled."""
    chips: int = 1_200_000
    """N: chips in all (decoupled: split evenly over the learners)."""
    learners: int = 1
    """M: learners (decoupled only; dp and elastic_dp are one job)."""
    min_quorum: int = 1
    """K: learners that must be training for the global model to advance (decoupled)."""
    learner_policy: Literal["shrink", "restart"] = "shrink"
    """decoupled: a learner's response to a failure, as `[recovery].policy`: elastic shrink, or restart like dp."""

    def validate(self) -> None:
        _choice("job.method", self.method, METHODS)
        _check("job.chips", self.chips, 1, 10**9)
        _check("job.learners", self.learners, 1, 4096)
        if self.method != "decoupled" and self.learners != 1:
            raise SimConfigError(f"job.learners = {self.learners}: must be 1 for {self.method}")
        if self.chips < self.learners:
            raise SimConfigError(f"job.chips = {self.chips}: must be >= job.learners = {self.learners}")
        _check("job.min_quorum", self.min_quorum, 1, self.learners)
        _choice("job.learner_policy", self.learner_policy, ("shrink", "restart"))


@dataclass(frozen=True)
class SimResult:
    """Goodput and uptime of one job over seeds."""

    job: Job
    goodput: tuple[float, ...]
    """Per seed."""
    uptime: tuple[float, ...]
    """Per seed."""
    events: int
    """Failures, repairs and syncer outages simulated over all seeds."""
    horizon_s: float
    seeds: tuple[int, ...] = field(default_factory=tuple)

    @property
    def goodput_mean(self) -> float:
        return float(np.mean(self.goodput))

    @property
    def goodput_std(self) -> float:
        return float(np.std(self.goodput))

    @property
    def uptime_mean(self) -> float:
        return float(np.mean(self.uptime))


def _check(key: str, value: float, lo: float, hi: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise SimConfigError(f"{key} = {value}: must be in [{lo}, {hi}]")


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SimConfigError(f"{key} = {value!r}: must be one of {', '.join(allowed)}")


def draw_repairs(rng: np.random.Generator, n: int, fp: FaultProcess) -> np.ndarray:
    """n repair times, seconds, with mean `repair_mean_s` (exp_weibull: scaled so its mean is that), clamped."""
    mean = fp.repair_mean_s
    if fp.repair != "exp_weibull" or mean == 0.0:  # the generator's distributions (diloco_chaos/chaos/repair_times.py)
        out = draw_many(rng, fp.repair, n, mean, fp.repair_sd_s / mean if mean else 0.0)
    else:
        # Inverse CDF of the exponentiated Weibull F(x) = (1 - exp(-x^k))^a, unit scale, then scaled to the mean.
        k, a = fp.repair_weibull_k, fp.repair_weibull_a
        u = rng.random(n)
        x = (-np.log1p(-u ** (1.0 / a))) ** (1.0 / k)
        out = x * (mean / exp_weibull_mean(k, a))
    return np.clip(out, fp.repair_min_s, fp.repair_max_s)


def exp_weibull_mean(k: float, a: float, n: int = 20_000) -> float:
    """Mean of the unit-scale exponentiated Weibull (k, a), by the quantile integral (deterministic)."""
    u = (np.arange(n) + 0.5) / n
    return float(np.mean((-np.log1p(-u ** (1.0 / a))) ** (1.0 / k)))


def stall_chain(t: np.ndarray, dur: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Indices of the events that start a stall, for events sorted by (lane, t).

    An event starts a stall when it is its lane's first, or at or after the end
    (t + dur) of the previous stall in its lane; events inside a stall are
    absorbed. Found by pointer doubling: next[i] is the first event at or after
    t[i] + dur[i] in the same lane; the chain is every next^j of each lane's
    first event, and after k rounds the set holds all j < 2^k.
    """
    e = len(t)
    if e == 0:
        return np.zeros(0, dtype=np.int64)
    span = float(np.max(t + dur) - min(0.0, float(np.min(t)))) + 1.0
    g = t + lane * span  # lanes laid end to end: a search never crosses into the next lane's times
    nxt = np.maximum(np.searchsorted(g, g + dur, side="left"), np.arange(1, e + 1))  # a zero-length stall ends at once
    nxt = np.where((nxt < e) & (lane[np.minimum(nxt, e - 1)] == lane), nxt, e)
    jump = np.append(nxt, e)  # sentinel e points at itself
    reach = np.zeros(e + 1, dtype=bool)
    first = np.ones(e, dtype=bool)
    first[1:] = lane[1:] != lane[:-1]
    reach[:e] = first
    while True:
        reach[jump[np.flatnonzero(reach[:e])]] = True
        if np.all(jump[:e] == e):
            break
        jump = jump[jump]
    return np.flatnonzero(reach[:e])


def _covered(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Length of [a, b] covered by the disjoint sorted intervals [starts, ends] (global time axis)."""
    if starts.size == 0:
        return np.zeros_like(a)
    xs = np.empty(2 * starts.size)
    xs[0::2], xs[1::2] = starts, ends
    cum = np.zeros(2 * starts.size)
    cum[1::2] = np.cumsum(ends - starts)
    cum[2::2] = cum[1:-1:2]
    return np.interp(b, xs, cum) - np.interp(a, xs, cum)


@dataclass(frozen=True)
class _Lanes:
    """One seed's lanes after simulation (internal)."""

    useful: float
    allocated: float
    stall_start: np.ndarray
    stall_end: np.ndarray
    stall_lane: np.ndarray
    events: int


def _simulate_lanes(rng: np.random.Generator, lanes: int, chips: np.ndarray, elastic: bool, fp: FaultProcess,
                    tp: TimeParams, horizon: float) -> _Lanes:
    rate = chips / fp.mtbi_chip_s
    counts = rng.poisson(rate * horizon)
    total = int(counts.sum())
    lane_f = np.repeat(np.arange(lanes), counts)
    t_f = rng.random(total) * horizon
    if elastic:
        rep = draw_repairs(rng, total, fp)
        back = t_f + rep
        ok = back < horizon
        t = np.concatenate([t_f, back[ok]])
        lane = np.concatenate([lane_f, lane_f[ok]])
        dur = np.concatenate([np.full(total, tp.downscale_s), np.full(int(ok.sum()), tp.upscale_s)])
        is_fail = np.concatenate([np.ones(total, bool), np.zeros(int(ok.sum()), bool)])
        discard_every = tp.step_s
    else:
        rep = np.zeros(0)
        t, lane, dur, is_fail = t_f, lane_f, np.full(total, tp.restart_s), np.ones(total, bool)
        discard_every = tp.checkpoint_every_s
    order = np.lexsort((t, lane))
    t, lane, dur, is_fail = t[order], lane[order], dur[order], is_fail[order]
    chain = stall_chain(t, dur, lane)
    s_start, s_lane = t[chain], lane[chain]
    s_end = np.minimum(s_start + dur[chain], horizon)
    stalled = np.bincount(s_lane, weights=s_end - s_start, minlength=lanes)
    # Work discarded at a stall-starting failure: the training since the last checkpoint (dp) or step boundary,
    # counted from the previous stall's end (a restart resumes from a checkpoint, a reconfiguration at a step).
    prev_end = np.zeros(chain.size)
    if chain.size > 1:
        same = s_lane[1:] == s_lane[:-1]
        prev_end[1:] = np.where(same, s_end[:-1], 0.0)
    ran = s_start - prev_end
    lost_work = np.where(is_fail[chain], np.mod(ran, discard_every) if discard_every > 0 else 0.0, 0.0)
    lost = np.bincount(s_lane, weights=lost_work, minlength=lanes) * chips
    useful = chips * (horizon - stalled) - lost
    if elastic and total:
        # A domain in repair is allocated and idle, outside the lane's stalls (inside them all chips are lost).
        span = horizon + max(tp.downscale_s, tp.upscale_s) + 1.0
        a = t_f + lane_f * span
        b = np.minimum(t_f + rep, horizon) + lane_f * span
        out = (b - a) - _covered(s_start + s_lane * span, s_end + s_lane * span, a, b)
        dom = np.minimum(fp.chips_per_domain, chips[lane_f])
        useful = useful - np.bincount(lane_f, weights=out * dom, minlength=lanes)
    useful = np.maximum(useful, 0.0)
    return _Lanes(float(useful.sum()), float(chips.sum() * horizon), s_start, s_end, s_lane, int(t.size))


def _uptime(lanes: _Lanes, m: int, k: int, horizon: float, syncer: tuple[np.ndarray, np.ndarray]) -> float:
    """Fraction of [0, horizon] with at least k of m lanes out of a stall and the syncer up."""
    s0, s1 = syncer
    xs = np.concatenate([lanes.stall_start, lanes.stall_end, s0, s1, [0.0, horizon]])
    dw = np.concatenate([np.ones(lanes.stall_start.size), -np.ones(lanes.stall_end.size),
                         np.full(s0.size, m + 1.0), np.full(s1.size, -(m + 1.0)), [0.0, 0.0]])
    order = np.argsort(xs, kind="stable")
    xs, down = xs[order], np.cumsum(dw[order])
    seg = np.diff(xs)
    up = (m - down[:-1]) >= k
    return float(np.sum(seg[up]) / horizon)


def _syncer_outages(rng: np.random.Generator, tp: TimeParams, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    n = rng.poisson(horizon / tp.syncer_mtbi_s)
    t = np.sort(rng.random(n) * horizon)
    dur = np.full(n, tp.syncer_repair_s)
    chain = stall_chain(t, dur, np.zeros(n, dtype=np.int64))
    return t[chain], np.minimum(t[chain] + tp.syncer_repair_s, horizon)


def simulate(job: Job, fp: FaultProcess = FaultProcess(), tp: TimeParams = TimeParams(), horizon_s: float = 3 * 86400.0,
             seeds: tuple[int, ...] = (0, 1, 2, 3, 4)) -> SimResult:
    """Goodput and uptime of `job` per seed; each seed draws from its own generator seeded by (seed, job)."""
    job.validate()
    fp.validate()
    tp.validate()
    _check("horizon_s", horizon_s, 1.0, 1e10)
    if not seeds:
        raise SimConfigError("seeds: must name at least one seed")
    m = job.learners
    base, extra = divmod(job.chips, m)
    chips = np.full(m, float(base))
    chips[:extra] += 1.0
    elastic = job.method == "elastic_dp" or (job.method == "decoupled" and job.learner_policy == "shrink")
    goodputs: list[float] = []
    uptimes: list[float] = []
    events = 0
    for seed in seeds:
        rng = np.random.default_rng([seed, job.chips, m, int(elastic)])
        lanes = _simulate_lanes(rng, m, chips, elastic, fp, tp, horizon_s)
        if job.method == "decoupled":
            syncer = _syncer_outages(rng, tp, horizon_s)
        else:
            syncer = (np.zeros(0), np.zeros(0))
        events += lanes.events + syncer[0].size
        goodputs.append(lanes.useful / lanes.allocated)
        uptimes.append(_uptime(lanes, m, job.min_quorum, horizon_s, syncer))
    return SimResult(job, tuple(goodputs), tuple(uptimes), events, horizon_s, tuple(seeds))
