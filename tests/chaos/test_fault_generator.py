"""Random fault schedules: determinism, the per-chip failure rate, repair draws, gaps, horizon, validation."""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any

import pytest

from diloco_chaos.chaos.fault_generator import MAX_FAULTS, RandomFaultsConfig, default_end_step, expand, validate
from diloco_chaos.chaos.schedule import ScheduleError, parse_fault

KEY = "random_faults"


def cfg(learners: int = 4, chips: int = 2, steps: int = 300, **raw: Any) -> RandomFaultsConfig:
    return validate({"mtbf_steps": 200, **raw}, KEY, learners, chips, steps)


def gen(c: RandomFaultsConfig, learners: int = 4, chips: int = 2, steps: int = 300, seed: int = 0) -> list[dict]:
    return expand(c, learners=learners, chips_per_learner=chips, steps=steps, seed=seed)


def big(**kw: Any) -> RandomFaultsConfig:
    """A config built directly: statistical samples are larger than validate's MAX_FAULTS allows a run."""
    return RandomFaultsConfig(**kw)


def steps_of(entries: list[dict], learner: int) -> list[int]:
    return [e["at"]["step"] for e in entries if e["learner"] == learner]


MIXED = {"actions": {"kill_chip": 2, "kill_learner": 1, "crash_host": 1, "freeze": 1}, "repair": "lognormal"}


def test_same_inputs_same_list_other_seed_other_list() -> None:
    c = cfg(**MIXED)
    a = gen(c, seed=7)
    assert a and a == gen(c, seed=7) == gen(dataclasses.replace(c), seed=7)
    assert gen(c, seed=8) != a
    # cfg.seed overrides the scenario's seed
    pinned = dataclasses.replace(c, seed=7)
    assert gen(pinned, seed=0) == gen(pinned, seed=99) == a


def test_entries_are_sorted_step_triggered_on_their_own_learner_and_parse() -> None:
    entries = gen(cfg(mtbf_steps=50, **MIXED))
    assert {e["action"] for e in entries} == {"kill_chip", "kill_learner", "crash_host", "freeze"}
    assert entries == sorted(entries, key=lambda e: (e["at"]["step"], e["learner"]))
    for i, e in enumerate(entries):
        assert e["at"] == {"step": e["at"]["step"], "learner": e["learner"]}
        if e["action"] in ("kill_chip", "freeze"):
            assert 0 <= e["chip"] < 2
        else:
            assert "chip" not in e
        if e["action"] == "freeze":
            assert set(e["until"]) == {"after_s"} and "repair_s" not in e
        else:
            assert "until" not in e and e["repair_s"] >= 0
        spec = parse_fault(e, f"faults[{i}]", 4)
        assert (spec.action, spec.learner, spec.at.step, spec.at.learner) == (e["action"], e["learner"],
                                                                              e["at"]["step"], e["learner"])
        assert spec.repair_s == e.get("repair_s")


def test_chip_faults_come_c_times_as_often_per_chip_mtbf() -> None:
    # One learner, long horizon: the mean gap between failures is min_gap + mtbf / C (dead time + exponential).
    mtbf, gap, n_steps = 400.0, 1, 2_000_000
    for chips in (1, 4):
        c = big(mtbf_steps=mtbf, min_gap_steps=gap)
        s = steps_of(gen(c, learners=1, chips=chips, steps=n_steps), 0)
        gaps = [b - a for a, b in zip(s, s[1:], strict=False)]
        expect = gap + mtbf / chips
        assert len(gaps) > 4000
        # sd of the mean ~ expect / sqrt(n) <= 1.6 %; 5 % fails for a rate off by a factor of C (1 vs 4)
        assert statistics.fmean(gaps) == pytest.approx(expect, rel=0.05)
        # exponential beyond the dead time: P(gap - min_gap > mean) = 1/e
        tail = sum(g - gap > mtbf / chips for g in gaps) / len(gaps)
        assert tail == pytest.approx(math.exp(-1), abs=0.03)


def test_failures_are_spread_evenly_over_learners_and_chips() -> None:
    entries = gen(big(mtbf_steps=200), learners=4, chips=4, steps=200_000)
    per_learner = [len(steps_of(entries, m)) for m in range(4)]
    per_chip = [sum(e["chip"] == k for e in entries) for k in range(4)]
    for counts in (per_learner, per_chip):
        mean = statistics.fmean(counts)
        assert all(abs(n - mean) < 0.1 * mean for n in counts), counts


def repairs(steps: int = 40_001, **raw: Any) -> list[float]:
    c = big(mtbf_steps=1, min_gap_steps=1, **raw)
    out = [e["repair_s"] for e in gen(c, learners=1, chips=1, steps=steps)]
    assert len(out) > 10_000
    return out


def test_repair_fixed_exponential_lognormal_means() -> None:
    assert set(repairs(repair_mean_s=2.5)) == {2.5}
    exp = repairs(repair="exponential", repair_mean_s=2.0, repair_max_s=3600)
    assert statistics.fmean(exp) == pytest.approx(2.0, rel=0.05)
    assert statistics.stdev(exp) == pytest.approx(2.0, rel=0.08)  # exponential: sd = mean
    logn = repairs(repair="lognormal", repair_mean_s=3.0, repair_sd_s=1.5, repair_max_s=3600)
    assert statistics.fmean(logn) == pytest.approx(3.0, rel=0.05)
    assert statistics.stdev(logn) == pytest.approx(1.5, rel=0.1)
    assert min(logn) > 0


def test_repair_and_freeze_draws_are_clamped() -> None:
    r = repairs(repair="exponential", repair_mean_s=2.0, repair_min_s=0.5, repair_max_s=4.0)
    assert min(r) == 0.5 and max(r) == 4.0  # both clamps are hit with an exponential of mean 2
    c = big(mtbf_steps=1, min_gap_steps=1, actions=(("freeze", 1.0),), repair="exponential", freeze_s=1.0,
            repair_min_s=0.25, repair_max_s=3.0)
    f = [e["until"]["after_s"] for e in gen(c, learners=1, chips=1, steps=20_001)]
    assert min(f) == 0.25 and max(f) == 3.0
    assert 0.9 < statistics.fmean(f) < 1.2  # mean 1, a little raised by the lower clamp


def test_min_gap_respected_on_each_learner() -> None:
    entries = gen(cfg(mtbf_steps=5, min_gap_steps=25, steps=5000), steps=5000)
    for m in range(4):
        s = steps_of(entries, m)
        assert len(s) > 100
        assert min(b - a for a, b in zip(s, s[1:], strict=False)) >= 25


def test_horizon_and_start_step() -> None:
    entries = gen(cfg(mtbf_steps=5, min_gap_steps=1))
    steps = [e["at"]["step"] for e in entries]
    assert min(steps) >= 1 and max(steps) < default_end_step(300) == 270
    assert max(steps) >= 260  # the horizon, not something else, stops it
    entries = gen(cfg(mtbf_steps=5, min_gap_steps=1, start_step=100, end_step=150))
    steps = [e["at"]["step"] for e in entries]
    assert min(steps) >= 100 and max(steps) < 150
    assert gen(cfg(mtbf_steps=1e9)) == []


def test_max_faults_keeps_the_earliest() -> None:
    full = gen(cfg(mtbf_steps=20))
    assert len(full) > 10
    assert gen(cfg(mtbf_steps=20, max_faults=10)) == full[:10]


def test_actions_as_pairs_from_a_resolved_config_round_trip() -> None:
    c = cfg(**MIXED)
    again = validate(dataclasses.asdict(c), KEY, 4, 2, 300)
    assert again == c and validate(c, KEY, 4, 2, 300) == c
    assert c.actions == (("kill_chip", 2.0), ("kill_learner", 1.0), ("crash_host", 1.0), ("freeze", 1.0))
    assert cfg(actions={"freeze": 1, "kill_chip": 0}).actions == (("freeze", 1.0),)


@pytest.mark.parametrize(("raw", "match"), [
    ({"mtbf_steps": -1}, r"random_faults\.mtbf_steps = -1: must be > 0"),
    ({"mtbf_steps": "often"}, r"random_faults\.mtbf_steps = 'often': must be a number in \(0, 1000000000\]"),
    ({}, r"random_faults\.mtbf_steps: required"),
    ({"mtbf_steps": 10, "mtbf": 3}, r"unknown key random_faults\.mtbf; allowed: mtbf_steps, actions"),
    ({"mtbf_steps": 10, "actions": {"slow": 1}}, r"random_faults\.actions\.slow: not a random fault; allowed"),
    ({"mtbf_steps": 10, "actions": {"kill_chip": -1}}, r"random_faults\.actions\.kill_chip = -1: must be >= 0"),
    ({"mtbf_steps": 10, "actions": {"kill_chip": 0}}, r"random_faults\.actions = .*weight > 0"),
    ({"mtbf_steps": 10, "actions": ["kill_chip"]}, r"random_faults\.actions = .*must be a table of weights"),
    ({"mtbf_steps": 10, "repair": "weibull"}, r"random_faults\.repair = 'weibull': must be one of fixed, expon"),
    ({"mtbf_steps": 10, "repair_sd_s": 0}, r"random_faults\.repair_sd_s = 0: must be > 0"),
    ({"mtbf_steps": 10, "repair_mean_s": 90}, r"random_faults\.repair_mean_s = 90: must be in \[0, 60\]"),
    ({"mtbf_steps": 10, "repair_min_s": 5, "repair_max_s": 4}, r"random_faults\.repair_min_s = 5: must be <="),
    ({"mtbf_steps": 10, "repair": "exponential", "repair_mean_s": 0}, r"random_faults\.repair_mean_s = 0: must"),
    ({"mtbf_steps": 10, "actions": {"freeze": 1}, "freeze_s": 99}, r"random_faults\.freeze_s = 99: must be in"),
    ({"mtbf_steps": 10, "start_step": 0}, r"random_faults\.start_step = 0: must be >= 1"),
    ({"mtbf_steps": 10, "start_step": 1.5}, r"random_faults\.start_step = 1\.5: must be an integer"),
    ({"mtbf_steps": 10, "end_step": 301}, r"random_faults\.end_step = 301: must be <= 300|in \[2, 300\]"),
    ({"mtbf_steps": 10, "start_step": 280}, r"random_faults\.start_step = 280: must be below the horizon end_step"),
    ({"mtbf_steps": 10, "start_step": 50, "end_step": 50}, r"random_faults\.start_step = 50: must be below"),
    ({"mtbf_steps": 10, "min_gap_steps": 0}, r"random_faults\.min_gap_steps = 0: must be >= 1"),
    ({"mtbf_steps": 10, "max_faults": MAX_FAULTS + 1}, r"random_faults\.max_faults = 10001: must be"),
    ({"mtbf_steps": 10, "seed": True}, r"random_faults\.seed = True: must be an integer"),
    ({"mtbf_steps": 0.01, "min_gap_steps": 1}, r"random_faults\.mtbf_steps = 0\.01: expands into ~\d+ faults"),
])
def test_validation_names_the_key(raw: dict, match: str) -> None:
    steps = 300 if "expands" not in match else 100_000
    with pytest.raises(ScheduleError, match=match):
        validate(raw, KEY, 4, 2, steps)
    assert issubclass(ScheduleError, ValueError)


def test_a_capped_dense_config_is_allowed() -> None:
    c = validate({"mtbf_steps": 0.01, "min_gap_steps": 1, "max_faults": 50}, KEY, 4, 2, 100_000)
    assert len(gen(c, steps=100_000)) == 50
