"""The remote-host form's parts that need no namespace: the agent protocol's typed messages and their refusals,
the sealing of the run's secret, the validation of `[launch] hosts = "remote"`, the agents' secret file, and an
operator's agent (`python -m diloco_chaos.harness.hosts.agent --work-dir`, a real process on a real socket): it refuses
a client without the secret, serves one connection after another, measures as one clock with its client on
one machine, and exits on SIGTERM, or after one connection with --once. Full runs: tests/hosts/test_remote_hosts.py."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.hosts import agent_wire as w
from diloco_chaos.harness.hosts.agent import AgentError
from diloco_chaos.harness.hosts.remote import AgentConnection, clock_offset, read_secret, shift_lines
from diloco_chaos.harness.testing.pytest_plugin import wait_for
from diloco_chaos.harness.wire.handshake import new_secret

pytestmark = pytest.mark.timeout(60)
WAIT_S = 20.0
REPO = Path(__file__).resolve().parents[2]

SAMPLES: list[w.Message] = [
    w.Hello("00ff"), w.Auth("ab"), w.Welcome(12, "/w/run-1"), w.Refused("no"), w.Clock(), w.ClockReply(1.5),
    w.Start(1, 2, 29401, "cGlja2xl", "aa", "bb"), w.Started(99), w.Pids(), w.PidsReply([3, 4]),
    w.Signal([3], "SIGSTOP", True), w.SignalReply([3]), w.Stop("SIGKILL"), w.Stopped([3, 4]), w.Failed("why"),
    w.Events(['{"ev":"step"}']), w.Exited(7, -9),
]


def test_every_message_round_trips_and_every_kind_is_covered():
    assert {type(m) for m in SAMPLES} == set(w.KINDS.values())
    for msg in SAMPLES:
        assert w.decode(w.encode(msg)) == msg
    assert w.decode(b'{"kind": "clockreply", "now": 3}') == w.ClockReply(3.0), "an integral clock reading is a float"


@pytest.mark.parametrize(("line", "why"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"kind": "launch"}', "unknown message kind"),
    (b'{"pids": [1]}', "unknown message kind"),
    (b'{"kind": ["pids"]}', "unknown message kind"),
    (b'{"kind": "started"}', r"Started: fields \[\], expected \['torchrun_pid'\]"),
    (b'{"kind": "started", "torchrun_pid": 1, "extra": 2}', "Started: fields"),
    (b'{"kind": "started", "torchrun_pid": true}', "Started.torchrun_pid = True: must be int"),
    (b'{"kind": "started", "torchrun_pid": "7"}', "Started.torchrun_pid = '7': must be int"),
    (b'{"kind": "pidsreply", "pids": [1, "2"]}', r"PidsReply.pids = \[1, '2'\]: must be list\[int\]"),
    (b'{"kind": "signal", "pids": [1], "signal": "SIGKILL", "children": 1}', "Signal.children = 1: must be bool"),
    (b'{"kind": "events", "lines": "x"}', "Events.lines = 'x': must be list"),
])
def test_a_malformed_message_is_refused_naming_what_is_wrong(line, why):
    with pytest.raises(w.AgentProtocolError, match=why):
        w.decode(line)


def test_reading_stops_at_end_of_stream_and_refuses_an_over_long_or_cut_line():
    assert w.read(io.BytesIO(b"")) is None
    assert w.read(io.BytesIO(w.encode(w.Pids()))) == w.Pids()
    with pytest.raises(w.AgentProtocolError, match="longer than"):
        w.read(io.BytesIO(b'{"kind": "events", "lines": ["' + b"x" * w.MAX_LINE + b'"]}\n'))
    with pytest.raises(w.AgentProtocolError, match="cut short"):
        w.read(io.BytesIO(b'{"kind": "pids"}'))
    with pytest.raises(w.AgentProtocolError, match="refused: busy"):
        w.expect(w.Failed("refused: busy"), w.Started)
    with pytest.raises(w.AgentProtocolError, match="expected Started, got PidsReply"):
        w.expect(w.PidsReply([]), w.Started)


def test_the_run_secret_is_sealed_per_nonce_and_unsealed_by_the_same_key():
    key, data = new_secret(), new_secret()
    n1, n2 = os.urandom(16), os.urandom(16)
    sealed = w.seal(key, n1, data)
    assert sealed != data and w.seal(key, n2, data) != sealed
    assert w.seal(key, n1, sealed) == data
    assert w.seal(new_secret(), n1, sealed) != data


def test_one_clock_is_kept_and_another_is_shifted_onto_the_supervisors():
    assert clock_offset(10.0, 10.002, 10.001) == (0.0, pytest.approx(0.002), True), "inside the round trip"
    offset, rtt, same = clock_offset(10.0, 10.002, 5000.0)  # another machine, booted earlier
    assert not same and offset == pytest.approx(4989.999) and rtt == pytest.approx(0.002)
    lines = ['{"t":5000.5,"ev":"step","pid":3}', "not json", '{"ev":"no t"}']
    assert shift_lines(lines, 0.0) == lines
    (moved,) = shift_lines(lines, offset)
    assert moved.startswith('{"t":10.50') and moved.endswith('"ev":"step","pid":3}')


def test_agent_addresses_are_host_port():
    assert w.parse_agent("10.0.0.2:29600") == ("10.0.0.2", 29600)
    assert w.parse_agent("[fe80::1]:1") == ("fe80::1", 1)
    for bad, why in [("10.0.0.2", "host:port"), (":29600", "host:port"), ("h:x", "host:port"),
                     ("h:0", r"port must be in \[1, 65535\]"), ("h:65536", "port must be in")]:
        with pytest.raises(ValueError, match=why):
            w.parse_agent(bad)


def remote_table(tmp_path: Path, **launch: Any) -> dict[str, Any]:
    secret = tmp_path / "agents.secret"
    secret.write_text(new_secret().hex())
    return {"topology": {"learners": 2, "chips_per_learner": 1}, "links": {"proxy": "off"},
            "launch": {"backend": "torchrun", "hosts": "remote", "agents": ["10.0.0.2:29600", "10.0.0.3:29600"],
                       "agent_secret_file": str(secret), **launch}}


def test_validation_names_what_remote_hosts_need(tmp_path):
    sc = from_dict(remote_table(tmp_path))
    assert sc.launch.agents == ("10.0.0.2:29600", "10.0.0.3:29600")
    cases = [
        ({"agents": ["10.0.0.2:29600"]}, r"launch.agents: 1 given, needs one per learner \(topology.learners = 2\)"),
        ({"agents": ["10.0.0.2:29600", "10.0.0.3"]}, r"launch.agents\[1\] = '10.0.0.3': must be host:port"),
        ({"agents": ["a:1", "b:70000"]}, r"launch.agents\[1\] = 'b:70000': port must be in \[1, 65535\]"),
        ({"agents": ["a:1", "a:1"]}, "a:1 given more than once"),
        ({"agent_secret_file": ""}, "launch.agent_secret_file: needed with launch.hosts = 'remote'"),
        ({"agent_secret_file": str(tmp_path / "none")}, "launch.agent_secret_file = .*: no such file"),
        ({"backend": "local"}, "launch.hosts = 'remote': needs launch.backend = 'torchrun'"),
    ]
    for launch, why in cases:
        with pytest.raises(ScenarioError, match=why):
            from_dict(remote_table(tmp_path, **launch))
    with pytest.raises(ScenarioError, match="links.proxy = 'embedded': remote hosts reach the syncer directly"):
        from_dict({**remote_table(tmp_path), "links": {"proxy": "embedded"}})
    with pytest.raises(ScenarioError, match="links.backend = 'kernel': needs launch.hosts = 'netns'"):
        from_dict({**remote_table(tmp_path), "links": {"proxy": "off", "backend": "kernel"}})
    with pytest.raises(ScenarioError, match="launch.agents: only with launch.hosts = 'remote'"):
        from_dict({"launch": {"agents": ["a:1"]}})


def test_the_agents_secret_file_must_be_its_owners_alone(tmp_path):
    f = tmp_path / "agents.secret"
    f.write_text(new_secret().hex())
    f.chmod(0o644)
    with pytest.raises(ValueError, match="mode 644: must be readable by its owner only"):
        read_secret(str(f))
    f.chmod(0o600)
    assert len(read_secret(str(f))) == 32



def start_agent(tmp_path: Path, secret: bytes, *extra: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    """An operator's agent on loopback, any free port (read from its log)."""
    key = tmp_path / f"secret-{len(list(tmp_path.iterdir()))}"
    key.write_text(secret.hex())
    key.chmod(0o600)
    work, log = tmp_path / f"work-{key.name}", tmp_path / f"{key.name}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "diloco_chaos.harness.hosts.agent", "--listen", "127.0.0.1:0",
                                 "--secret-file", str(key), "--work-dir", str(work), *extra], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=f, stderr=subprocess.STDOUT)

    def port() -> int | None:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())
        return int(m.group(1)) if m else None

    return proc, wait_for(port, WAIT_S, "the agent to listen"), work


def test_an_operators_agent_serves_one_run_after_another_and_only_with_the_secret(tmp_path):
    secret = new_secret()
    agent, port, work = start_agent(tmp_path, secret)
    events = tmp_path / "events.jsonl"
    try:
        with pytest.raises(w.AgentProtocolError, match="authentication failed"):
            AgentConnection(0, f"127.0.0.1:{port}", new_secret(), WAIT_S, events)
        dirs = []
        for _ in range(2):  # the agent goes back to waiting after each client
            conn = AgentConnection(0, f"127.0.0.1:{port}", secret, WAIT_S, events)
            try:
                assert conn.agent_pid == agent.pid and conn.same_clock and conn.offset_s == 0.0, "one machine"
                assert Path(conn.work_dir).parent == work and (Path(conn.work_dir).stat().st_mode & 0o777) == 0o700
                with pytest.raises(AgentError, match="no learner started on this connection"):
                    conn.request(w.Pids(), w.PidsReply)
                assert conn.request(w.Stop("SIGKILL"), w.Stopped) == w.Stopped([])
            finally:
                conn.close()
            dirs.append(conn.work_dir)
        assert dirs[0] != dirs[1], "each connection gets its own directory"
        assert agent.poll() is None
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(WAIT_S) == 0
    finally:
        agent.kill()
        agent.wait(WAIT_S)


def test_an_agent_started_with_once_exits_after_its_connection(tmp_path):
    secret = new_secret()
    agent, port, _ = start_agent(tmp_path, secret, "--once")
    try:
        AgentConnection(0, f"127.0.0.1:{port}", secret, WAIT_S, tmp_path / "events.jsonl").close()
        assert agent.wait(WAIT_S) == 0
    finally:
        agent.kill()
        agent.wait(WAIT_S)


def test_a_session_whose_supervisor_vanished_mid_send_closes_without_raising(tmp_path):
    """The agent's events tail was sending when the supervisor was SIGKILLed: the failed send leaves its bytes in
    the connection file's buffer, and closing the file flushes them again. That BrokenPipeError, raised from the
    session's close, ended the operator's agent (1 CI run in 3 of the SIGKILL test in test_remote_hosts.py)."""
    import socket

    from diloco_chaos.harness.hosts.remote_agent import RemoteAgentConfig, Session

    mine, supervisor = socket.socketpair()
    session = Session(RemoteAgentConfig("127.0.0.1", 0, new_secret(), str(tmp_path)), mine)
    supervisor.close()
    with pytest.raises(OSError):
        session.send(w.Events(['{"ev": "step"}']))
    session.close()
    assert session.closed.is_set() and mine.fileno() == -1, "the session ended and its socket is closed"
