"""docs/scenario.md and `diloco-chaos keys`: every scenario key, read from the config dataclasses, with the range
the loader enforces."""

from __future__ import annotations

import dataclasses
import math

import pytest
from conftest import tiny_table

from diloco_chaos.chaos.fault_generator import LIMITS, RandomFaultsConfig
from diloco_chaos.harness import cli
from diloco_chaos.harness.config.doc import DOC, REGENERATE, Key, keys, render, sections
from diloco_chaos.harness.config.scenario import Scenario, from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.trainers.config import DilocoConfig


def test_docs_scenario_md_is_generated_from_the_config() -> None:
    assert DOC.read_text() == render(), f"docs/scenario.md is stale: run {REGENERATE}"


def test_every_key_of_every_table_is_listed_and_documented() -> None:
    by_section = {s.name: {k.name for k in s.keys} for s in sections()}
    for f in dataclasses.fields(Scenario):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory):
            assert by_section[f.name] == {g.name for g in dataclasses.fields(f.default_factory)}, f.name
    assert by_section["random_faults"] == {g.name for g in dataclasses.fields(RandomFaultsConfig)}
    assert set(LIMITS) | {"actions", "repair"} == by_section["random_faults"], "a [random_faults] number lacks a range"
    assert {"action", "learner", "at", "until"} == by_section["faults"]
    assert {"repair_s", "chip"} <= by_section["faults.kill_chip"] and "step" in by_section["trigger"]
    undocumented = [k.path for k in keys() if not k.doc]
    assert not undocumented, undocumented


def _above(k: Key) -> float | int:
    hi = k.allowed.strip("[]").split(", ")[1]
    return int(hi) + 1 if k.type == "integer" else float(hi) * 2 + 1


@pytest.mark.parametrize("section", ["topology", "model", "data", "train", "diloco", "timeouts", "eval", "links",
                                     "recovery", "syncer"])
def test_documented_upper_bounds_are_the_ones_the_loader_enforces(section: str) -> None:
    ranged = [k for k in keys(section) if k.allowed.startswith("[") and "topology" not in k.allowed]
    assert ranged, section
    for k in ranged:
        value = _above(k)
        with pytest.raises(ScenarioError) as err:
            from_dict(tiny_table(**{section: {k.name: value}}))
        assert f"{k.path} = {value!r}: must be in [" in str(err.value), (k, str(err.value))
        lo, hi = (float(x) for x in k.allowed.strip("[]").split(", "))
        quoted = str(err.value).split(f"{k.path} = {value!r}: must be in [")[1].split("]")[0]
        assert [float(x) for x in quoted.split(", ")] == [lo, hi] and math.isfinite(hi), k


def test_cli_keys_lists_every_key_of_a_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "diloco"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == [f"diloco.{f.name}" for f in dataclasses.fields(DilocoConfig)]
    (fragments,) = [ln for ln in lines if ln.startswith("diloco.fragments ")]
    assert "integer, default 24  [1, 10000]  -- P: number of parameter fragments" in fragments, fragments
    (rule,) = [ln for ln in lines if ln.startswith("diloco.merge_rule ")]
    assert 'default "rda"  one of "rda", "mean"' in rule, rule
    assert cli.main(["keys", "faults"]) == 0
    out = capsys.readouterr().out
    assert "faults.action " in out and "faults.degrade.latency_ms " in out and "faults.kill_chip.chip " in out
    assert cli.main(["keys"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(keys())


def test_cli_keys_refuses_an_unknown_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["keys", "dilco"]) == 2
    err = capsys.readouterr().err
    assert "no section 'dilco' (did you mean diloco?)" in err and "random_faults" in err
