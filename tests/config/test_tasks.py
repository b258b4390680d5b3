"""The task contract (diloco_chaos/trainers/task.py): models without embeddings, with tied weights and with buffers; the
built-in tasks; and every bad `[task] factory` refused with exit 2, naming what is wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from diloco_chaos.harness import cli
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.config.task_check import check_memory, memory_estimate, scenario_task, with_task_path
from diloco_chaos.trainers.config import DilocoConfig, TrainConfig
from diloco_chaos.trainers.learner.core import LearnerCore
from diloco_chaos.trainers.merge.outer_gradient import outer_gradient
from diloco_chaos.trainers.syncers.decoupled import DecoupledSyncer
from diloco_chaos.trainers.task import (
    BUILTIN_TASKS,
    Batch,
    Task,
    TaskContext,
    embedding_names,
    load_params,
    load_task,
    parameters,
    recalibrate_buffers,
)
from diloco_chaos.trainers.tasks.image_cnn import ImageCNN
from diloco_chaos.trainers.tasks.regression_mlp import RegressionMLP

CTX = TaskContext(seed=3, learners=2, batch_size=8)


class TiedLM(Task):
    """A bigram LM whose output head is its embedding (weight tying, as in GPT-2)."""

    name = "tied"
    embedding_tensors = ("head.weight",)  # named by its alias: the harness resolves it to emb.weight

    def build_model(self, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        model = nn.Module()
        model.emb = nn.Embedding(32, 8)
        model.mid = nn.Linear(8, 8)
        model.head = nn.Linear(8, 32, bias=False)
        model.head.weight = model.emb.weight
        return model

    def train_batch(self, learner: int, chip: int, step: int) -> Batch:
        g = torch.Generator().manual_seed(hash((learner, chip, step)) & 0xFFFF_FFFF)
        x = torch.randint(0, 32, (4,), generator=g)
        return x, (x + 1) % 32

    def eval_batches(self, max_batches: int) -> list[Batch]:
        return [self.train_batch(99, 0, i) for i in range(max_batches)]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        h = torch.tanh(model.mid(model.emb(batch[0])))
        return F.cross_entropy(model.head(h), batch[1])


def core(task: Task, fragments: int = 2) -> LearnerCore:
    return LearnerCore(0, task, TrainConfig(steps=10, lr=1e-2, warmup_steps=0),
                       DilocoConfig(fragments=fragments, sync_every=2, overlap=1), seed=3)


def test_a_model_without_embeddings_merges_every_tensor_by_rda() -> None:
    task = RegressionMLP(CTX)
    syncer = DecoupledSyncer(task, DilocoConfig(fragments=3), seed=3, num_learners=2)
    assert syncer.embeddings == ()
    c = core(task, fragments=3)
    assert sorted(n for frag in c.partition for n in frag) == sorted(parameters(c.model))
    before = c.fragment_tensors(0)
    for _ in range(3):
        loss, tokens = c.inner_step(*task.train_batch(0, 0, c.step + 1))
    assert tokens == CTX.batch_size  # samples, not elements, count for the token weights
    delta = outer_gradient(before, [c.fragment_tensors(0), before], [0.5, 0.5], syncer.embeddings)
    assert set(delta) == set(c.partition[0]) and all(torch.isfinite(t).all() for t in delta.values())


def test_tied_weights_are_one_tensor_everywhere() -> None:
    task = TiedLM()
    c = core(task)
    names = list(parameters(c.model))
    assert names == ["emb.weight", "mid.weight", "mid.bias"]  # head.weight is emb.weight: once
    assert embedding_names(c.model, ["head.weight", "emb.weight"]) == ("emb.weight",)
    syncer = DecoupledSyncer(task, DilocoConfig(fragments=2), seed=3, num_learners=1)
    assert syncer.embeddings == ("emb.weight",)
    assert sorted(n for frag in syncer.partition for n in frag) == sorted(names)
    for _ in range(3):
        c.inner_step(*task.train_batch(0, 0, c.step + 1))
    assert c.model.head.weight is c.model.emb.weight  # the optimizer kept the tie
    p = next(i for i, frag in enumerate(c.partition) if "emb.weight" in frag)
    c.apply_fragment(p, 1, [torch.full_like(c.named[n], 0.5) for n in c.partition[p]])
    assert bool((c.model.head.weight == 0.5).all())  # applying the merged value reaches both names
    fresh = task.build_model(7)
    load_params(fresh, {n: t.detach() for n, t in c.named.items()})  # what global.pt holds
    assert fresh.head.weight is fresh.emb.weight and bool((fresh.head.weight == 0.5).all())
    with pytest.raises(KeyError):
        embedding_names(c.model, ["nope.weight"])


def test_buffers_stay_local_and_are_recalibrated_for_the_global_model() -> None:
    task = ImageCNN(CTX)
    c = core(task)
    names = parameters(c.model)
    assert not any("running" in n or "num_batches" in n for n in names)  # buffers are not sent nor merged
    init_mean = c.model.bn1.running_mean.clone()
    for _ in range(2):
        c.inner_step(*task.train_batch(0, 0, c.step + 1))
    assert not torch.equal(c.model.bn1.running_mean, init_mean)  # each replica tracks its own statistics
    # the global model (parameters only) gets its statistics re-estimated: the plain mean over the batches
    model = task.build_model(3)
    load_params(model, {n: t.detach() for n, t in names.items()})
    batch = task.train_batch(1, 0, 50)
    recalibrate_buffers(task, model, [batch])
    with torch.no_grad():
        expected = c.model.conv1(batch[0]).mean(dim=(0, 2, 3))
    assert torch.allclose(model.bn1.running_mean, expected, atol=1e-5)
    assert model.bn1.momentum == 0.1 and model.training  # momentum and mode restored
    c.model.bn2.running_var[0] = float("nan")
    assert not c.finite()  # the NaN guard covers buffers


@pytest.mark.parametrize("name", sorted(BUILTIN_TASKS))
def test_builtin_tasks_keep_the_contract(name: str) -> None:
    task = load_task(name, {}, CTX)
    a, b = task.build_model(1), task.build_model(1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    x, y = task.train_batch(1, 0, 5)
    assert torch.equal(x, task.train_batch(1, 0, 5)[0]) and not torch.equal(x, task.train_batch(0, 0, 5)[0])
    loss = task.loss(a, (x, y))
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert task.batch_tokens((x, y)) >= 1 and task.eval_batches(2)


def scenario_file(tmp_path: Path, task: str) -> Path:
    path = tmp_path / "sc.toml"
    path.write_text(textwrap.dedent(task) + "\n[topology]\nlearners = 2\nchips_per_learner = 1\n"
                    "[diloco]\nfragments = 2\n", encoding="utf-8")
    return path


BAD = [
    ('[task]\nfactory = "no_such_module_xyz:make"', "no module named 'no_such_module_xyz'"),
    ('[task]\nfactory = "diloco_chaos.trainers.tasks.image_cnn:no_such_fn"', "has no function 'no_such_fn'"),
    ('[task]\nfactory = "diloco_chaos.trainers.tasks.image_cnn:CLASSES"', "is not callable"),
    ('[task]\nfactory = "diloco_chaos.trainers.task:TaskContext"',
     "returned TaskContext, not a diloco_chaos.trainers.task.Task"),
    ('[task]\nfactory = "image_cnn"\n[task.args]\nwidht = 4', "task.args {'widht': 4} do not fit its signature"),
    ('[task]\nfactory = "image_cnn"\n[task.args]\nsize = 2', "need size >= 8"),
    ('[task]\nfactory = "diloco_chaos.trainers.data:load_corpus"', "failed: TypeError"),
    ('[task]\nfactory = "not a factory"', "must be 'package.module:function'"),
]


@pytest.mark.parametrize(("table", "says"), BAD)
def test_a_bad_factory_exits_2_naming_what_is_wrong(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    table: str, says: str) -> None:
    path = scenario_file(tmp_path, table)
    assert cli.main(["validate", str(path)]) == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "task.factory" in err and says in err, err
    assert cli.main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--quiet"]) == cli.EXIT_BAD_CONFIG
    assert not (tmp_path / "runs").exists()  # refused before anything started


def test_a_factory_in_the_working_directory_is_found_and_recorded(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cwd_task_mod.py").write_text(
        "from diloco_chaos.trainers.tasks.regression_mlp import regression_mlp as make\n",
                                              encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    sc = from_dict({"task": {"factory": "cwd_task_mod:make"}, "diloco": {"fragments": 2}})
    assert with_task_path(sc).task.path == str(tmp_path)
    assert isinstance(scenario_task(sc), RegressionMLP)


def test_a_wrong_embedding_name_is_refused() -> None:
    with pytest.raises(ScenarioError, match="embedding tensor 'tok_emb.weight' is no parameter"):
        from_dict({"task": {"factory": "regression_mlp"}, "diloco": {"fragments": 2,
                                                                     "embedding_tensors": ["tok_emb.weight"]}})


def test_too_many_fragments_for_the_model_is_refused() -> None:
    with pytest.raises(ScenarioError, match=r"diloco.fragments = 9: must be in \[1, 5\]"):
        from_dict({"task": {"factory": "regression_mlp"}, "diloco": {"fragments": 9}})


def test_a_run_that_cannot_fit_in_memory_is_refused_naming_the_figures() -> None:
    sc = from_dict({"task": {"factory": "regression_mlp", "args": {"hidden": 64}}, "diloco": {"fragments": 4}})
    est = memory_estimate(sc)
    assert est.params == 8 * 64 + 64 + 64 * 64 + 64 + 64
    assert check_memory(sc, available=est.total) == est
    with pytest.raises(ScenarioError, match=r"memory: the run needs about [\d,]+ MiB but 0 MiB are available: "
                                            r"4 learners x 2 chips x 4,800 parameters"):
        check_memory(sc, available=1)


def test_tasks_lists_the_builtin_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tasks"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in BUILTIN_TASKS)


def test_run_refuses_a_model_too_large_for_this_machine_with_exit_2(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "big.toml"  # about 13 billion parameters: counted on the meta device, never allocated
    path.write_text("[model]\nd_model = 4096\nn_layers = 64\nn_heads = 32\nd_ff = 16384\n", encoding="utf-8")
    assert cli.main(["validate", str(path)]) == 0
    assert cli.main(["run", str(path), "--runs-dir", str(tmp_path / "runs"), "--quiet"]) == cli.EXIT_BAD_CONFIG
    err = capsys.readouterr().err
    assert "invalid scenario: memory: the run needs about" in err and "4 learners x 2 chips x 12," in err, err
    assert not (tmp_path / "runs").exists()
