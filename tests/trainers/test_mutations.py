"""The mutation switch (diloco_chaos/trainers/mutations.py): only the environment turns a mutation on, never a scenario
file; an unknown name is refused; and each hook changes what the algorithm does (and what it measures) as documented."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.trainers import mutations
from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.learner.core import LearnerCore
from diloco_chaos.trainers.merge.outer_gradient import MergeNorms, outer_gradient, token_weights
from diloco_chaos.trainers.merge.outer_optimizer import NesterovOuterOptimizer, OuterOptConfig
from diloco_chaos.trainers.messages import MergedFragment
from diloco_chaos.trainers.model import ModelConfig

ROOT = Path(__file__).resolve().parents[2]


def on(monkeypatch: pytest.MonkeyPatch, name: str | None) -> None:
    """Switch mutation `name` on in this process (as if the environment named it)."""
    monkeypatch.setattr(mutations, "current", lambda: name)


# -- the switch ----------------------------------------------------------------------------------------------

def test_from_env_reads_one_known_name_and_refuses_others() -> None:
    assert mutations.from_env({}) is None
    assert mutations.from_env({mutations.ENV_VAR: " "}) is None
    assert mutations.from_env({mutations.ENV_VAR: "rda_as_mean"}) == "rda_as_mean"
    with pytest.raises(ValueError) as err:
        mutations.from_env({mutations.ENV_VAR: "rda_as_median"})
    assert "rda_as_median" in str(err.value) and all(name in str(err.value) for name in mutations.MUTATIONS)
    with pytest.raises(ValueError, match="unknown mutation 'typo'"):
        mutations.active("typo")


def child(env_value: str, code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{mutations.ENV_VAR: env_value})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_the_environment_switches_a_process_and_an_unknown_value_raises() -> None:
    ok = child("stale_as_fresh", "from diloco_chaos.trainers import mutations as m\n"
                                 "print(m.active('stale_as_fresh'), m.active('rda_as_mean'))")
    assert ok.returncode == 0 and ok.stdout.split() == ["True", "False"], ok.stderr
    bad = child("bogus", "from diloco_chaos.trainers import mutations as m\nm.active('rda_as_mean')")
    assert bad.returncode != 0 and "ValueError" in bad.stderr and "allowed: rda_as_mean" in bad.stderr


def test_a_run_with_an_unknown_mutation_fails_before_any_process_starts(tmp_path: Path) -> None:
    code = ("import sys\nfrom diloco_chaos.harness.run.supervisor import Supervisor\n"
            "from diloco_chaos.harness.config.scenario import from_dict\n"
            f"Supervisor(from_dict({{'name': 'x'}}), {str(tmp_path)!r})\n")
    bad = child("nope", code)
    assert bad.returncode != 0 and "is not a known mutation" in bad.stderr
    assert not list(tmp_path.iterdir()), "no run directory for a run that cannot start"


def _tables(obj: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every table of a scenario (its nested dataclasses) with its path: ((), scenario), (("diloco",), ...)."""
    out = [(prefix, obj)]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += _tables(value, (*prefix, f.name))
    return out


def test_mutations_are_unreachable_from_scenario_files() -> None:
    tables = _tables(from_dict({"name": "x"}))
    paths = [path for path, _ in tables]
    assert ("diloco",) in paths and ("train",) in paths, paths
    for path in paths:
        for key in ("mutation", "mutations", mutations.ENV_VAR):
            table: dict[str, Any] = {"name": "x"}
            inner = table
            for part in path:
                inner = inner.setdefault(part, {})
            inner[key] = "rda_as_mean"
            with pytest.raises(ScenarioError):
                from_dict(table)
    names = [f.name for _, obj in tables for f in dataclasses.fields(obj)]
    assert not [n for n in names if "mutation" in n], names
    scenario_src = (ROOT / "diloco_chaos" / "harness" / "config" / "scenario.py").read_text()
    assert "mutations" not in scenario_src and mutations.ENV_VAR not in scenario_src


def test_dropped_is_deterministic_and_about_a_tenth() -> None:
    keys = [(0, m, p, a, a + 3) for m in range(4) for p in range(8) for a in range(1, 100, 3)]
    picked = [mutations.dropped(*k) for k in keys]
    assert picked == [mutations.dropped(*k) for k in keys]
    assert 0.06 < sum(picked) / len(picked) < 0.14
    assert [mutations.dropped(1, *k[1:]) for k in keys] != picked, "the seed takes part"


# -- the hooks -----------------------------------------------------------------------------------------------

def deltas() -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    glob = {"w": torch.randn(50, generator=g), "tok_emb.weight": torch.randn(10, generator=g)}
    learners = [{n: t + 0.1 * torch.randn(t.shape, generator=g) for n, t in glob.items()} for _ in range(3)]
    return glob, learners


def test_rda_keeps_the_radial_norm_and_rda_as_mean_shrinks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    glob, learners = deltas()
    norms = MergeNorms()
    outer_gradient(glob, learners, [0.2, 0.3, 0.5], ("tok_emb.weight",), "rda", None, norms)
    assert norms.merged == pytest.approx(norms.radial, rel=1e-6)
    assert norms.embedding_merged < norms.embedding_radial  # the embeddings are averaged
    on(monkeypatch, "rda_as_mean")
    mutated = MergeNorms()
    outer_gradient(glob, learners, [0.2, 0.3, 0.5], ("tok_emb.weight",), "rda", None, mutated)
    assert mutated.radial == pytest.approx(norms.radial) and mutated.merged < 0.9 * mutated.radial


def test_ignore_token_weights_gives_uniform_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    assert token_weights([(2, 200), (1, 100)]) == pytest.approx([2 / 3, 1 / 3])
    on(monkeypatch, "ignore_token_weights")
    assert token_weights([(2, 200), (1, 100)]) == [0.5, 0.5]


def test_the_outer_step_reports_its_effective_lr_and_outer_lr_halved_halves_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def step() -> float:
        opt = NesterovOuterOptimizer(OuterOptConfig(lr=0.7, momentum=0.9))
        params = {"w": torch.ones(8)}
        opt.step("f", params, {"w": torch.full((8,), 0.01)})
        return opt.step("f", params, {"w": torch.linspace(-0.02, 0.03, 8)})

    assert step() == pytest.approx(0.7, rel=1e-4)
    on(monkeypatch, "outer_lr_halved")
    assert step() == pytest.approx(0.35, rel=1e-4)


def test_overlap_off_by_one_applies_a_step_after_pulled_plus_tau(monkeypatch: pytest.MonkeyPatch) -> None:
    def due(pulled: int | None) -> int:
        core = LearnerCore(learner=0, model_cfg=ModelConfig(seq_len=8, d_model=16, n_layers=1, n_heads=2, d_ff=32),
                           train_cfg=TrainConfig(steps=10), diloco_cfg=DilocoConfig(fragments=4, sync_every=4,
                                                                                   overlap=3), seed=0)
        core.step = 5
        assert core.receive(MergedFragment(1, 1, core.fragment_tensors(1), pulled_step=pulled))
        assert core.frags[1].pending_arrived == 5
        return core.frags[1].pending_apply_at

    assert (due(4), due(None)) == (7, 6)
    on(monkeypatch, "overlap_off_by_one")
    assert (due(4), due(None)) == (8, 6)
