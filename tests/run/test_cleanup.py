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

CLI = [sys.executable, "-m", "diloco_chaos.harness.entry"]
TRACED_CLI = [sys.executable, "-c", "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, "
              "all_threads=True); from diloco_chaos.harness.cli import main; sys.exit(main())"]
"""The command line with a stack dump of every thread on SIGUSR1: what a supervisor that does not stop after a
signal was doing goes into the failure."""


def _default_sigint() -> None:
    """In the CLI's process before it starts: SIGINT at its default, as in a terminal. A test command started in
    the background of a non-interactive shell inherits SIGINT ignored (bash ignores it for `&` jobs), Python keeps
    an inherited SIG_IGN, and the CLI would never see the Ctrl-C this test sends (the stack dump above showed the
    supervisor still watching its run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)




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
    out = (tmp_path / "cli.out").open("wb")  # files, not pipes: a full pipe nobody reads would block the CLI
    sup = subprocess.Popen([*TRACED_CLI, "run", str(scen), "--runs-dir", str(runs), "--quiet"],
                           stdout=out, stderr=subprocess.STDOUT, preexec_fn=_default_sigint)
    out.close()
    try:
        pids = wait_for(lambda: run_pids(runs), 90, "the run to start training")
        forkserver = [c.pid for c in psutil.Process(sup.pid).children()]
        sup.send_signal(sig)
        try:
            code = sup.wait(timeout=30)
        except subprocess.TimeoutExpired:
            sup.send_signal(signal.SIGUSR1)  # every thread's stack to its output, then the failure shows it
            try:
                sup.wait(timeout=5)
            except subprocess.TimeoutExpired:
                sup.kill()
                sup.wait(timeout=10)
            pytest.fail(f"the supervisor did not exit within 30 s of {sig.name}; its output and threads:\n"
                        + (tmp_path / "cli.out").read_text(errors="replace")[-6000:])
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
