"""The built-in target (`target.system = "builtin"`): this package's chip processes and syncer shards, run by
diloco_chaos/harness/run/supervisor.py `Supervisor`; it carries every fault kind and the Toxiproxy link proxies."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from diloco_chaos.harness.targets.base import OnEvents, Target, register

if TYPE_CHECKING:
    from diloco_chaos.harness.config.scenario import Scenario
    from diloco_chaos.harness.run.supervisor import RunResult, Supervisor


def supervisor(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> Supervisor:
    from diloco_chaos.harness.run.supervisor import Supervisor

    return Supervisor(sc, run_root, on_events)


def run(sc: Scenario, run_root: str | os.PathLike[str], on_events: OnEvents | None) -> RunResult:
    return supervisor(sc, run_root, on_events).run()


TARGET = register(Target(
    name="builtin", summary="this package's learners (one process per chip) and syncer (its shards)",
    run=run, fault_kinds=None, link_proxies=True, supervisor=supervisor))
