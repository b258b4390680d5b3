"""Drawing fault schedules from a scenario's `[explore]` table: pure and seeded.

What: `vocabulary(sc)` resolves the table against the scenario (which kinds its validation accepts: its recovery
policy, link backend and target decide; whom faults may hit; the trigger window; how many kills each learner and
the syncer can take), and `draw(vocab, seed, i)` is schedule i of seed s: a `Trial` of typed fault entries the
scenario's validation accepts, each triggered by training progress (`at = { step, learner }`: the target
learner's own step, the most advanced learner's for the syncer) or, with `reaction_share`, by the run's reaction
to an earlier kill in the same schedule (`at = { after = "rejoin", learner }`, `after = "syncer_restored"`): the
overlaps the issue asks for (a learner killed while the syncer restores, a partition during a rejoin), on the
reactions the scenario's target shows (`Target.reactions`).
Parameters are drawn inside explore's ranges (`PARAM_RANGES`), clipped to each kind's own bounds
(diloco_chaos/chaos/faults/, `bounded`); durations (a kill's repair_s, an `until = { after_s }`) in
[min_duration_s, max_duration_s].

Why pure: schedule i draws from its own `random.Random` seeded by (seed, i, attempt), never a global one, so the
set of schedules of a seed is the same whatever `--jobs` is and in whatever order runs finish; a draw the
scenario's validation refuses is drawn again with the next attempt (the same every time).
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass
from typing import Any

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.faults.base import RepairParams
from diloco_chaos.chaos.schedule import REACTIONS, parse_fault
from diloco_chaos.harness.config.explore_check import TARGET, explored_steps, trigger_window
from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.explore.records import Trial
from diloco_chaos.harness.targets import base as target_registry

PARAM_RANGES: dict[str, tuple[float, float]] = {
    "latency_ms": (10.0, 400.0), "bandwidth_kbps": (1000.0, 50_000.0), "period_s": (0.2, 2.0),
    "duty": (0.1, 0.7), "timeout_ms": (0, 500), "average_size": (16, 1024), "delay_us": (0, 2000),
    "bytes": (1024, 1 << 20), "speed": (0.2, 0.8), "probability": (1e-6, 1e-4), "percent": (0.5, 5.0),
}
"""Where explore draws each parameter it sets (then clipped to the kind's own range): harsh enough to matter,
short of what no system could survive."""

DRAWN: dict[str, tuple[str, ...]] = {
    "degrade": ("latency_ms", "bandwidth_kbps"), "flap": ("period_s", "duty"), "reset_peer": ("timeout_ms",),
    "slice": ("average_size", "delay_us"), "limit_data": ("bytes",), "slow": ("speed",),
    "corrupt": ("probability",), "loss": ("percent",),
}
"""The parameters explore sets per kind (besides chip, shard, repair_s); a kind not listed gets its required ones.
Where the scenario's validation refuses some of them (a link backend that cannot carry one), explore sets the
largest part it takes (`drawn_params`)."""

ATTEMPTS = 50
"""Draws tried for one schedule before explore gives up on it (the vocabulary cannot make a valid one)."""


@dataclass(frozen=True)
class Vocabulary:
    """The `[explore]` table resolved against its scenario: everything a draw needs, nothing it must look up."""

    sc: Scenario
    """The scenario at the explored steps (its own faults kept: drawn ones go on top)."""
    kinds: tuple[str, ...]
    learners: tuple[int, ...]
    """Learners faults may hit."""
    syncer: bool
    """Whether syncer kinds may be drawn (a target)."""
    first: int
    last: int
    min_faults: int
    max_faults: int
    min_d: float
    max_d: float
    reaction_share: float
    steps: int
    max_kills: int
    """Kills one learner (or the syncer) may take: recovery.max_restarts less the scenario's own."""
    reactions: tuple[str, ...] = tuple(REACTIONS)
    """The reactions a trigger may wait on: those the scenario's target shows (`Target.reactions`; torchft's
    restarted Lighthouse restores nothing, so no "syncer_restored")."""
    params: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(kind, the parameters explore sets for it: `drawn_params`), for each kind; a kind not listed: DRAWN's."""


def _is_kill(kind: str) -> bool:
    return issubclass(faults.get(kind).params, RepairParams)


def _sample(kind: str, sc: Scenario, first: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One fault of `kind` at `first` setting `names` (default: DRAWN's), for asking the scenario's validation
    whether it takes the kind at all."""
    k = faults.get(kind)
    rng = random.Random(0)
    table = _params(rng, kind, sc, 1.0, names)
    table["action"] = kind
    if k.target == "syncer":
        table["at"] = {"step": first}
    else:
        table["learner"] = 0
        table["at"] = {"step": first, "learner": 0}
    if not _is_kill(kind):
        table["until"] = {"after_s": 1.0}
    return table


def _refusal(sc: Scenario, kind: str, first: int, names: tuple[str, ...] | None = None) -> str | None:
    try:
        sc.replace(faults=[*sc.faults, _sample(kind, sc, first, names)])
    except ScenarioError as e:
        return str(e).split("\n")[0]
    return None


def drawn_params(sc: Scenario, kind: str, first: int) -> tuple[str, ...] | None:
    """The parameters explore sets for `kind` on this scenario: DRAWN's, else the largest part of them the
    scenario's validation takes (the kernel link backend carries degrade's bandwidth_kbps, not its latency_ms);
    None when it takes none of them."""
    names = DRAWN.get(kind, faults.get(kind).required)
    for size in range(len(names), 0, -1):
        for part in itertools.combinations(names, size):
            if _refusal(sc, kind, first, part) is None:
                return part
    return None if names else (() if _refusal(sc, kind, first, ()) is None else None)


def supported(sc: Scenario, kind: str, first: int) -> str | None:
    """Why the scenario's validation refuses a fault of `kind` (None: it takes it, with some of its parameters)."""
    return None if drawn_params(sc, kind, first) is not None else _refusal(sc, kind, first)


def vocabulary(sc: Scenario) -> Vocabulary:
    """The scenario's `[explore]` table resolved (see the module doc). ScenarioError naming explore.kinds when a
    listed kind is one the scenario cannot carry, or when none is left."""
    ex = sc.explore
    steps = explored_steps(sc)
    at_steps = sc.replace(train=dataclasses.replace(sc.train, steps=steps))
    first, last = trigger_window(sc)
    if ex.kinds:
        for kind in ex.kinds:
            why = supported(at_steps, kind, first)
            if why is not None:
                raise ScenarioError(f"explore.kinds: {kind!r} cannot be drawn for this scenario: {why}")
        kinds = ex.kinds
    else:
        kinds = tuple(k for k, kind in faults.kinds().items() if supported(at_steps, k, first) is None)
    targets = ex.targets or (*(f"learner{m}" for m in range(sc.topology.learners)), "syncer")
    learners = tuple(sorted({int(m.group(1)) for t in targets if (m := TARGET.fullmatch(t)) and m.group(1)}))
    syncer = "syncer" in targets
    kinds = tuple(k for k in kinds if (faults.get(k).target == "syncer" and syncer)
                  or (faults.get(k).target != "syncer" and learners))
    if not kinds:
        raise ScenarioError("explore.kinds: no fault kind can be drawn for this scenario and explore.targets "
                            "(its recovery policy, link backend and target refuse every one)")
    own = max([sum(1 for f in sc.faults if _is_kill(f.action) and f.learner == m)
               for m in [*range(sc.topology.learners), None]], default=0)
    shown = target_registry.get(target_registry.system_of(sc)).reactions
    reactions = tuple(r for r in REACTIONS if shown is None or r in shown)
    params = tuple((k, p) for k in kinds if (p := drawn_params(at_steps, k, first)) is not None)
    return Vocabulary(at_steps, kinds, learners, syncer, first, last, ex.min_faults, ex.max_faults,
                      ex.min_duration_s, ex.max_duration_s, ex.reaction_share, steps,
                      max(0, sc.recovery.max_restarts - own), reactions, params)


def _clip(f: dataclasses.Field, lo: float, hi: float) -> tuple[float, float]:
    flo, fhi = f.metadata["range"]
    return max(lo, flo), min(hi, fhi)


def _params(rng: random.Random, kind: str, sc: Scenario, duration: float, names: tuple[str, ...] | None = None
            ) -> dict[str, Any]:
    """The kind's parameters for one fault (`duration`: a kill's repair_s; `names`: those to set, default
    DRAWN's)."""
    k = faults.get(kind)
    fields = {f.name: f for f in dataclasses.fields(k.params)}
    out: dict[str, Any] = {}
    for name in (DRAWN.get(kind, k.required) if names is None else names):
        f = fields[name]
        if "choices" in f.metadata:
            out[name] = rng.choice([c for c in f.metadata["choices"] if c is not None])
            continue
        lo, hi = _clip(f, *PARAM_RANGES.get(name, f.metadata["range"]))
        integral = isinstance(f.metadata["range"][0], int) and isinstance(f.metadata["range"][1], int)
        out[name] = rng.randint(int(lo), int(hi)) if integral else round(rng.uniform(lo, hi), 6 if hi < 1e-2 else 2)
    if "chip" in fields and (kind != "freeze" or rng.random() < 0.5):
        out["chip"] = rng.randrange(sc.topology.chips_per_learner)
    if "shard" in fields and sc.syncer.shards > 1 and rng.random() < 0.5:
        out["shard"] = rng.randrange(sc.syncer.shards)
    if issubclass(k.params, RepairParams):
        out["repair_s"] = duration
    return out


def _duration(rng: random.Random, v: Vocabulary) -> float:
    return round(rng.uniform(v.min_d, v.max_d), 1) if v.max_d > v.min_d else v.min_d


def _one(rng: random.Random, v: Vocabulary, drawn: list[dict[str, Any]], kills: dict[int | None, int]
         ) -> dict[str, Any] | None:
    """One more fault for the schedule so far, or None when the drawn kind has no target left."""
    kind = rng.choice(v.kinds)
    k = faults.get(kind)
    kill = _is_kill(kind)
    used = {(f["action"], f.get("learner")) for f in drawn}
    if k.target == "syncer":
        who: list[int | None] = [None]
    else:
        who = list(v.learners)
    who = [m for m in who if (kind, m) not in used and not (kill and kills.get(m, 0) >= v.max_kills)]
    if not who:
        return None
    target = rng.choice(who)
    d = _duration(rng, v)
    table: dict[str, Any] = {"action": kind, **({} if target is None else {"learner": target})}
    table.update(_params(rng, kind, v.sc, d, dict(v.params).get(kind)))
    reactions = [r for r in ({"after": "rejoin", "learner": f["learner"]} if f.get("learner") is not None
                             else {"after": "syncer_restored"} for f in drawn if _is_kill(f["action"]))
                 if r["after"] in v.reactions]
    if reactions and rng.random() < v.reaction_share:
        table["at"] = {**rng.choice(reactions), "after_s": round(rng.uniform(0.0, 1.0), 1)}
    else:
        step = rng.randint(v.first, v.last)
        table["at"] = {"step": step} if target is None else {"step": step, "learner": target}
    if not kill:
        table["until"] = {"after_s": d}
    if kill:
        kills[target] = kills.get(target, 0) + 1
    return table


def draw(v: Vocabulary, seed: int, i: int) -> Trial | None:
    """Schedule `i` of `seed`: a pure function of (vocabulary, seed, i). None when no attempt made a schedule the
    scenario's validation accepts."""
    learners = v.sc.topology.learners
    for attempt in range(ATTEMPTS):
        rng = random.Random(f"explore:{seed}:{i}:{attempt}")  # str seeds hash with sha512: stable across runs
        n = rng.randint(v.min_faults, v.max_faults)
        drawn: list[dict[str, Any]] = []
        kills: dict[int | None, int] = {}
        for _ in range(n):
            f = _one(rng, v, drawn, kills)
            if f is not None:
                drawn.append(f)
        if len(drawn) < v.min_faults:
            continue
        try:
            v.sc.replace(faults=[*v.sc.faults, *drawn])
        except ScenarioError:
            continue
        specs = tuple(parse_fault(f, f"faults[{j}]", learners) for j, f in enumerate(drawn))
        return Trial(specs, v.steps, learners)
    return None

