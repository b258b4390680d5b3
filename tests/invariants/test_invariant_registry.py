"""The invariant registry (diloco_chaos/harness/invariants/registry.py): every module of
diloco_chaos/harness/invariants/checks registers
exactly one invariant, check_all and the pytest plugin list the registry, docs/invariants.md is its output, and
bounds are checked by name and value before anything is measured."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
from conftest import as_records

from diloco_chaos.harness.algorithms.base import names
from diloco_chaos.harness.chaos_run import INVARIANTS
from diloco_chaos.harness.invariants import (
    UnknownBound,
    check_all,
    check_all_keywords,
    checks,
    load_run,
    no_global_downtime,
    spec,
    specs,
)
from diloco_chaos.harness.invariants.doc import render
from diloco_chaos.harness.invariants.registry import discover
from tests.invariants.test_invariants import decoupled_log, write_run
from tests.invariants.test_protocol_invariants import with_protocol_facts


def _check_modules() -> list[str]:
    """The invariant modules of checks/ and its sub-packages, by their path below checks/ (torchft.quorum_floor)."""
    prefix = f"{checks.__name__}."
    return [m.name.removeprefix(prefix) for m in pkgutil.walk_packages(checks.__path__, prefix) if not m.ispkg
            and not m.name.rpartition(".")[2].startswith("_")]


def test_every_module_registers_exactly_one_invariant() -> None:
    discover()
    by_module: dict[str, list[str]] = {}
    for s in specs().values():
        by_module.setdefault(s.fn.__module__.removeprefix(f"{checks.__name__}."), []).append(s.name)
    for path in _check_modules():
        name = path.rpartition(".")[2]
        importlib.import_module(f"diloco_chaos.harness.invariants.checks.{path}")
        assert by_module.get(path) == [name], f"module {path} registers {by_module.get(path)}"
        tree = ast.parse((Path(checks.__file__).parent / f"{path.replace('.', '/')}.py").read_text())
        decorated = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                     and any(isinstance(d, ast.Call) and getattr(d.func, "id", "") == "register"
                             for d in n.decorator_list)]
        assert decorated == [name]
    assert sorted(by_module) == sorted(_check_modules())


def test_registry_names_are_check_alls_and_the_plugins(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, with_protocol_facts(decoupled_log())))
    results = check_all(run, max_loss=3.0, bound_s=1.0, min_uptime=0.9, within_s=5.0)
    assert list(specs()) == list(INVARIANTS)
    assert [r.name for r in results] == [n for n, s in specs().items() if "decoupled" in s.algorithms]
    assert "replicas_agree" in specs() and "replicas_agree" not in [r.name for r in results]  # torchft's only
    for s in specs().values():
        assert s.summary and s.algorithms and all(a in names() for a in s.algorithms)
        assert s.mode == "always" or any(b.triggers for b in s.bounds)


def test_the_cli_lists_every_invariant_and_bound_from_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    from diloco_chaos.harness.cli import main

    assert main(["invariants"]) == 0
    out = capsys.readouterr().out
    assert out == render()
    for s in specs().values():
        assert f"| `{s.name}` |" in out and all(f"`{b.name}`" in out for b in s.bounds)


NEW_INVARIANT = '''"""Invariant `always_ok`: a test's stand-in, to show that one module is all a new invariant needs."""

from diloco_chaos.harness.invariants.base import InvariantResult
from diloco_chaos.harness.invariants.registry import Bound, register


@register(bounds=(Bound("limit", "how much is allowed", default=1.0, low=0.0),), order=999)
def always_ok(run, limit=1.0):
    return InvariantResult("always_ok", True, 0.0, limit, "nothing to check")
'''


def test_adding_an_invariant_is_adding_one_module(tmp_path: Path) -> None:
    """One new file in the checks package: check_all, ChaosRun.check's lookup, bound validation and the CLI's list
    all have it, with nothing else edited."""
    from diloco_chaos.harness.invariants import registry

    extra = tmp_path / "extra_checks"
    extra.mkdir()
    (extra / "always_ok.py").write_text(NEW_INVARIANT)
    checks.__path__.append(str(extra))
    try:
        discover()
        assert "always_ok" in specs() and "| `always_ok` |" in render()
        run = load_run(write_run(tmp_path, with_protocol_facts(decoupled_log())))
        assert check_all(run)[-1].name == "always_ok"
        assert spec("always_ok")(run, limit=2.0).ok
        with pytest.raises(ValueError, match="limit"):
            spec("always_ok")(run, limit=-1.0)
    finally:
        checks.__path__.remove(str(extra))
        registry._REGISTRY.pop("always_ok", None)
        import sys

        sys.modules.pop("diloco_chaos.harness.invariants.checks.always_ok", None)


def test_one_bound_name_everywhere_a_former_name_is_refused_with_the_new_one(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, decoupled_log()))
    new = {r.name: r for r in check_all(run, bound_s=0.001, within_s=5.0)}
    assert new["no_global_downtime"] == no_global_downtime(run, bound_s=0.001) == spec("no_global_downtime")(
        run, bound_s=0.001)
    assert not new["no_global_downtime"].ok and new["rejoined"].ok
    for call, old, name in ((lambda: check_all(run, downtime_bound_s=0.001), "downtime_bound_s", "bound_s"),
                            (lambda: spec("rejoined")(run, rejoin_within_s=5.0), "rejoin_within_s", "within_s")):
        with pytest.raises(UnknownBound, match=f"'{old}' was renamed '{name}'"):
            call()


@pytest.mark.parametrize(("call", "words"), [
    (lambda run: check_all(run, bound=1.0), ["check_all", "'bound'", "bound_s", "did you mean 'bound_s'"]),
    (lambda run: spec("rejoined")(run, within=1.0), ["invariant rejoined", "'within'", "allowed: within_s",
                                                     "did you mean 'within_s'"]),
    (lambda run: spec("token_accounting")(run, tolerence=1.0), ["invariant token_accounting",
                                                                 "allowed: show, tolerance",
                                                                 "did you mean 'tolerance'"]),
])
def test_a_misspelled_bound_names_the_invariant_and_a_close_match(tmp_path: Path, call, words) -> None:
    run = load_run(write_run(tmp_path, decoupled_log()))
    with pytest.raises(UnknownBound) as e:
        call(run)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(("invariant", "bounds", "bad"), [
    ("availability", {"min_uptime": 1.5}, "min_uptime=1.5"),
    ("availability", {"min_uptime": -0.1}, "min_uptime=-0.1"),
    ("no_global_downtime", {"bound_s": -1.0}, "bound_s=-1.0"),
    ("rejoined", {"within_s": -2.0}, "within_s=-2.0"),
    ("token_accounting", {"tolerance": -1e-3}, "tolerance=-0.001"),
    ("converged", {"baseline_loss": 2.0, "tolerance": -0.1}, "tolerance=-0.1"),
])
def test_an_impossible_bound_is_a_value_error_naming_it(tmp_path: Path, invariant, bounds, bad) -> None:
    run = load_run(write_run(tmp_path, decoupled_log()))
    with pytest.raises(ValueError, match=f"invariant {invariant}: bound {bad}"):
        spec(invariant)(run, **bounds)


def test_check_all_rejects_an_impossible_bound_before_measuring(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path, decoupled_log()))
    with pytest.raises(ValueError, match="invariant availability: bound min_uptime=2"):
        check_all(run, max_loss=3.0, min_uptime=2)
    with pytest.raises(ValueError, match="unknown invariant 'rejoin'.*did you mean 'rejoined'"):
        spec("rejoin")


def test_updates_accounted_reads_a_superseded_push_by_its_typed_cause() -> None:
    """The cause decides; the human-readable reason is only read for run directories recorded without one."""
    from diloco_chaos.harness.invariants.checks.updates_accounted import _pool_of
    from diloco_chaos.harness.record.syncer import PushSuperseded
    from diloco_chaos.trainers.syncers.decoupled_records import SupersededCause

    def superseded(**fields: str) -> PushSuperseded:
        rec = as_records([{"ev": "push_superseded", **fields}])[0]
        assert isinstance(rec, PushSuperseded)
        return rec

    for cause in SupersededCause:
        pool = _pool_of(superseded(cause=cause.value, reason="reworded in a later version"))
        assert pool == ("newer" if cause in (SupersededCause.NEWER, SupersededCause.REJOIN_DROP,
                                             SupersededCause.BROADCAST_DROP) else cause.value)
    assert superseded(reason="lagging: based on version 3").cause is None  # a recorded run without causes
    assert _pool_of(superseded(reason="lagging: based on version 3")) == "lagging"
    assert _pool_of(superseded(reason="newer push in the same round")) == "newer"


def _bound_names() -> dict[str, list[str]]:
    """The one list: each invariant's bound names, from the registry."""
    return {s.name: [b.name for b in s.bounds] for s in specs().values()}


def _calls(root: Path, glob: str) -> list[tuple[str, str, list[str]]]:
    """(file:line, invariant, keywords) of every `.check("name", ...)` / `.measure("name", ...)` in files."""
    out = []
    for path in sorted(root.glob(glob)):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("check", "measure") and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.append((f"{path.name}:{node.lineno}", node.args[0].value,
                            [k.arg for k in node.keywords if k.arg is not None]))
    return out


def test_every_bound_has_one_name_in_the_functions_check_all_the_plugin_the_suites_and_the_docs() -> None:
    names = _bound_names()
    doc_rows = {ln.split("|")[1].strip().strip("`"): ln.split("|")[3] for ln in render().splitlines()
                if ln.startswith("| `")}
    keywords = check_all_keywords()
    for inv, bounds in names.items():
        params = [p for p in inspect.signature(specs()[inv].fn).parameters][1:]  # after the run
        assert params == bounds, f"{inv}: the function's keywords {params} are not the registry's {bounds}"
        documented = [w.strip().split("`")[1] for w in doc_rows[inv].split("<br>") if w.strip().startswith("`")]
        assert documented == bounds, f"the listed row of {inv}: {documented}"
        if specs()[inv].mode == "when_bound":  # check_all takes each of its bounds by the same name
            assert all(keywords[b] == (inv, b) for b in bounds)
    # the plugin (ChaosRun.check / measure) goes through the registry: every name the suites pass is in it
    calls = _calls(Path(__file__).parents[2] / "suites", "test_*.py")
    assert len(calls) >= 20
    for where, inv, kws in calls:
        assert inv in names, f"{where}: unknown invariant {inv}"
        assert set(kws) <= set(names[inv]), f"{where}: {inv} given {kws}, its bounds are {names[inv]}"
