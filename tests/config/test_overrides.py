"""`--set KEY=VALUE`: scenario keys changed from the command line, validated like the file, recorded in the run.

The parsing and validation are pure (diloco_chaos/harness/config/scenario.py apply_overrides, scenario_check); one real
short run shows the run used the overridden value and config.json records both the override and the effective value."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import tiny_table

from diloco_chaos.harness.cli import main
from diloco_chaos.harness.config.scenario import apply_overrides, from_dict, load, parse_override
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.run.replay import recorded_scenario
from tests.report.test_results import write_toml


def test_values_are_read_as_toml_and_bare_words_as_strings() -> None:
    assert parse_override("train.steps=500") == (["train", "steps"], 500)
    assert parse_override("train.lr=3e-4") == (["train", "lr"], 3e-4)
    assert parse_override("diloco.wire_dtype=fp32") == (["diloco", "wire_dtype"], "fp32")
    assert parse_override('name="x y"') == (["name"], "x y")
    assert parse_override("recovery.syncer_checkpoint_fsync=true") == (["recovery", "syncer_checkpoint_fsync"], True)
    assert parse_override("launch.agents=['a:1', 'b:2']") == (["launch", "agents"], ["a:1", "b:2"])
    assert parse_override(" seed = 3 ") == (["seed"], 3)


@pytest.mark.parametrize("text", ["train.steps", "=5", "train..steps=5", "train.steps x=5", ".seed=1"])
def test_a_malformed_override_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(repr(text))):
        parse_override(text)


def test_overrides_set_nested_keys_in_order_and_are_recorded_without_touching_the_input() -> None:
    table = tiny_table(steps=60)
    out = apply_overrides(table, ["train.steps=10", "train.steps=12", "syncer.shards=1", "seed=9"])
    assert out["train"]["steps"] == 12 and out["syncer"] == {"shards": 1} and out["seed"] == 9
    assert out["overrides"] == ["train.steps=10", "train.steps=12", "syncer.shards=1", "seed=9"]
    assert table["train"]["steps"] == 60 and "overrides" not in table and "syncer" not in table
    with pytest.raises(ScenarioError, match=r"train\.steps is a value, not a table"):
        apply_overrides(table, ["train.steps.x=1"])


def test_an_overridden_scenario_has_the_effective_values_and_the_record() -> None:
    sc = from_dict(tiny_table(), ["train.steps=500", "diloco.wire_dtype=bf16", "topology.learners=3"])
    assert (sc.train.steps, sc.diloco.wire_dtype, sc.topology.learners) == (500, "bf16", 3)
    assert sc.overrides == ("train.steps=500", "diloco.wire_dtype=bf16", "topology.learners=3")
    again = from_dict(json.loads(json.dumps(sc.to_dict())))  # what a replay reads from config.json
    assert again == sc


@pytest.mark.parametrize(("override", "error"), [
    ("train.stepz=5", r"unknown key train\.stepz \(did you mean steps\?\) in \[train\]; allowed: steps"),
    ("trian.steps=5", r"unknown key trian \(did you mean train\?\) in the top level"),
    ("train.steps=0", r"train\.steps = 0: must be in \[1, "),
    ("train.steps=many", r"train\.steps = 'many': must be an integer"),
    ("diloco.wire_dtype=fp33", r"diloco\.wire_dtype = 'fp33': must be one of fp32, "),
    ("topology.learners=1", r"diloco\.min_quorum = 2: must be in \[1, topology\.learners = 1\]"),
])
def test_a_bad_override_gives_the_same_error_as_the_file_would(override: str, error: str, tmp_path: Path) -> None:
    table = tiny_table(diloco={"min_quorum": 2})
    with pytest.raises(ScenarioError, match=error):
        from_dict(table, [override])
    key = override.partition("=")[0]
    section, _, name = key.rpartition(".")
    in_file: dict[str, Any] = json.loads(json.dumps(table))
    in_file.setdefault(section, {})[name] = parse_override(override)[1]
    with pytest.raises(ScenarioError, match=error):
        load(write_toml(tmp_path / "s.toml", in_file))


def test_validate_applies_overrides_and_reports_every_bad_one(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = write_toml(tmp_path / "s.toml", tiny_table())
    assert main(["validate", str(path), "--set", "topology.learners=3", "--set", "train.steps=7"]) == 0
    assert "3x2" in capsys.readouterr().out
    assert main(["validate", str(path), "--set", "train.stepz=7", "--set", "seed=-1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key train.stepz (did you mean steps?)" in err and "seed = -1: must be in [0, " in err
    assert main(["validate", str(path), "--set", "nonsense"]) == 2
    assert "--set 'nonsense': must be KEY=VALUE" in capsys.readouterr().err


def test_a_run_uses_the_overridden_steps_and_config_json_records_the_override(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_toml(tmp_path / "s.toml", tiny_table("decoupled", learners=2, chips=1, steps=60))
    rc = main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--quiet", "--set", "train.steps=12",
               "--set", "diloco.wire_dtype=fp32"])
    out, err = capsys.readouterr()
    assert rc == 0, (err + out)[-4000:]
    run_dir = Path(re.search(r"^run directory: (\S+)$", out, re.M).group(1))  # type: ignore[union-attr]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["overrides"] == ["train.steps=12", "diloco.wire_dtype=fp32"]
    assert config["train"]["steps"] == 12 and config["diloco"]["wire_dtype"] == "fp32"
    last = {}
    for e in read_events(run_dir / EVENTS_FILE):
        if e["ev"] == "step":
            last[e["learner"]] = max(last.get(e["learner"], 0), e["step"])
    assert last == {0: 12, 1: 12}, f"each learner ran the overridden 12 steps, not the file's 60: {last}"
    assert recorded_scenario(run_dir).overrides == ("train.steps=12", "diloco.wire_dtype=fp32")
