"""A third system under test in one module, added by the steps of docs/targets.md "Adding a target": target `toy`
and its algorithm `toy_avg`. Loaded as a plugin (DILOCO_CHAOS_PLUGINS=tests.targets.toy_target) by
tests/targets/test_toy_target.py.

The trainer is deliberately trivial: each learner is one real process (forked by the run's supervisor, so it is
in processes.json and stopped with the run) that trains the scenario's task model with plain SGD on its own
shard. Every diloco.sync_every steps (and at its last step) it writes its parameters to
<run_dir>/toy/r<k>.m<m>.pt, waits until every learner's file of round k is there, and loads their average: a
file barrier, deterministic, with no torch.distributed. A restarted learner resumes from the last round every
learner completed (the average of its files) and trains the rest again.

It writes the builtin records the docs list: chip_start, step, learner_done (chip_error on a failure), the
initial eval (learner 0), one `merge` per round (learner 0: what report.json's progress and goodput read for a
target without its own reader), and global.pt at the end, so the shared post-run phase writes report.json and
invariants.json. Faults: kill_learner only (the supervisor's FaultRunner and ProcessChaos send it; the builtin
recovery policy restarts the learner after its repair delay); every other kind is refused at validation.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from diloco_chaos.chaos.processes import ProcessChaos
from diloco_chaos.harness.algorithms.base import Algorithm, register
from diloco_chaos.harness.config.task_check import scenario_task
from diloco_chaos.harness.record.events import EVENTS_FILE, EventLog, EventTail
from diloco_chaos.harness.record.learner import ChipError, ChipStart, LearnerDone, Step
from diloco_chaos.harness.record.run import LearnerRestart
from diloco_chaos.harness.record.syncer import Eval, Merge
from diloco_chaos.harness.run.fault_runner import FaultRunner
from diloco_chaos.harness.run.procutil import become_run_process, cpu_seconds, print_error, stderr_to_file, wait_any
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE, atomic_torch_save
from diloco_chaos.harness.run.supervisor import FAULT_POLL_S, POLL_S, RunFailed, RunResult, Supervisor
from diloco_chaos.harness.targets.base import OnEvents, Target
from diloco_chaos.harness.targets.base import register as register_target
from diloco_chaos.trainers.task import evaluate, load_params, model_finite, parameters

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.config.sections import Found

NAME = "toy"
LR = 0.3
"""Plain SGD's learning rate (train.lr is AdamW's, far too small for SGD)."""
BARRIER_POLL_S = 0.01
"""How often a learner looks for the other learners' files of its round."""
FAULT_KINDS = frozenset({"kill_learner"})


# -- step 1: the trainer (one process per learner) -------------------------------------------------------------

@dataclass(frozen=True)
class ToySpec:
    """What one toy learner process needs (pickled to the forkserver child)."""

    run_dir: str
    scenario: Scenario
    learner: int
    generation: int
    parent_pid: int


def _file(run_dir: str, k: int, m: int) -> Path:
    return Path(run_dir) / "toy" / f"r{k}.m{m}.pt"


def _complete(run_dir: str, k: int, learners: int) -> bool:
    return all(_file(run_dir, k, m).exists() for m in range(learners))


def _average(run_dir: str, k: int, learners: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Round k's average of every learner's parameters (in learner order), and each learner's tokens of it."""
    states = [torch.load(_file(run_dir, k, m), weights_only=True) for m in range(learners)]
    avg = {n: torch.stack([s["params"][n] for s in states]).mean(0) for n in states[0]["params"]}
    return avg, [float(s["tokens"]) for s in states]


def toy_learner(spec: ToySpec) -> None:
    """Entry point of learner `spec.learner`'s process (see the module docstring)."""
    become_run_process(spec.parent_pid)
    m, proc = spec.learner, f"learner{spec.learner}.chip0"
    stderr_to_file(spec.run_dir, proc)
    events = EventLog(os.path.join(spec.run_dir, EVENTS_FILE), proc)
    events.write(ChipStart(learner=m, rank=0, size=1, generation=spec.generation))
    try:
        _train(spec, events)
    except Exception as e:
        print_error(e)
        events.write(ChipError(learner=m, rank=0, error=f"{type(e).__name__}: {e}"))
        events.close()
        os._exit(1)
    events.close()


def _train(spec: ToySpec, events: EventLog) -> None:
    sc, m, run_dir = spec.scenario, spec.learner, spec.run_dir
    learners, every, steps = sc.topology.learners, sc.diloco.sync_every, sc.train.steps
    rounds = math.ceil(steps / every)
    task = scenario_task(sc)
    model = task.build_model(sc.seed)
    (Path(run_dir) / "toy").mkdir(exist_ok=True)
    done = 0  # the last round every learner completed: a restarted learner resumes from its average
    while done < rounds and _complete(run_dir, done + 1, learners):
        done += 1
    merged = sum(sum(_average(run_dir, k, learners)[1]) for k in range(1, done + 1))
    if done:
        load_params(model, _average(run_dir, done, learners)[0])
    elif m == 0 and spec.generation == 0:
        loss, _ = evaluate(task, model, task.eval_batches(sc.eval.batches))
        events.write(Eval(kind="periodic", version=0, tokens_merged=0.0, loss=loss, trigger="start"))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    deadline = time.monotonic() + sc.timeouts.run_s
    t0, round_tokens = time.monotonic(), 0
    for step in range(done * every + 1, steps + 1):
        batch = task.train_batch(m, 0, step)
        c0 = time.monotonic()
        loss = task.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tokens = task.batch_tokens(batch)
        round_tokens += tokens
        events.write(Step(learner=m, step=step, loss=round(float(loss), 5), tokens=tokens, chips=1,
                          compute_s=round(time.monotonic() - c0, 5), sync_s=0.0))
        if step % every and step != steps:
            continue
        k = math.ceil(step / every)
        params = {n: p.detach().clone() for n, p in parameters(model).items()}
        atomic_torch_save({"params": params, "tokens": round_tokens}, _file(run_dir, k, m), durable=False)
        round_tokens = 0
        while not _complete(run_dir, k, learners):  # the barrier: every learner's file of round k
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {k}: not every learner's file within timeouts.run_s")
            time.sleep(BARRIER_POLL_S)
        avg, c_tokens = _average(run_dir, k, learners)
        load_params(model, avg)
        merged += sum(c_tokens)
        if m == 0:
            events.write(Merge(fragment=None, version=k, merges=k, participants=list(range(learners)),
                               tokens=sum(c_tokens), c_tokens=c_tokens, tokens_merged=merged, round=k, step=step))
    if m == 0:
        atomic_torch_save({"params": dict(parameters(model)), "merges": rounds, "tokens_merged": merged,
                           "algorithm": sc.algorithm}, Path(run_dir) / CHECKPOINT_FILE)
    events.write(LearnerDone(learner=m, steps=steps, finite=model_finite(model),
                             timing={"train": round(time.monotonic() - t0, 4)}, cpu_s=cpu_seconds()))


# -- step 2: the run (a Supervisor with its launch-and-watch part replaced) ------------------------------------

class ToyRun(Supervisor):
    """One run on the toy target: its learners' processes, the scenario's faults, the builtin recovery."""

    def launch_and_watch(self, t0: float) -> None:
        sc = self.sc
        self.procs_chaos = ProcessChaos(self._pids, sc.topology.learners, on_event=self.events.named,
                                        progress=self._progress, seed=sc.seed)
        self.faults = FaultRunner(sc.faults, None, self.events, self.procs_chaos)
        for m in range(sc.topology.learners):
            self._start(m, 0)
        self._watch_toy(t0)
        never = self.faults.never_fired()
        if never:
            raise RunFailed("scheduled fault(s) never fired: " + "; ".join(never))

    def _start(self, m: int, generation: int) -> None:
        name = f"learner{m}.chip0"
        if name in self.procs:
            self.retired.append(self.procs[name])
        self.start_process(name, toy_learner, (ToySpec(str(self.run_dir), self.sc, m, generation, os.getpid()),))
        self.generation[m] = generation
        self.learner_state[m] = "up"

    def _chips_of(self, m: int) -> list[Any]:
        return [self.procs[f"learner{m}.chip0"]]

    def _pids(self, m: int) -> list[int]:
        """What a process fault on learner m hits: its live process, none while it is down."""
        p = self.procs.get(f"learner{m}.chip0")
        return [p.pid] if self.learner_state.get(m) == "up" and p is not None and p.exitcode is None else []

    def _watch_toy(self, t0: float) -> None:
        sc, faults = self.sc, self.faults
        assert faults is not None
        tail = self._tail = EventTail(self.run_dir / EVENTS_FILE)
        learners = range(sc.topology.learners)
        while True:
            new = tail.poll()
            if self.on_events is not None:
                self.on_events(new)
            faults.tick(new, time.monotonic() - t0)
            now = time.monotonic()
            steps = faults.schedule.progress.steps
            for m in learners:
                code = self.procs[f"learner{m}.chip0"].exitcode
                if self.learner_state[m] == "up" and code not in (None, 0):
                    self._learner_failed(m, {f"learner{m}.chip0": code}, now, steps.get(m, 0))  # builtin policy
                elif self.learner_state[m] == "up" and code == 0:
                    self.learner_state[m] = "done"
                elif self.learner_state[m] == "down" and now >= self.restart_at[m]:
                    self.restarts[m] = self.restarts.get(m, 0) + 1
                    self._start(m, self.generation[m] + 1)
                    self.events.write(LearnerRestart(learner=m, generation=self.generation[m],
                                                     start_step=steps.get(m, 0), restarts=self.restarts[m]))
            if all(self.learner_state[m] == "done" for m in learners):
                if self.on_events is not None:
                    self.on_events(tail.poll())
                return
            if now - t0 > sc.timeouts.run_s:
                raise RunFailed(f"run exceeded timeouts.run_s = {sc.timeouts.run_s}s")
            waits = [max(0.0, self.restart_at[m] - now) for m in learners if self.learner_state[m] == "down"]
            wait_any([p for p in self.procs.values() if p.exitcode is None],
                     min([FAULT_POLL_S if faults.pending() else POLL_S, *waits]))


# -- step 3: the descriptor, its rules, its algorithm ----------------------------------------------------------

def supervisor(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> Supervisor:
    return ToyRun(sc, run_root, on_events)


def run(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> RunResult:
    return supervisor(sc, run_root, on_events).run()


def rules(sc: Scenario, keys: list[str], found: Found) -> None:
    """The toy's own rules: one process per learner, on this machine."""
    if sc.topology.chips_per_learner != 1 and found.ok("topology.chips_per_learner"):
        found.add("topology.chips_per_learner", f"topology.chips_per_learner = {sc.topology.chips_per_learner}: "
                                                f"target {NAME!r} runs one process per learner (set it to 1)")
    if (sc.launch.hosts, sc.launch.backend) != ("local", "local") and found.ok("launch.hosts"):
        found.add("launch.hosts", f"launch.hosts = {sc.launch.hosts!r}: target {NAME!r} runs on this machine only")


def refusal(kind: str) -> str:
    return "the toy trainer carries only the kill of a whole learner"


TARGET = register_target(Target(
    name=NAME, summary="a test's trivial trainer: SGD per learner, parameters averaged through files",
    run=run, fault_kinds=FAULT_KINDS, link_proxies=False, fault_refusal=refusal, supervisor=supervisor,
    builtin_syncer=False, rules=rules))


def _not_builtin(*_: Any) -> Any:
    raise RuntimeError(f"toy_avg runs on target {NAME!r}, not on the built-in learners or syncer")


ALGORITHM = register(Algorithm(
    name="toy_avg", summary="the toy target's SGD with parameters averaged every diloco.sync_every steps",
    order=200, merge_unit="round", elastic=False, outer_step=False, shardable_syncer=False,
    restorable_syncer=False, gloo_timeout_s=lambda sc: sc.timeouts.gloo_s, run_learner=_not_builtin,
    resume_learner=_not_builtin, syncer_handler=_not_builtin, compare_order=200, system=NAME))
