"""A toy algorithm defined in one module, outside the package: ddp under another name (`toy_ddp`), reusing ddp's
learner loop, resume, gloo-timeout rule and syncer handler (BarrierHandler with DdpSyncer). Loaded as a plugin
(DILOCO_CHAOS_PLUGINS=tests.package.toy_algorithm) by tests/package/test_algorithm_registry.py."""

from __future__ import annotations

import dataclasses

from diloco_chaos.harness.algorithms import ddp
from diloco_chaos.harness.algorithms.base import register

ALGORITHM = register(dataclasses.replace(
    ddp.ALGORITHM, name="toy_ddp", summary="a test's copy of ddp under another name", order=100,
    compare_order=100, goodput_rank=None, quality_reference=False))
