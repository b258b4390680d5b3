"""No process outlives its run: normal end, Ctrl-C, SIGTERM, a killed supervisor. Bad config starts nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from diloco_chaos.harness.testing.pytest_plugin import wait_for

CLI = [sys.executable, "-m", "diloco_chaos.harness.cli"]




def write_scenario(path: Path, steps: int) -> Path:
    path.write_text(
        f"""name = "cleanup"
algorithm = "decoupled"
[topology]
learners = 2
chips_per_learner = 2
[train]
steps = {steps}
[diloco]
fragments = 4
sync_every = 4
[links]
proxy = "embedded"
"""
    )
    return path


def run_pids(runs: Path) -> list[int] | None:
    """pids of every process of the (single) run under `runs`, once all of them have started and trained."""
    dirs = list(runs.glob("*/events.jsonl"))
    if not dirs:
        return None
    events = [json.loads(x) for x in dirs[0].read_text().splitlines() if x.endswith("}")]
    started = [e["child_pid"] for e in events if e["ev"] == "process_start"]
    links = [e["pid"] for e in events if e["ev"] == "link_process_start"]  # forked by each host, not the supervisor
    stepped = {e["learner"] for e in events if e["ev"] == "step"}
    # syncer, the embedded Toxiproxy server and 2 x 2 chips; 2 hosts' link processes
    return started + links if len(started) == 6 and len(links) == 2 and stepped == {0, 1} else None


def assert_all_gone(pids: list[int], timeout: float = 15.0) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    assert alive == [], f"survivors: {[p.pid for p in alive]}"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_interrupted_run_leaves_no_process(tmp_path, sig):
    scen = write_scenario(tmp_path / "s.toml", steps=100_000)
    runs = tmp_path / "runs"
    sup = subprocess.Popen([*CLI, "run", str(scen), "--runs-dir", str(runs), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pids = wait_for(lambda: run_pids(runs), 90, "the run to start training")
        forkserver = [c.pid for c in psutil.Process(sup.pid).children()]
        sup.send_signal(sig)
        code = sup.wait(timeout=30)
        if sig == signal.SIGINT:
            assert code == 130
        elif sig == signal.SIGTERM:
            assert code != 0
        assert_all_gone(pids + forkserver)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait(timeout=10)


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (
            "[topology]\nlearners = 2\n[diloco]\nmin_quorum = 3\n",
            "diloco.min_quorum = 3: must be in [1, topology.learners = 2]",
        ),
        ("colour = 'red'\n", "unknown key colour"),
        ("[train]\nlr = -0.5\n", "train.lr = -0.5: must be in [0.0, 1.0]"),
        ("[data]\ncorpus = '/no/such/corpus.txt'\n", "data.corpus = '/no/such/corpus.txt': no such file"),
    ],
)
def test_bad_scenario_is_rejected_before_any_process(tmp_path, toml, needle):
    scen = tmp_path / "bad.toml"
    scen.write_text(toml)
    runs = tmp_path / "runs"
    out = subprocess.run([*CLI, "run", str(scen), "--runs-dir", str(runs)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2
    assert needle in out.stderr
    assert not runs.exists(), "a run directory was created for an invalid scenario"
