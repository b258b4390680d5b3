"""Repair-time distributions: how long a failure lasts (a killed chip, learner or host until it is restarted, a
freeze until it thaws).

One definition for the two places that draw them: the random fault generator (diloco_chaos/chaos/fault_generator.py
draws one at a time from a seeded `random.Random`, so a scenario's expanded faults are reproducible) and the goodput
simulator (diloco_chaos/harness/simulator/model.py draws many at once from a numpy `Generator`). Each caller keeps its
own random stream and its own clamping (the generator also rounds to milliseconds), so seeded faults and the
simulator's seeded figures do not depend on the other. The simulator's exponentiated Weibull, fitted to the paper's
repair data and not offered by `[random_faults]`, is the simulator's own.
"""

from __future__ import annotations

import math
import random

import numpy as np

REPAIR_DISTRIBUTIONS = ("fixed", "exponential", "lognormal")
"""fixed (always the mean), exponential, or lognormal (its sd given as a ratio to the mean)."""


def lognormal_params(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with mean `mean` and coefficient of variation `cv` (sd / mean)."""
    sigma2 = math.log1p(cv * cv)
    return math.log(mean) - sigma2 / 2, math.sqrt(sigma2)


def draw_one(rng: random.Random, kind: str, mean: float, cv: float) -> float:
    """One duration of distribution `kind` (REPAIR_DISTRIBUTIONS) with mean `mean`; `cv` is lognormal's sd / mean."""
    if kind == "exponential":
        return rng.expovariate(1.0 / mean)
    if kind == "lognormal":
        mu, sigma = lognormal_params(mean, cv)
        return rng.lognormvariate(mu, sigma)
    if kind == "fixed":
        return mean
    raise ValueError(f"unknown repair distribution {kind!r}; one of {', '.join(REPAIR_DISTRIBUTIONS)}")


def draw_many(rng: np.random.Generator, kind: str, n: int, mean: float, cv: float) -> np.ndarray:
    """`n` durations of distribution `kind` (REPAIR_DISTRIBUTIONS) with mean `mean`, at once; a zero mean gives
    zeros whatever the kind."""
    if kind == "fixed" or mean == 0.0:
        return np.full(n, mean)
    if kind == "exponential":
        return rng.exponential(mean, n)
    if kind == "lognormal":
        mu, sigma = lognormal_params(mean, cv)
        return rng.lognormal(mu, sigma, n)
    raise ValueError(f"unknown repair distribution {kind!r}; one of {', '.join(REPAIR_DISTRIBUTIONS)}")
