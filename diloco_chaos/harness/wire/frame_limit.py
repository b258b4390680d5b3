"""The largest frame a scenario's processes accept, one rule for both ends of a connection.

Why here: the syncer's transport (diloco_chaos/harness/syncer/transport.py) and the learner's chip process
(diloco_chaos/harness/learner/chip.py, which hands it to its link process) must agree on the limit, and it is a
property of the wire, not of either side; kept out of framing.py, which takes the limit as a number.
"""

from __future__ import annotations

from diloco_chaos.harness.config.scenario import Scenario
from diloco_chaos.harness.config.task_check import param_count


def max_frame_bytes(sc: Scenario) -> int:
    """Largest legal frame: three model-sized float32 tensor sets (a ddp resume: parameters and both AdamW
    moments) plus generous metadata room. Anything larger is refused before its payload is read."""
    return 3 * param_count(sc) * 4 + 1_000_000
