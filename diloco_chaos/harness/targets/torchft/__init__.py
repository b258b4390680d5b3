"""The torchft target (`target.system = "torchft"`, docs/targets/torchft.md): torchft 0.2.0's Lighthouse and one
replica group per learner (topology.chips_per_learner ranks each) running torchft_ddp or torchft_diloco on the
scenario's task. This module only registers the descriptor; torchft itself is imported by the run
(diloco_chaos/harness/targets/torchft/run.py) and its trainer processes, so the package imports without it.

Modules: lighthouse (start, readiness, teardown of `torchft_lighthouse`), trainer (one rank's process), loops
(the two algorithms' training loops), observe (torchft's loggers and the global-weights digest as typed
records), run (the run's supervisor: lighthouse, groups, watch, post-run phase)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from diloco_chaos.harness.targets.base import OnEvents, Target, register

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.run.supervisor import RunResult


def run(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> RunResult:
    from diloco_chaos.harness.targets.torchft.run import TorchftRun

    return TorchftRun(sc, run_root, on_events).run()


TARGET = register(Target(
    name="torchft", summary="torchft 0.2.0: its Lighthouse and one replica group (Manager, ProcessGroupGloo) per "
                            "learner", run=run, fault_kinds=frozenset(), link_proxies=False, needs_module="torchft"))
