"""Fault kinds: one module per kind, each registered by name (diloco_chaos/chaos/faults/base.py says what a kind
defines).

Importing this package registers every kind, in the order of the imports below: the order of ACTIONS in
diloco_chaos/chaos/schedule.py and of the names listed in error messages. Adding a kind is one module and one import
line here (docs/link-chaos.md, "Adding a fault kind").
"""
# isort: skip_file

from diloco_chaos.chaos.faults import degrade  # noqa: F401  (each import registers its kind)
from diloco_chaos.chaos.faults import partition  # noqa: F401
from diloco_chaos.chaos.faults import flap  # noqa: F401
from diloco_chaos.chaos.faults import reset_peer  # noqa: F401
from diloco_chaos.chaos.faults import slice  # noqa: F401
from diloco_chaos.chaos.faults import limit_data  # noqa: F401
from diloco_chaos.chaos.faults import kill_chip  # noqa: F401
from diloco_chaos.chaos.faults import kill_learner  # noqa: F401
from diloco_chaos.chaos.faults import crash_host  # noqa: F401
from diloco_chaos.chaos.faults import freeze  # noqa: F401
from diloco_chaos.chaos.faults import slow  # noqa: F401
from diloco_chaos.chaos.faults import kill_syncer  # noqa: F401
from diloco_chaos.chaos.faults import corrupt  # noqa: F401
from diloco_chaos.chaos.faults import loss  # noqa: F401
from diloco_chaos.chaos.faults.base import (
    FaultContext,
    FaultKind,
    ScheduleError,
    capabilities,
    find,
    get,
    kinds,
    names,
    register,
)

__all__ = ["FaultContext", "FaultKind", "ScheduleError", "capabilities", "find", "get", "kinds", "names",
           "register"]
