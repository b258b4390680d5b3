"""`diloco-chaos validate` reports every error of a document in one run, each naming its key, and none that
only follows from another already reported (diloco_chaos/harness/config/check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from diloco_chaos.harness import cli
from diloco_chaos.harness.config.scenario import build, from_dict
from diloco_chaos.harness.config.sections import MAX_REPORTED, ScenarioError

DEFAULT = str(Path(cli.__file__).parent / "config" / "scenarios" / "default.toml")

SEVERAL = """\
name = "several"
colour = "blue"
[topology]
learners = 0
[train]
lr = -0.1
[[faults]]
action = "degrade"
learner = 0
latency = 5
[[faults]]
action = "explode"
learner = 0
"""


def lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.strip()]


def test_several_independent_mistakes_are_reported_in_one_run(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "several.toml"
    path.write_text(SEVERAL)
    assert cli.main(["validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    got = lines(err)
    assert all(x.startswith(f"{path}: invalid: ") for x in got), got
    for key in ("unknown key colour", "topology.learners = 0", "train.lr = -0.1", "faults[0].latency",
                "faults[1].action = 'explode'"):
        assert sum(key in x for x in got) == 1, (key, got)
    assert len(got) == 5, got


def test_from_dict_raises_one_error_holding_each() -> None:
    import tomllib

    with pytest.raises(ScenarioError) as info:
        from_dict(tomllib.loads(SEVERAL))
    assert len(info.value.problems) == 5
    assert str(info.value).splitlines() == [str(p) for p in info.value.problems]
    with pytest.raises(ScenarioError) as one:
        from_dict({"topology": {"learners": 0}})
    assert one.value.problems == (one.value,) and str(one.value) == "topology.learners = 0: must be in [1, 64]"


def test_an_incident_with_two_bad_faults_reports_both(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    incident = tmp_path / "incident.toml"
    incident.write_text('[[faults]]\naction = "degrade"\nlearner = 0\nlatnecy_ms = 5\n'
                        '[[faults]]\naction = "partition"\nlearner = 9\n')
    assert cli.main(["validate", DEFAULT, "--incident", str(incident)]) == 2
    got = lines(capsys.readouterr().err)
    assert len(got) == 2, got
    assert all(str(incident) in x and x.startswith(f"{DEFAULT}: invalid: ") for x in got), got
    assert "faults[0].latnecy_ms (did you mean latency_ms?)" in got[0]
    assert "faults[1].learner = 9: must be in [0, 3]" in got[1]


def test_an_incident_is_checked_even_when_the_scenario_has_errors(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    scenario, incident = tmp_path / "s.toml", tmp_path / "i.toml"
    scenario.write_text("[topology]\nlearners = 0\n")
    incident.write_text('[[faults]]\naction = "partition"\nlearner = 2\n[[faults]]\naction = "nope"\nlearner = 0\n')
    assert cli.main(["validate", str(scenario), "--incident", str(incident)]) == 2
    got = lines(capsys.readouterr().err)
    assert len(got) == 2, got  # learner = 2 is not wrong until topology.learners is known
    assert "topology.learners = 0" in got[0] and "faults[1].action = 'nope'" in got[1] and str(incident) in got[1]


@pytest.mark.parametrize("doc, reported, not_reported", [
    # a fault's learner range needs topology.learners
    ({"topology": {"learners": 0}, "faults": [{"action": "partition", "learner": 3}]},
     "topology.learners", "faults[0]"),
    ({"topology": "four", "diloco": {"min_quorum": 3}}, "topology: must be a table", "min_quorum"),
    # never-fires needs train.steps; min_quorum needs learners
    ({"train": {"steps": 0}, "faults": [{"action": "partition", "learner": 0, "at": {"step": 500}}]},
     "train.steps", "never reached"),
    ({"topology": {"learners": -1}, "diloco": {"min_quorum": 2}}, "topology.learners", "min_quorum"),
    # the timeout hierarchy needs each of its timeouts
    ({"timeouts": {"liveness_s": -1.0}}, "timeouts.liveness_s", "timeout hierarchy"),
    ({"timeouts": {"liveness_s": "3"}}, "timeouts.liveness_s", "heartbeat_s"),
    # n_heads | d_model needs both; fragments <= tensors needs n_layers
    ({"model": {"n_heads": 0}}, "model.n_heads = 0", "must divide"),
    ({"model": {"n_layers": 0}, "diloco": {"fragments": 100}}, "model.n_layers", "diloco.fragments"),
    # a chip index needs chips_per_learner; a kill needs recovery.policy
    ({"topology": {"chips_per_learner": 0}, "recovery": {"policy": "restart"},
      "faults": [{"action": "kill_chip", "learner": 0, "chip": 5}]}, "chips_per_learner", "faults[0]"),
    ({"recovery": {"policy": "sometimes"}, "faults": [{"action": "kill_learner", "learner": 0}]},
     "recovery.policy = 'sometimes'", "faults[0]"),
    # random_faults is not drawn (nor judged) before topology is range-checked
    ({"topology": {"learners": 10**8}, "random_faults": {"mtbf_steps": 1}}, "topology.learners", "random_faults"),
])
def test_consequential_errors_are_not_reported(doc: dict, reported: str, not_reported: str) -> None:
    sc, errors = build(doc)
    assert sc is None
    assert len(errors) == 1, errors
    assert reported in str(errors[0]) and not_reported not in str(errors[0]), errors


def test_rules_still_run_when_their_inputs_are_valid() -> None:
    _, errors = build({"seed": -1, "topology": {"learners": 2}, "diloco": {"min_quorum": 3},
                       "faults": [{"action": "partition", "learner": 5}, {"action": "partition", "learner": 0,
                                                                            "at": {"step": 10**6}}]})
    text = [str(e) for e in errors]
    assert len(text) == 4, text
    assert any(t.startswith("seed = -1") for t in text)
    assert any(t.startswith("faults[0].learner = 5") for t in text)
    assert any(t.startswith("faults[1].at.step = 1000000: never reached") for t in text)
    assert any(t.startswith("diloco.min_quorum = 3") for t in text)


def test_a_valid_document_gives_the_same_scenario_as_before() -> None:
    import tomllib

    sc, errors = build(tomllib.loads(Path(DEFAULT).read_text()))
    assert errors == [] and sc is not None and sc == from_dict(sc.to_dict())


def test_the_number_of_errors_reported_is_capped() -> None:
    _, errors = build({"faults": [{"action": "nope", "learner": 0}] * (MAX_REPORTED + 30)})
    assert len(errors) == MAX_REPORTED + 1
    assert str(errors[-1]) == f"... and 30 more errors (first {MAX_REPORTED} shown)"


def test_run_refuses_with_every_error_before_any_process_starts(tmp_path: Path) -> None:
    path = tmp_path / "several.toml"
    path.write_text(SEVERAL)
    res = subprocess.run([sys.executable, "-m", "diloco_chaos.harness.entry", "run", str(path), "--quiet",
                          "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len([x for x in res.stderr.splitlines() if x.startswith("diloco-chaos: invalid scenario: ")]) == 5
    assert not (tmp_path / "runs").exists()


def test_the_errors_of_drawn_faults_are_reported_once_per_kind_as_the_tables() -> None:
    """A [random_faults] draw of kills under recovery.policy = 'fail': one line for the table, not one per draw."""
    doc = {"topology": {"learners": 2, "chips_per_learner": 2}, "train": {"steps": 400},
           "recovery": {"max_restarts": 50}, "random_faults": {"mtbf_steps": 100, "min_gap_steps": 5},
           "faults": [{"action": "kill_chip", "learner": 0, "chip": 0}]}
    _, errors = build(doc)
    text = [str(e) for e in errors]
    assert len(text) == 2, text
    assert text[0].startswith("faults[0].action = 'kill_chip': needs recovery.policy = 'restart'")
    assert text[1].startswith("random_faults: the draw's faults[1].action = 'kill_chip': needs recovery.policy")
    assert text[1].endswith("more drawn faults alike)")
    doc["recovery"] = {"max_restarts": 50, "policy": "restart"}
    sc, errors = build(doc)
    assert errors == [] and sc is not None and len(sc.faults) > 2 and sc.random_faults_source
