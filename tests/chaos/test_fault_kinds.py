"""The fault-kind registry (diloco_chaos/chaos/faults/): one module per kind, each registered once by name, whose params
dataclass declares every parameter's range or choices and documents it; the schedule's tables derive from it,
and every error names the key."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import diloco_chaos.chaos.faults
from diloco_chaos.chaos import faults
from diloco_chaos.chaos.faults.base import FaultKind
from diloco_chaos.chaos.schedule import ACTION_PARAMS, ACTIONS, KILL_ACTIONS, LINK_ACTIONS, PROCESS_ACTIONS, parse_fault
from diloco_chaos.harness import cli
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError

BUILTIN = ("degrade", "partition", "flap", "reset_peer", "slice", "limit_data", "kill_chip", "kill_learner",
           "crash_host", "freeze", "slow", "kill_syncer")
MODULES = [m.name for m in pkgutil.iter_modules(diloco_chaos.chaos.faults.__path__) if m.name != "base"]


def test_every_kind_is_registered_once_from_its_own_module() -> None:
    registered = faults.kinds()
    assert set(BUILTIN) <= set(registered)
    assert sorted(registered) == sorted(MODULES), "one module per kind, named after it"
    for name, kind in registered.items():
        assert kind.name == name and kind.__module__ == f"diloco_chaos.chaos.faults.{name}"
        module = importlib.import_module(f"diloco_chaos.chaos.faults.{name}")
        own = [c for c in vars(module).values() if inspect.isclass(c) and issubclass(c, FaultKind)
               and c is not FaultKind and c.__module__ == module.__name__]
        assert own == [type(kind)], f"{name}: exactly one kind per module"
        assert kind.target in ("link", "process", "syncer") and kind.backends and kind.colour.startswith("#")
        assert (kind.target == "link") == (kind.backends != {"local"})


def test_registering_a_name_twice_is_refused() -> None:
    class Again(FaultKind):
        name = "degrade"
        target = "link"

    with pytest.raises(ValueError, match="registered twice"):
        faults.register(Again)


def test_the_schedule_tables_derive_from_the_registry() -> None:
    assert ACTIONS == tuple(faults.kinds()) and ACTIONS[:len(BUILTIN)] == BUILTIN
    assert LINK_ACTIONS == tuple(n for n, k in faults.kinds().items() if k.target == "link")
    assert set(PROCESS_ACTIONS) == set(ACTIONS) - set(LINK_ACTIONS)
    assert KILL_ACTIONS == ("kill_chip", "kill_learner", "crash_host", "kill_syncer")
    assert ACTION_PARAMS["degrade"] == ("profile", "latency_ms", "jitter_ms", "bandwidth_kbps")
    assert set(ACTION_PARAMS["kill_chip"]) == {"chip", "repair_s"}


def _documented_fields(cls: type) -> set[str]:
    """Fields of `cls` (and its dataclass bases) followed by a docstring in their source."""
    out: set[str] = set()
    for c in cls.__mro__:
        if not dataclasses.is_dataclass(c):
            continue
        body = ast.parse(Path(inspect.getfile(c)).read_text())
        node = next(n for n in ast.walk(body) if isinstance(n, ast.ClassDef) and n.name == c.__name__)
        for a, b in zip(node.body, node.body[1:], strict=False):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                out.add(a.target.id)
    return out


@pytest.mark.parametrize("name", sorted(faults.kinds()))
def test_every_parameter_is_documented_and_bounded(name: str) -> None:
    kind = faults.get(name)
    fields = dataclasses.fields(kind.params)
    assert _documented_fields(kind.params) >= {f.name for f in fields}
    for f in fields:
        assert f.default is None, f"{name}.{f.name}: unset is None"
        assert ("range" in f.metadata) != ("choices" in f.metadata), f"{name}.{f.name}"


def _required(name: str) -> dict:
    """The smallest valid entry of a kind (its required parameters set to their lowest allowed value)."""
    kind = faults.get(name)
    raw: dict = {"action": name} if kind.target == "syncer" else {"action": name, "learner": 0}
    raw.update({"degrade": {"latency_ms": 10}, "flap": {"period_s": 1.0, "duty": 0.5}, "limit_data": {"bytes": 10},
                "slow": {"speed": 0.5}, "freeze": {"until": {"after_s": 1.0}},
                "corrupt": {"probability": 0.01}, "loss": {"percent": 1.0}}.get(name, {}))
    return raw


@pytest.mark.parametrize("name", sorted(faults.kinds()))
def test_each_parameter_error_names_its_key(name: str) -> None:
    kind = faults.get(name)
    assert parse_fault(_required(name), "faults[3]", 2).action == name
    for f in dataclasses.fields(kind.params):
        key = f"faults[3].{f.name}"
        if "choices" in f.metadata:
            with pytest.raises(faults.ScheduleError, match=r"must be one of") as e:
                parse_fault({**_required(name), f.name: "nope"}, "faults[3]", 2)
            assert key in str(e.value) and all(c in str(e.value) for c in f.metadata["choices"])
            continue
        lo, hi = f.metadata["range"]
        for bad in (hi * 2 + 1, "x", True):
            with pytest.raises(faults.ScheduleError) as e:
                parse_fault({**_required(name), f.name: bad}, "faults[3]", 2)
            assert f"{key} = " in str(e.value), str(e.value)
        assert f"[{lo}, {hi}]" in _error({**_required(name), f.name: hi * 2 + 1})


def _error(raw: dict) -> str:
    with pytest.raises(faults.ScheduleError) as e:
        parse_fault(raw, "faults[3]", 2)
    return str(e.value)


def test_kind_errors_list_the_names_and_guess_a_typo() -> None:
    msg = _error({"action": "degarde", "learner": 0})
    assert "faults[3].action = 'degarde'" in msg and "(did you mean degrade?)" in msg
    assert all(n in msg for n in ACTIONS)
    msg = _error({"action": "degrade", "learner": 0, "latency": 5})
    assert "unknown key faults[3].latency (did you mean latency_ms?)" in msg
    msg = _error({"action": "freeze", "learner": 0, "duty": 0.5, "until": {"after_s": 1}})
    assert "faults[3].duty: not a parameter of freeze" in msg and "it takes chip" in msg
    with pytest.raises(faults.ScheduleError, match="did you mean slice"):
        faults.get("slic")


def test_a_scenario_keeps_its_flat_fault_tables_through_to_dict() -> None:
    table = {"faults": [{"action": "degrade", "learner": 1, "latency_ms": 40, "at": {"step": 5}},
                        {"action": "kill_chip", "learner": 0, "chip": 0, "repair_s": 1.5},
                        {"action": "flap", "learner": 1, "period_s": 0.5, "duty": 0.5, "until": {"after_s": 2}}],
             "topology": {"learners": 2}, "recovery": {"policy": "restart"}}
    sc = from_dict(table)
    out = sc.to_dict()["faults"]
    assert out[0] == {"action": "degrade", "learner": 1, "at": {"step": 5}, "latency_ms": 40.0}
    assert from_dict({**table, "faults": out}) == sc
    assert sc.faults[1].repair_s == 1.5 and sc.faults[1].latency_ms is None and sc.faults[0].latency_ms == 40.0
    with pytest.raises(AttributeError):
        sc.faults[0].latencyms  # noqa: B018 - a typo is no parameter


CORRUPT = {"action": "corrupt", "learner": 1, "probability": 0.001}


def test_corrupt_is_refused_where_the_run_would_use_a_real_toxiproxy(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """corrupt is an extension of the embedded server: with links.proxy = auto and a real server about (the
    environment the supervisor will read), validation refuses it, naming the fault, the backend and why."""
    table = {"topology": {"learners": 2}, "faults": [CORRUPT]}
    monkeypatch.delenv("TOXIPROXY_URL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert from_dict(table).faults[0].probability == 0.001  # auto finds no real server: embedded
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:9")
    with pytest.raises(ScenarioError) as e:
        from_dict(table)
    assert "faults[0].action = 'corrupt': not supported by the toxiproxy backend" in str(e.value)
    assert "TOXIPROXY_URL" in str(e.value) and "runs on: embedded" in str(e.value)
    assert from_dict({**table, "links": {"proxy": "embedded"}}).faults[0].action == "corrupt"
    monkeypatch.delenv("TOXIPROXY_URL")
    exe = tmp_path / "toxiproxy-server"
    exe.write_text("#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)
    with pytest.raises(ScenarioError, match=r"faults\[0\]\.action = 'corrupt'.*toxiproxy-server is on PATH"):
        from_dict(table)
    # the other link kinds run on any server
    assert from_dict({**table, "faults": [{"action": "partition", "learner": 1}]}).faults[0].action == "partition"


def test_the_cli_refuses_corrupt_for_a_real_server_before_running(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "corrupt.toml"
    path.write_text('[[faults]]\naction = "corrupt"\nlearner = 1\nprobability = 0.001\n')
    monkeypatch.setenv("TOXIPROXY_URL", "http://127.0.0.1:9")
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "faults[0].action = 'corrupt'" in err and "toxiproxy backend" in err and "Traceback" not in err


def test_corrupt_needs_a_probability_in_range() -> None:
    assert "corrupt needs probability" in _error({"action": "corrupt", "learner": 0})
    assert "faults[3].probability = 0.5: must be in [1e-09, 0.1]" in _error({**CORRUPT, "probability": 0.5})
