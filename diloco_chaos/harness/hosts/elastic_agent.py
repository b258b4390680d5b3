"""torchrun, its phases timed: the launcher of elastic_ddp's torchrun engine (`[elastic] engine = "torchrun"`).

`python -m diloco_chaos.harness.hosts.elastic_agent <events file> <torchrun arguments...>` runs torchrun's own
`torch.distributed.run.main` with those arguments (the same agent, rendezvous and restart loop production runs),
after wrapping four methods of its `LocalElasticAgent` so each restart's phases are logged as typed records
(diloco_chaos/harness/record/elastic.py) in the run's events file:

* `_monitor_workers`: the first FAILED result of a worker group is an `elastic_failure_seen` (detect: the report
  measures it from the fault that killed the worker to this record);
* `_stop_workers`: an `elastic_phase` "stop" (SIGTERM to every worker's process group, SIGKILL after torchrun's
  own grace); torchrun's process context already stops every worker inside the monitor poll that finds the
  first one failed, so that poll's duration is logged as the restart's first "stop" record (the report adds
  them);
* `_rendezvous`: "rendezvous" (c10d, on the job's rendezvous store);
* `_start_workers`: "spawn" (every worker's interpreter started; their imports are the workers' own time).

Why wrap rather than reimplement: the cost the harness measures is torchrun's, so torchrun must do the work.
Nothing else changes: the wrapped methods call the originals and return what they return.
"""

from __future__ import annotations

import sys
import time
from typing import Any

PROC = "torchrun.agent"


def instrument(events_file: str) -> None:
    """Wrap LocalElasticAgent's stop, rendezvous, start and monitor so each logs its phase to `events_file`."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    from diloco_chaos.harness.record.elastic import ElasticFailureSeen, ElasticPhase
    from diloco_chaos.harness.record.events import EventLog

    events = EventLog(events_file, PROC)
    seen: set[int] = set()

    def restart_of(agent: Any) -> int:
        return int(agent._worker_group.spec.max_restarts - agent._remaining_restarts)

    def timed(name: str, phase: str) -> None:
        original = getattr(LocalElasticAgent, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic()
            out = original(self, *args, **kwargs)
            events.write(ElasticPhase(restart=restart_of(self), phase=phase,  # type: ignore[arg-type]
                                      seconds=round(time.monotonic() - t0, 5)))
            return out

        setattr(LocalElasticAgent, name, wrapper)

    timed("_stop_workers", "stop")
    timed("_rendezvous", "rendezvous")
    timed("_start_workers", "spawn")
    monitor = LocalElasticAgent._monitor_workers

    def monitored(self: Any, worker_group: Any) -> Any:
        t0 = time.monotonic()
        result = monitor(self, worker_group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            restart = restart_of(self) + 1
            if restart not in seen:  # the poll that found the failure also stopped the others (PContext closes
                seen.add(restart)    # every worker as soon as one failed): that poll is the stop's first part
                took = time.monotonic() - t0
                ranks = sorted(result.failures)
                events.write(ElasticFailureSeen(
                    restart=restart, failed_ranks=ranks,
                    exitcodes=[int(result.failures[r].exitcode) for r in ranks],
                    restarts_left=int(self._remaining_restarts) - 1))
                events.write(ElasticPhase(restart=restart, phase="stop", seconds=round(took, 5)))
        return result

    LocalElasticAgent._monitor_workers = monitored  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit("usage: python -m diloco_chaos.harness.hosts.elastic_agent <events file> <torchrun args>")
    instrument(argv[0])
    from torch.distributed.run import main as torchrun_main

    torchrun_main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
