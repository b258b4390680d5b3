"""Hypothesis strategies for scenario documents: near-valid tables with every kind of wrong value in them.

Shared by tests/config/test_scenario_fuzz.py (a small, fixed number of examples in the test command) and
bench/fuzz.py (10,000 of them). Documents are built from the real section and key names, so that most of them
get past the first unknown-key check and reach the deeper rules, with values of every JSON/TOML type,
extremes (huge ints, 1e308, inf, nan, negatives) and, now and then, unknown keys and whole random tables.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any

from hypothesis import strategies as st

from diloco_chaos.chaos.fault_generator import RandomFaultsConfig
from diloco_chaos.chaos.schedule import ACTION_PARAMS, ACTIONS
from diloco_chaos.harness.config.scenario import Scenario, builtin

_HINTS = typing.get_type_hints(Scenario)
SECTIONS: dict[str, list[str]] = {
    name: [g.name for g in dataclasses.fields(hint)] for name, hint in _HINTS.items()
    if isinstance(hint, type) and dataclasses.is_dataclass(hint)
}

scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30), st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, 2, 4, 0.5, 1e308, -1.0]),
    st.booleans(), st.text(max_size=12), st.sampled_from(["decoupled", "ddp", "restart", "fail", "blackhole", ""]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=6)
triggers = st.one_of(
    st.fixed_dictionaries({"step": st.integers(0, 400)}), st.fixed_dictionaries({"after_s": st.floats(0, 5)}),
    st.dictionaries(st.sampled_from(["step", "learner", "merges", "time_s", "after_s", "stp"]), scalars,
                    max_size=2))


@st.composite
def faults(draw: st.DrawFn) -> dict[str, Any]:
    action = draw(st.one_of(st.sampled_from(ACTIONS), st.text(max_size=8)))
    keys = list(ACTION_PARAMS.get(action, ())) + ["chip", "latency", "bogus"]
    out: dict[str, Any] = {"action": action, "learner": draw(st.one_of(st.integers(0, 4), scalars))}
    out.update(draw(st.dictionaries(st.sampled_from(keys), scalars, max_size=3)))
    if draw(st.booleans()):
        out["at"] = draw(st.one_of(triggers, scalars))
    if draw(st.booleans()):
        out["until"] = draw(triggers)
    return out


_BASE = builtin("default").to_dict()
"""A valid document: most generated documents are this one with a few things changed, so that they get past
the first check and reach the deeper rules (cross-field, faults against the topology, the random draw)."""

plausible = st.one_of(st.integers(min_value=0, max_value=12), st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 300]),
                      st.booleans())


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = copy.deepcopy(_BASE) if draw(st.integers(0, 9)) else {}
    doc.pop("random_faults_source", None)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        section = draw(st.sampled_from(sorted(SECTIONS)))
        if kind <= 4:  # one key of a section set to a plausible or a wild value
            table = doc.setdefault(section, {})
            if isinstance(table, dict):
                table[draw(st.sampled_from([*SECTIONS[section], "typo"]))] = draw(
                    plausible if kind <= 2 else values)
        elif kind == 5:  # a whole section replaced
            doc[section] = draw(st.one_of(scalars, st.dictionaries(st.text(max_size=6), scalars, max_size=2)))
        elif kind == 6:
            doc[draw(st.sampled_from(["name", "seed", "algorithm", "typo"]))] = draw(scalars)
        elif kind <= 8:
            doc["faults"] = draw(st.one_of(st.lists(faults(), min_size=1, max_size=3), scalars))
        else:
            rf = [g.name for g in dataclasses.fields(RandomFaultsConfig)]
            doc["random_faults"] = draw(st.dictionaries(st.sampled_from([*rf, "mtbf"]), plausible, max_size=3))
    return doc
