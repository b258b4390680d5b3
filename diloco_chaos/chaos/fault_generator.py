"""Random fault schedules: a per-chip failure rate and a repair-time distribution, expanded into `[[faults]]`.

Hand-written `[[faults]]` lists test one failure at a time; a long run on many
chips instead sees failures at a rate. A `[random_faults]` table states that
rate (a mean time between failures per chip, in inner steps) and how long a
failure lasts, and `expand` turns it, before the run starts, into ordinary
explicit fault entries. Everything downstream (validation, the supervisor's
`FaultSchedule`, the resolved scenario in the run directory, replay) then sees
only explicit entries, so a replayed run gets exactly the same faults on
exactly the same steps, whatever its speed.

The model, per learner m with C chips:
  * each chip fails as a Poisson process in inner steps with mean `mtbf_steps`,
    so learner m sees failures at rate C / mtbf_steps (its C chips together);
    learners are independent. Every failure is one of `actions`, drawn by
    weight: the failing chip dies (kill_chip), takes its learner or host down
    with it (kill_learner, crash_host) or hangs (freeze);
  * a failure at step s means nothing else fails on that learner before step
    s + min_gap_steps (dead time: its chips are being repaired); after that
    the Poisson process resumes, so the mean gap is min_gap_steps + mtbf/C;
  * how long a failure lasts is drawn from `repair` ("fixed", "exponential" or
    "lognormal"), clamped to [repair_min_s, repair_max_s]: the restart delay
    (`repair_s`) for kills, the hang (`until.after_s`) for freezes, with mean
    `freeze_s` and the same relative spread;
  * failures fall in [start_step, end_step); each entry triggers on the target
    learner's own step (`at = {step, learner}`).
Learner m draws from its own `random.Random` seeded by (seed, m), never from a
global RNG, so the output is a pure function of the config, the topology, the
step count and the seed, and capping with `max_faults` only cuts the tail.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from diloco_chaos.chaos.repair_times import REPAIR_DISTRIBUTIONS, draw_one
from diloco_chaos.chaos.schedule import ScheduleError, config_table

RANDOM_ACTIONS = ("kill_chip", "kill_learner", "crash_host", "freeze")
"""Process faults a random failure can be (diloco_chaos/chaos/schedule.py PROCESS_ACTIONS, less `slow`)."""

MAX_FAULTS = 10_000
"""Most entries a `[random_faults]` table may expand into (expected count, or max_faults)."""



@dataclass(frozen=True)
class Limit:
    """The range a number of a `[random_faults]` table must be in: `validate` checks it, docs/scenario.md and
    `diloco-chaos keys random_faults` show it."""

    lo: float
    hi: float | None
    """None: the scenario's train.steps."""
    integral: bool = False
    lo_open: bool = False

    def text(self) -> str:
        hi = "train.steps" if self.hi is None else f"{self.hi:.10g}"
        return f"{'(' if self.lo_open else '['}{self.lo:.10g}, {hi}]"


LIMITS: dict[str, Limit] = {
    "mtbf_steps": Limit(0.0, 1e9, lo_open=True),
    "repair_mean_s": Limit(0.0, 3600.0), "repair_min_s": Limit(0.0, 3600.0), "repair_max_s": Limit(0.0, 3600.0),
    "repair_sd_s": Limit(0.0, 3600.0, lo_open=True), "freeze_s": Limit(0.0, 3600.0, lo_open=True),
    "start_step": Limit(1, None, integral=True), "end_step": Limit(2, None, integral=True),
    "max_faults": Limit(1, MAX_FAULTS, integral=True), "min_gap_steps": Limit(1, None, integral=True),
    "seed": Limit(0, 2**31 - 1, integral=True),
}
"""The numeric fields of RandomFaultsConfig and their ranges (besides the rules between fields in `validate`)."""

_KILLS = ("kill_chip", "kill_learner", "crash_host")
_WITH_CHIP = ("kill_chip", "freeze")


@dataclass(frozen=True)
class RandomFaultsConfig:
    """A `[random_faults]` table: failure rate, kinds and durations; `expand` makes it explicit faults."""

    mtbf_steps: float
    """Mean inner steps between failures of ONE chip (exponential inter-arrival); a learner with C chips
    fails C / mtbf_steps times per step. Required, in (0, 1e9]."""
    actions: tuple[tuple[str, float], ...] = (("kill_chip", 1.0),)
    """What a failure is, with relative weights: kill_chip, kill_learner, crash_host, freeze
    (TOML: `actions = { kill_chip = 3, freeze = 1 }`). Default: kill_chip only."""
    repair: str = "fixed"
    """Distribution of how long a failure lasts: fixed (always the mean), exponential or lognormal."""
    repair_mean_s: float = 2.0
    """Mean repair time of a kill in seconds: the restart delay, written as the entry's repair_s."""
    repair_sd_s: float = 1.0
    """lognormal only: standard deviation of the repair time in seconds (freezes keep the same sd / mean)."""
    repair_min_s: float = 0.0
    """Every drawn duration (repairs and freezes) is at least this."""
    repair_max_s: float = 60.0
    """Every drawn duration (repairs and freezes) is at most this."""
    freeze_s: float = 1.0
    """Mean duration of a freeze in seconds (the entry's until = { after_s }), same distribution as repairs."""
    start_step: int = 1
    """No failure before this inner step."""
    end_step: int | None = None
    """No failure at or after this inner step; unset: train.steps less a margin of max(1, steps // 10), so
    the last failures are repaired before the learners finish."""
    max_faults: int | None = None
    """At most this many entries in all (the earliest are kept); unset: no cap beyond the horizon."""
    min_gap_steps: int = 10
    """Steps after a failure during which the same learner cannot fail again, so it is repaired before it is
    hit again. Repair is in seconds and steps are in progress, and how many steps a repair takes is not
    known ahead (it depends on the machine), so this is a step approximation: pick it above repair time /
    step time."""
    seed: int | None = None
    """Seed of the draws; unset: the scenario's seed."""


def default_end_step(steps: int) -> int:
    """The horizon when end_step is unset: a margin of a tenth of the run (at least one step)."""
    return steps - max(1, steps // 10)


def _num(key: str, v: Any, lo: float, hi: float, *, integral: bool = False, lo_open: bool = False) -> Any:
    """A number in [lo, hi] (or (lo, hi]); the error names the key and the range."""
    allowed = f"{'(' if lo_open else '['}{lo:.10g}, {hi:.10g}]"
    if isinstance(v, bool) or not isinstance(v, int if integral else (int, float)):
        raise ScheduleError(f"{key} = {v!r}: must be {'an integer' if integral else 'a number'} in {allowed}")
    if not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
        low = f"> {lo:.10g}" if lo_open else f">= {lo:.10g}"
        raise ScheduleError(f"{key} = {v!r}: must be {low}, in {allowed}")
    return v if integral else float(v)


def _actions(key: str, v: Any) -> tuple[tuple[str, float], ...]:
    pairs = list(v.items()) if isinstance(v, dict) else v
    if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise ScheduleError(f"{key} = {v!r}: must be a table of weights like {{ kill_chip = 3, freeze = 1 }}")
    weights: dict[str, float] = {}
    for name, w in pairs:
        if name not in RANDOM_ACTIONS:
            raise ScheduleError(f"{key}.{name}: not a random fault; allowed: {', '.join(RANDOM_ACTIONS)}")
        weights[name] = _num(f"{key}.{name}", w, 0.0, 1e6)
    if not any(w > 0 for w in weights.values()):
        raise ScheduleError(f"{key} = {v!r}: needs at least one action with weight > 0")
    return tuple((a, weights[a]) for a in RANDOM_ACTIONS if weights.get(a, 0.0) > 0)


def validate(raw: Any, key: str, learners: int, chips: int, steps: int) -> RandomFaultsConfig:
    """Validate a `[random_faults]` table (TOML, or `dataclasses.asdict` of a config) for a run of `learners`
    x `chips` chips and `steps` inner steps. Raises ScheduleError (a ValueError) naming `key.field`."""
    raw = config_table(raw, key, RandomFaultsConfig)
    if "mtbf_steps" not in raw:
        raise ScheduleError(f"{key}.mtbf_steps: required (mean inner steps between failures of one chip)")
    kw: dict[str, Any] = {}
    for name, v in raw.items():
        k = f"{key}.{name}"
        if name == "actions":
            kw[name] = _actions(k, v)
        elif name == "repair":
            if v not in REPAIR_DISTRIBUTIONS:
                raise ScheduleError(f"{k} = {v!r}: must be one of {', '.join(REPAIR_DISTRIBUTIONS)}")
            kw[name] = v
        else:
            lim = LIMITS[name]
            kw[name] = _num(k, v, lim.lo, steps if lim.hi is None else lim.hi, integral=lim.integral,
                            lo_open=lim.lo_open)
    cfg = RandomFaultsConfig(**kw)
    if cfg.repair_min_s > cfg.repair_max_s:
        raise ScheduleError(f"{key}.repair_min_s = {cfg.repair_min_s:g}: must be <= {key}.repair_max_s = "
                            f"{cfg.repair_max_s:g}")
    if not cfg.repair_min_s <= cfg.repair_mean_s <= cfg.repair_max_s:
        raise ScheduleError(f"{key}.repair_mean_s = {cfg.repair_mean_s:g}: must be in [{cfg.repair_min_s:g}, "
                            f"{cfg.repair_max_s:g}] (repair_min_s, repair_max_s)")
    if cfg.repair != "fixed" and cfg.repair_mean_s <= 0:
        raise ScheduleError(f"{key}.repair_mean_s = 0: must be > 0 for repair = {cfg.repair!r}")
    kinds = {a for a, _ in cfg.actions}
    if "freeze" in kinds and not cfg.repair_min_s <= cfg.freeze_s <= cfg.repair_max_s:
        raise ScheduleError(f"{key}.freeze_s = {cfg.freeze_s:g}: must be in [{cfg.repair_min_s:g}, "
                            f"{cfg.repair_max_s:g}] (repair_min_s, repair_max_s)")
    end = cfg.end_step if cfg.end_step is not None else default_end_step(steps)
    if cfg.start_step >= end:
        raise ScheduleError(f"{key}.start_step = {cfg.start_step}: must be below the horizon end_step = {end}"
                            f" (train.steps = {steps}{'' if cfg.end_step is not None else ' less its margin'})")
    expected = learners * (end - cfg.start_step) / (cfg.min_gap_steps + cfg.mtbf_steps / max(1, chips))
    if min(expected, cfg.max_faults or math.inf) > MAX_FAULTS:
        raise ScheduleError(f"{key}.mtbf_steps = {cfg.mtbf_steps:g}: expands into ~{expected:.0f} faults; at most "
                            f"{MAX_FAULTS} (raise mtbf_steps or min_gap_steps, or set max_faults)")
    return cfg


def _duration(rng: random.Random, cfg: RandomFaultsConfig, mean: float) -> float:
    """One draw of how long a failure lasts, mean `mean`, clamped; rounded to ms for readable entries. The sd
    scales with the mean (lognormal: the repairs' sd / mean)."""
    d = draw_one(rng, cfg.repair, mean, cfg.repair_sd_s / cfg.repair_mean_s)
    return min(max(round(d, 3), cfg.repair_min_s), cfg.repair_max_s)


def _learner_faults(cfg: RandomFaultsConfig, m: int, chips: int, end: int, seed: int) -> Iterator[dict[str, Any]]:
    """Learner m's failures in step order, from its own RNG stream."""
    rng = random.Random(f"random_faults:{seed}:{m}")  # str seeds hash with sha512: stable across runs
    names = [a for a, _ in cfg.actions]
    weights = [w for _, w in cfg.actions]
    rate = chips / cfg.mtbf_steps
    t = float(cfg.start_step)
    while True:
        t += rng.expovariate(rate)
        s = math.floor(t)
        if s >= end:
            return
        action = rng.choices(names, weights)[0] if len(names) > 1 else names[0]
        entry: dict[str, Any] = {"action": action, "learner": m}
        if action in _WITH_CHIP:
            entry["chip"] = rng.randrange(chips)
        entry["at"] = {"step": s, "learner": m}
        if action in _KILLS:
            entry["repair_s"] = _duration(rng, cfg, cfg.repair_mean_s)
        else:
            entry["until"] = {"after_s": _duration(rng, cfg, cfg.freeze_s)}
        yield entry
        t += cfg.min_gap_steps  # dead time: no failure of this learner before s + min_gap_steps


def expand(cfg: RandomFaultsConfig, *, learners: int, chips_per_learner: int, steps: int,
           seed: int) -> list[dict[str, Any]]:
    """Explicit `[[faults]]` entries, sorted by (step, learner). `seed` is the scenario's seed, used when
    cfg.seed is unset. Pure: the same arguments give the same list."""
    end = cfg.end_step if cfg.end_step is not None else default_end_step(steps)
    s = cfg.seed if cfg.seed is not None else seed
    streams = [_learner_faults(cfg, m, chips_per_learner, end, s) for m in range(learners)]
    merged = heapq.merge(*streams, key=lambda e: (e["at"]["step"], e["learner"]))
    return list(itertools.islice(merged, cfg.max_faults))
