"""End-to-end runs at each wire precision (diloco.wire_dtype): a tiny 2 x 2 decoupled run converges, and its
links carry fewer bytes than fp32's by about what the format saves (real processes, real sockets)."""

from __future__ import annotations

import pytest
from conftest import tiny

from diloco_chaos.harness.run.supervisor import run_scenario

RATIO = {"bf16": 0.60, "int8": 0.45, "int4": 0.30}
"""Upper bound of a run's data bytes vs fp32's. Above the format's own ratio (0.5, 0.26, 0.133) because the
tiny run's frames are small and many (metadata, PINGs, the bf16 values sent on connect, declined pushes)."""


@pytest.fixture(scope="module")
def fp32_bytes(tmp_path_factory) -> int:
    sc = tiny("decoupled", steps=40, diloco={"wire_dtype": "fp32"})
    rep = run_scenario(sc, tmp_path_factory.mktemp("fp32")).report
    assert rep["wire_dtype"] == "fp32"
    return rep["wire_bytes_up"] + rep["wire_bytes_down"]


@pytest.mark.parametrize("dtype", ["bf16", "int8", "int4"])
def test_decoupled_2x2_at_wire_dtype(runs_dir, fp32_bytes: int, dtype: str) -> None:
    rep = run_scenario(tiny("decoupled", steps=40, diloco={"wire_dtype": dtype}), runs_dir).report
    assert rep["wire_dtype"] == dtype
    assert rep["errors"] == [] and rep["frames_rejected"] == 0 and rep["pushes_rejected"] == 0
    assert rep["global_model_finite"] is True
    assert rep["final_eval_loss"] < rep["initial_eval_loss"] - 1.0, rep["final_eval_loss"]
    up, down = rep["wire_bytes_up"], rep["wire_bytes_down"]
    assert up > 0 and down > 0
    assert all(d["link"]["wire_bytes_up"] > 0 for d in rep["per_learner"].values())
    assert up + down <= RATIO[dtype] * fp32_bytes, (up + down) / fp32_bytes


def test_diloco_2x1_int4_converges(runs_dir) -> None:
    """diloco's rounds (PARAMS up, PARAMS_MERGED down) at int4: every round merged, the model learned."""
    rep = run_scenario(tiny("diloco", chips=1, steps=40, diloco={"wire_dtype": "int4"}), runs_dir).report
    assert rep["wire_dtype"] == "int4" and rep["frames_rejected"] == 0 and rep["errors"] == []
    assert rep["merge_count"] == 40 // 4
    assert rep["final_eval_loss"] < rep["initial_eval_loss"] - 1.0, rep["final_eval_loss"]


def test_ddp_ignores_wire_dtype(runs_dir) -> None:
    rep = run_scenario(tiny("ddp", chips=1, steps=10, diloco={"wire_dtype": "int4"}), runs_dir).report
    assert rep["wire_dtype"] == "fp32" and rep["frames_rejected"] == 0 and rep["merge_count"] == 10
