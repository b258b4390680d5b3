"""`[launch] hosts = "remote"` end to end on one machine, with nothing shared but the network: each learner host is
a network namespace (diloco_chaos/harness/hosts/netns.py) in which the test, as an operator would, starts a host agent
with its own work directory (not the run directory); the supervisor reaches the agents only through the addresses in
`launch.agents` and the agents' secret file.

The claims: the run converges and every invariant holds; the run directory's log holds the workers' events
(shipped by the agents: the run directory has no spec file, and each agent's work dir has the learner's spec,
0600, in a 0700 directory, and its workers' own log); no torchrun or worker remains after the run, and the
agents, which the operator owns, are still alive and serve a new connection. Process chaos (kill_chip with a
restart, freeze) reaches the remote workers through their agents. A SIGKILLed supervisor's remote processes end
(each agent sees its connection close) and the agents serve on. Skipped, with the reason, where
namespaces cannot be made (not root, no `ip`, `tc` or `nft`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import psutil
import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.hosts.netns import NetnsHosts, availability
from diloco_chaos.harness.hosts.remote import AgentConnection
from diloco_chaos.harness.record.events import EVENTS_FILE, read_events
from diloco_chaos.harness.testing.pytest_plugin import wait_for
from diloco_chaos.harness.wire.handshake import new_secret

WHY = availability()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"{WHY}"), pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]
AGENT_PORT = 29600
MARGIN = 1.0
"""Final eval loss at least this far (nats per byte) below the initial one."""
WAIT_S = 30.0
LEARNERS = 2



def agent_log_tail(work: Path, chars: int = 3000) -> str:
    """The end of the agent's own log (stdout and stderr), beside its work dir, for a failure's message."""
    log = work.with_suffix(".log")
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


@pytest.fixture
def agents(tmp_path):
    """LEARNERS netns hosts, an operator's agent in each with its own work dir; stopped and removed after."""
    hosts = NetnsHosts.create(LEARNERS)
    secret_file = tmp_path / "agents.secret"
    secret_file.write_text(new_secret().hex())
    secret_file.chmod(0o600)
    procs, work_dirs, logs = [], [], []
    try:
        for h in hosts.hosts:
            work = Path(tempfile.mkdtemp(prefix="dc-agent-"))
            log = work.with_suffix(".log")
            work_dirs.append(work)
            logs.append(log)
            with open(log, "wb") as f:
                procs.append(subprocess.Popen(
                    ["ip", "netns", "exec", h.netns, sys.executable, "-m", "diloco_chaos.harness.hosts.agent",
                     "--listen",
                     f"{h.address}:{AGENT_PORT}", "--secret-file", str(secret_file), "--work-dir", str(work)],
                    cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=f, stderr=subprocess.STDOUT))
        for log in logs:
            wait_for(lambda log=log: "listening on" in log.read_text(), WAIT_S, f"the agent to listen ({log})")
        yield hosts, secret_file, procs, work_dirs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(WAIT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(WAIT_S)
        hosts.close()
        for work, log in zip(work_dirs, logs, strict=True):
            subprocess.run(["rm", "-rf", str(work), str(log)], check=False)


def test_a_remote_run_through_operators_agents_converges_with_its_events_shipped(run_scenario, agents, tmp_path):
    hosts, secret_file, procs, work_dirs = agents
    addresses = [f"{h.address}:{AGENT_PORT}" for h in hosts.hosts]
    res = run_scenario(from_dict({
        "name": "remote-hosts", "seed": 0, "algorithm": "decoupled",
        "topology": {"learners": LEARNERS, "chips_per_learner": 2},
        "train": {"steps": 60},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1, "min_quorum": 1},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 100.0},
        "launch": {"hosts": "remote", "backend": "torchrun", "agents": addresses,
                   "agent_secret_file": str(secret_file)},
        "links": {"proxy": "off"},
    }))
    rep, evs = res.report, res.events
    connected = res.of("agent_connected")
    assert [e["address"] for e in connected] == addresses
    assert all(e["same_clock"] and e["clock_offset_s"] == 0.0 for e in connected), "one machine, one clock"
    assert {e["local_address"] for e in connected} == {hosts.syncer_address}
    kinds = {e["ev"] for e in evs}
    assert {"chip_start", "gloo_group", "step", "push_sent", "apply", "learner_done", "link_process_start"} <= kinds
    assert {e["learner"] for e in evs if e["ev"] == "chip_start"} == set(range(LEARNERS))
    assert all(d["steps"] == 60 for d in rep["per_learner"].values()), rep["per_learner"]
    res.figures(wall_s=rep["wall_s"], initial_eval=rep["initial_eval_loss"], final_eval=rep["final_eval_loss"],
                rtt_s=[e["rtt_s"] for e in connected])
    res.check_all(max_loss=rep["initial_eval_loss"] - MARGIN)
    assert not rep["unexpected_errors"], rep["errors"]

    assert not list(Path(res.run_dir).glob("*.spec")), "nothing reached the hosts through the run directory"
    logged = {(e["pid"], e["t"], e["ev"]) for e in evs}
    for m, (conn, work) in enumerate(zip(connected, work_dirs, strict=True)):
        run = Path(conn["work_dir"])
        assert run.parent == work and (run.stat().st_mode & 0o777) == 0o700
        spec = run / f"learner{m}.torchrun.spec"
        assert (spec.stat().st_mode & 0o777) == 0o600, "the spec holds the run's secret"
        shipped = read_events(run / EVENTS_FILE)
        assert shipped and all((e["pid"], e["t"], e["ev"]) in logged for e in shipped), \
            "every event the workers wrote on their host reached the run's log"
    assert secret_file.stat().st_mode & 0o777 == 0o600

    pids = {e["pid"] for e in evs if e["ev"] in ("chip_start", "link_process_start")}
    pids |= {e["child_pid"] for e in res.of("process_start") if e["name"].endswith(".torchrun")}

    def gone() -> bool:
        return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    wait_for(gone, WAIT_S, f"the run's torchruns and workers to be gone: {sorted(pids)}")
    assert res.leftovers() == {"processes": [], "ports": []}
    exited = [(m, p.returncode, agent_log_tail(work_dirs[m])) for m, p in enumerate(procs) if p.poll() is not None]
    assert not exited, f"the operator's agents stay: {exited}"
    secret = bytes.fromhex(secret_file.read_text())
    for m, address in enumerate(addresses):  # and serve the next supervisor
        AgentConnection(m, address, secret, WAIT_S, tmp_path / "second.jsonl").close()


def test_process_chaos_reaches_remote_workers_through_their_agents(run_scenario, agents):
    """kill_chip: the agent kills the worker, torchrun exits non-zero, the agent reports it, and the supervisor
    restarts the learner with a new Start on the same connection; freeze stops a learner's workers and its link
    process through its agent and lets them go on."""
    hosts, secret_file, procs, _ = agents
    res = run_scenario(from_dict({
        "name": "remote-chaos", "seed": 0, "algorithm": "decoupled",
        "topology": {"learners": LEARNERS, "chips_per_learner": 2},
        "train": {"steps": 60},
        "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1, "min_quorum": 1},
        "eval": {"every_s": 2.0, "batches": 2},
        "timeouts": {"run_s": 100.0},
        "recovery": {"policy": "restart", "repair_s": 1.0, "max_restarts": 2},
        "launch": {"hosts": "remote", "backend": "torchrun", "agent_secret_file": str(secret_file),
                   "agents": [f"{h.address}:{AGENT_PORT}" for h in hosts.hosts]},
        "links": {"proxy": "off"},
        # the kill by learner 1's own progress: at learner 0's step 15 learner 1's torchrun may still be starting
        # its workers (a CI run: "learner 1 has no live chip process to hit")
        "faults": [{"action": "kill_chip", "learner": 1, "chip": 1, "at": {"step": 15, "learner": 1}},
                   {"action": "freeze", "learner": 0, "at": {"step": 30, "learner": 0}, "until": {"after_s": 1.0}}],
    }))
    evs = res.events
    faults = res.of("process_fault")
    assert sorted(e["kind"] for e in faults) == ["freeze", "kill_chip"], faults  # in either order
    hit, frozen = (next(e for e in faults if e["kind"] == kind) for kind in ("kill_chip", "freeze"))
    chips = {e["pid"]: e for e in evs if e["ev"] == "chip_start" and e["learner"] == 1 and e["generation"] == 0}
    assert hit["kind"] == "kill_chip" and [chips[p]["rank"] for p in hit["pids"]] == [1]
    learner0 = {e["pid"] for e in evs if e["proc"].startswith("learner0.") and e["ev"] in ("chip_start",
                                                                                            "link_process_start")}
    assert frozen["kind"] == "freeze" and set(frozen["pids"]) == learner0, "both workers and the link process"
    down, restart = res.of("learner_down")[0], res.of("learner_restart")[0]
    assert down["learner"] == restart["learner"] == 1 and restart["generation"] == 1
    assert [e["name"] for e in res.of("process_start")].count("learner1.torchrun") == 2
    assert {e["rank"] for e in evs if e["ev"] == "chip_start" and e["learner"] == 1 and e["generation"] == 1} == {0, 1}
    assert all(d["steps"] == 60 for d in res.report["per_learner"].values()), res.report["per_learner"]
    res.figures(down_s=round(restart["t"] - down["t"], 2), wall_s=res.report["wall_s"],
                final_eval=res.report["final_eval_loss"])
    res.check_all()
    assert not res.report["unexpected_errors"], res.report["errors"]
    assert res.leftovers() == {"processes": [], "ports": []}
    assert all(p.poll() is None for p in procs)


def test_a_sigkilled_supervisors_remote_processes_end_and_the_agents_serve_on(agents, tmp_path):
    """The supervisor dies without a word: each agent sees its connection close, kills the run's torchrun and
    workers, and goes back to waiting."""
    hosts, secret_file, procs, work_dirs = agents
    runs = tmp_path / "killed"
    script = tmp_path / "supervise.py"
    script.write_text("import json, sys\nfrom diloco_chaos.harness.config.scenario import from_dict\n"
                      "from diloco_chaos.harness.run.supervisor import run_scenario\nif __name__ == '__main__':\n"
                      f"    run_scenario(from_dict(json.loads(sys.argv[1])), {str(runs)!r})\n")
    sc = {"name": "remote-killed", "algorithm": "decoupled", "topology": {"learners": LEARNERS, "chips_per_learner": 1},
          "train": {"steps": 100_000}, "diloco": {"fragments": 4, "sync_every": 4, "overlap": 1, "min_quorum": 1},
          "launch": {"hosts": "remote", "backend": "torchrun", "agent_secret_file": str(secret_file),
                     "agents": [f"{h.address}:{AGENT_PORT}" for h in hosts.hosts]}, "links": {"proxy": "off"}}
    sup = subprocess.Popen([sys.executable, str(script), json.dumps(sc)], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

    def events() -> list[dict[str, Any]]:
        return [json.loads(x) for p in runs.glob("*/events.jsonl") for x in p.read_text().splitlines()
                if x.endswith("}")]

    try:
        wait_for(lambda: {e["learner"] for e in events() if e["ev"] == "step"} == set(range(LEARNERS)), 60,
                 "both remote learners to train")
    finally:
        sup.send_signal(signal.SIGKILL)
        sup.wait(WAIT_S)
    evs = events()
    pids = {e["pid"] for e in evs if e["ev"] in ("chip_start", "link_process_start")}
    pids |= {e["child_pid"] for e in evs if e["ev"] == "process_start"}  # the syncer and the torchruns
    assert len(pids) >= 1 + 2 * LEARNERS + LEARNERS, sorted(pids)

    def gone() -> bool:
        return not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]

    wait_for(gone, WAIT_S, f"every process of the run to end after its supervisor's SIGKILL: {sorted(pids)}")
    exited = [(m, p.returncode, agent_log_tail(work_dirs[m])) for m, p in enumerate(procs) if p.poll() is not None]
    assert not exited, f"the operator's agents stay: {exited}"
    secret = bytes.fromhex(secret_file.read_text())
    for m, h in enumerate(hosts.hosts):
        AgentConnection(m, f"{h.address}:{AGENT_PORT}", secret, WAIT_S, tmp_path / "after.jsonl").close()
