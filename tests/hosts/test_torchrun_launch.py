"""The torchrun launch backend's parts that need no namespace: the host agent (real processes, a real socket),
its authentication and its refusal of any pid that is not a worker of its run; the validation of
`[launch] backend = "torchrun"`; the torchrun command line. The full runs are in suites/test_torchrun.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.hosts.agent import AgentClient, AgentError, AgentSpec, agent_main
from diloco_chaos.harness.hosts.workers import LAUNCHER_MODULE, WORKER_MODULE, torchrun_command
from diloco_chaos.harness.wire.handshake import new_secret

pytestmark = pytest.mark.timeout(60)
WAIT_S = 10.0


def fake(spec: Path, rank: int | None, *extra: str) -> subprocess.Popen[bytes]:
    """A process whose command line names the worker module and the spec, as torchrun's workers' do."""
    env = {k: v for k, v in os.environ.items() if k != "LOCAL_RANK"}
    if rank is not None:
        env["LOCAL_RANK"] = str(rank)
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra, "-m", WORKER_MODULE,
                             str(spec)], env=env)


def start_agent(spec: Path, secret: bytes) -> tuple[Any, int]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=agent_main, args=(AgentSpec(str(spec), secret.hex(), "127.0.0.1", accept_s=WAIT_S),
                                                child))
    proc.start()
    child.close()
    assert parent.poll(WAIT_S), "the agent reports its port"
    return proc, parent.recv()


def test_the_agent_lists_and_kills_only_its_runs_workers_and_exits_with_its_client(tmp_path):
    spec, secret = tmp_path / "learner0.torchrun.spec", new_secret()
    w1, w0 = fake(spec, 1), fake(spec, 0)
    launcher = fake(spec, None, LAUNCHER_MODULE)  # torchrun's own command line names the module and spec too
    other = fake(tmp_path / "another-run.spec", 0)
    agent, port = start_agent(spec, secret)
    try:
        client = AgentClient("127.0.0.1", port, secret, WAIT_S)
        assert client.agent_pid == agent.pid
        assert client.pids() == [w0.pid, w1.pid], "the run's workers, by LOCAL_RANK; not torchrun, not another run"
        for pid in (os.getpid(), other.pid, launcher.pid):
            with pytest.raises(AgentError, match="not a worker of this run"):
                client.signal([pid], signal.SIGKILL, False)
        assert client.signal([w1.pid], signal.SIGKILL, False) == [w1.pid]
        assert w1.wait(WAIT_S) == -signal.SIGKILL
        assert client.pids() == [w0.pid]
        assert client.signal([w0.pid], signal.SIGSTOP, True) == [w0.pid]
        assert client.signal([w0.pid], signal.SIGCONT, True) == [w0.pid]
        client.close()  # the supervisor hangs up: the agent kills what is left of its workers and exits
        agent.join(WAIT_S)
        assert agent.exitcode == 0
        assert w0.wait(WAIT_S) == -signal.SIGKILL
        assert other.poll() is None and launcher.poll() is None, "nothing else was touched"
    finally:
        for p in (w0, w1, other, launcher):
            p.kill()
            p.wait(WAIT_S)
        agent.kill()
        agent.join(WAIT_S)


def test_the_agent_refuses_a_client_without_the_runs_secret_and_exits(tmp_path):
    spec = tmp_path / "learner0.torchrun.spec"
    w0 = fake(spec, 0)
    agent, port = start_agent(spec, new_secret())
    try:
        with pytest.raises(AgentError, match="refused"):
            AgentClient("127.0.0.1", port, new_secret(), WAIT_S)
        agent.join(WAIT_S)
        assert agent.exitcode == 0
        assert w0.wait(WAIT_S) == -signal.SIGKILL, "an agent that exits takes its workers with it"
    finally:
        w0.kill()
        w0.wait(WAIT_S)
        agent.kill()
        agent.join(WAIT_S)


BASE: dict[str, Any] = {"launch": {"backend": "torchrun", "hosts": "netns"}, "links": {"proxy": "off"}}


def test_validation_names_what_the_torchrun_backend_cannot_do():
    sc = from_dict(BASE)
    assert sc.launch.backend == "torchrun"
    with pytest.raises(ScenarioError, match="launch.backend = 'torchrun': needs launch.hosts = 'netns'"):
        from_dict({"launch": {"backend": "torchrun"}})
    with pytest.raises(ScenarioError, match="recovery.policy = 'elastic' resolves to 'shrink' for elastic_ddp"):
        from_dict({**BASE, "algorithm": "elastic_ddp", "recovery": {"policy": "elastic"}})
    assert from_dict({**BASE, "algorithm": "elastic_ddp", "recovery": {"policy": "restart"}})


def test_the_torchrun_command_is_one_node_with_a_local_c10d_rendezvous():
    cmd = torchrun_command(2, 29400, "/runs/x/learner0.torchrun.spec")
    assert cmd[1:3] == ["-m", LAUNCHER_MODULE]
    args = dict(zip(cmd[3:-3:2], cmd[4:-3:2], strict=True))
    assert args == {"--nnodes": "1", "--nproc-per-node": "2", "--rdzv-backend": "c10d",
                    "--rdzv-endpoint": "127.0.0.1:29400", "--max-restarts": "0", "--monitor-interval": "0.1"}
    assert cmd[-3:] == ["-m", WORKER_MODULE, "/runs/x/learner0.torchrun.spec"]
