"""Invariant `model_finite`: The global model (checkpoint and every evaluation of it) is finite.

One module per invariant (a run invariant): it registers itself with
`diloco_chaos.harness.invariants.registry.register`, so check_all, the pytest plugin and `diloco-chaos invariants` list
it.
"""

from __future__ import annotations

import math

from diloco_chaos.harness.invariants.base import InvariantResult, Run, _run
from diloco_chaos.harness.invariants.registry import register
from diloco_chaos.harness.record.syncer import Eval
from diloco_chaos.harness.run.rundir import CHECKPOINT_FILE


@register(order=80)
def model_finite(run: Run) -> InvariantResult:
    """The global model is finite. Figure: non-finite observations; bound 0. Observations: each tensor of
    global.pt's params (loaded when the run directory has it), the final eval's `finite` flag (or
    report.json's global_model_finite), and the loss of every eval of the global model (periodic and final).
    With none of these there is no evidence, which is a violation."""
    r = _run(run)
    bad: list[str] = []
    evidence = 0
    ckpt = r.run_dir / CHECKPOINT_FILE if r.run_dir is not None else None
    if ckpt is not None and ckpt.exists():
        import torch

        state = torch.load(ckpt, weights_only=True)
        for n, t in state.get("params", {}).items():
            evidence += 1
            if not bool(torch.isfinite(t).all()):
                bad.append(f"global.pt tensor {n} has {int((~torch.isfinite(t)).sum())} non-finite values")
    finals = [e for e in r.records(Eval) if e.kind == "final" and e.finite is not None]
    flag = finals[-1].finite if finals else r.report.get("global_model_finite")
    if flag is not None:
        evidence += 1
        if flag is not True:
            bad.append("final eval says the checkpoint is not finite")
    for e in r.records(Eval):
        evidence += 1
        if not math.isfinite(float(e.loss)):
            bad.append(f"{e.kind} eval of version {e.version} at {e.t - r.start:.3f} s: loss {e.loss}")
    if evidence == 0:
        return InvariantResult("model_finite", False, None, 0, "no global.pt, no final eval and no eval event: "
                               "no evidence the global model is finite", "non-finite observations")
    detail = "; ".join(bad[:5]) if bad else f"{evidence} observations, all finite"
    return InvariantResult("model_finite", not bad, len(bad), 0, detail, "non-finite observations")
