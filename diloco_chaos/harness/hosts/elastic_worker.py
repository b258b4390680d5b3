"""The program torchrun starts for each chip under elastic_ddp's torchrun engine (`[elastic] engine =
"torchrun"`, diloco_chaos/harness/hosts/elastic_torchrun.py).

torchrun gives each worker RANK (global: learner = RANK // C, chip = RANK % C), WORLD_SIZE (M x C) and
TORCHELASTIC_RESTART_COUNT. The worker runs the same `chip_main` a local chip runs, as that learner's chip, in
Gloo group generation = the restart count (a fresh store prefix per restart). A restarted job's learners resume
from the job's checkpoint (diloco_chaos/harness/algorithms/elastic_ddp.py). The worker's life is tied to its
agent (its parent): it exits when the agent dies.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback

from diloco_chaos.harness.hosts.torchrun_worker import load_spec


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m diloco_chaos.harness.hosts.elastic_worker <spec file> (started by torchrun)")
    from diloco_chaos.harness.learner.chip import ChipSpec, chip_main

    spec = load_spec(argv[0])
    if not isinstance(spec, ChipSpec):
        raise SystemExit(f"{argv[0]}: not a chip spec")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    chips = spec.size
    if world != chips * spec.scenario.topology.learners:
        raise SystemExit(f"torchrun started {world} workers; the scenario has {spec.scenario.topology.learners} "
                         f"learners x {chips} chips")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    code = 1
    try:
        chip_main(dataclasses.replace(spec, learner=rank // chips, rank=rank % chips, generation=restart,
                                      parent_pid=os.getppid()))
        code = 0
    except SystemExit as e:  # chip_main printed its error to its stderr file already
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
