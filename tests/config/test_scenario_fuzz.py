"""Property: any scenario document, and any bytes as a scenario file, is a Scenario or a ScenarioError naming
what is wrong; nothing else escapes (bench/fuzz.py runs 10,000 of each)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diloco_chaos.harness.config.scenario import Scenario, build, from_dict, load
from diloco_chaos.harness.config.sections import MAX_REPORTED, ScenarioError
from tests.config.scenario_strategies import documents


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents())
def test_a_document_is_a_scenario_or_a_scenario_error(doc: dict[str, Any]) -> None:
    try:
        sc = from_dict(doc)
    except ScenarioError as e:
        assert str(e)  # says what is wrong
        return
    assert isinstance(sc, Scenario)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents())
def test_every_error_of_a_document_is_a_scenario_error_and_there_is_one_iff_it_is_refused(
        doc: dict[str, Any]) -> None:
    sc, errors = build(doc)
    assert (sc is None) == bool(errors)
    assert len(errors) <= MAX_REPORTED + 1
    assert all(isinstance(e, ScenarioError) and str(e) for e in errors)
    try:
        from_dict(doc)
    except ScenarioError as e:
        assert [str(p) for p in e.problems] == [str(x) for x in errors]


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_any_bytes_are_a_scenario_or_a_scenario_error(tmp_path_factory: Any, data: bytes) -> None:
    path = Path(tmp_path_factory.mktemp("fuzz")) / "s.toml"
    path.write_bytes(data)
    try:
        load(path)
    except ScenarioError as e:
        assert str(e)
