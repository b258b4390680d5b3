"""The program torchrun starts for each chip of a learner (`[launch] backend = "torchrun"`).

torchrun (`python -m torch.distributed.run ... -m diloco_chaos.harness.hosts.torchrun_worker <spec file>`) starts one of
these per chip and gives it RANK, LOCAL_RANK, WORLD_SIZE and MASTER_ADDR/PORT. The worker reads the learner's spec (the
run's validated Scenario and everything else a local chip gets, diloco_chaos/harness/learner/chip.py ChipSpec, written
by the supervisor with mode 0600 since it holds the run's secret), takes its rank from torchrun, and runs the same
`chip_main` a local chip runs: same Gloo group, same link to the syncer, same events. Why torchrun's rank and
not a rank of our own: that is how a real cluster starts a job, and a mismatch (torchrun's WORLD_SIZE not the
scenario's chips_per_learner) is caught here, before any training.

The workers of a learner tie their lives to their host agent (diloco_chaos/harness/hosts/agent.py): its pid comes in
DILOCO_CHAOS_PARENT_PID, and a worker exits within a second of the agent's end.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import sys
import traceback

PARENT_PID_ENV = "DILOCO_CHAOS_PARENT_PID"


def load_spec(path: str) -> object:
    """The learner's ChipSpec (rank 0's), as the supervisor wrote it."""
    with open(path, "rb") as f:
        return pickle.load(f)  # noqa: S301 - written by this run's supervisor, mode 0600


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m diloco_chaos.harness.hosts.torchrun_worker <spec file> "
                         "(started by torchrun)")
    from diloco_chaos.harness.learner.chip import ChipSpec, chip_main

    spec = load_spec(argv[0])
    if not isinstance(spec, ChipSpec):
        raise SystemExit(f"{argv[0]}: not a chip spec")
    rank, size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if size != spec.size:
        raise SystemExit(f"torchrun started {size} workers per node; the scenario has "
                         f"topology.chips_per_learner = {spec.size} (--nproc-per-node must match)")
    parent = int(os.environ.get(PARENT_PID_ENV, str(spec.parent_pid)))
    code = 1
    try:
        chip_main(dataclasses.replace(spec, rank=rank, parent_pid=parent, netns=""))
        code = 0
    except SystemExit as e:  # chip_main printed its error to its stderr file already
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:  # as a forkserver chip ends: the interpreter's own shutdown took 6-9 s after a chip's work was done
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
