"""Netns hosts and the kernel link backend on real namespaces, veths, tc qdiscs and nft tables.

What is checked: validation (runs anywhere) refuses a fault the kernel backend cannot carry and the settings
that cannot work together; on a machine that allows it (root, `ip`, `tc`, `nft`; skipped with the reason
elsewhere), a bandwidth limit's measured payload rate is within 10 % of the one set, a blackhole partition
stops the flow and a refuse partition resets it, and nothing is left after a clean-up, nor after the owner of
hosts is SIGKILLed and the next start sweeps (`ip netns list`, `ip link`, `tc qdisc`, `nft list tables`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diloco_chaos.chaos import faults
from diloco_chaos.chaos.kernel_links import TABLE, HostLink, KernelToxics, sh
from diloco_chaos.chaos.links import LinkChaos, proxy_name
from diloco_chaos.harness.config.scenario import from_dict
from diloco_chaos.harness.config.sections import ScenarioError
from diloco_chaos.harness.hosts.netns import INNER_DEV, NetnsHosts, availability
from diloco_chaos.harness.hosts.netns import remaining as residue

WHY = availability()
needs_netns = pytest.mark.skipif(WHY is not None, reason=f"{WHY}")
RATE_TOLERANCE = 0.10
REPO = Path(__file__).resolve().parents[2]


def _kernel(extra: dict | None = None, **faults_: dict) -> dict:
    table = {"algorithm": "decoupled", "topology": {"learners": 2, "chips_per_learner": 1},
             "launch": {"hosts": "netns"}, "links": {"backend": "kernel", "proxy": "off"},
             "faults": [{"learner": 1, **f} for f in faults_.values()]}
    table.update(extra or {})
    return table


def test_validation_refuses_what_the_kernel_backend_cannot_carry() -> None:
    sc = from_dict(_kernel(a={"action": "partition", "mode": "refuse"}, b={"action": "degrade",
                                                                          "bandwidth_kbps": 800},
                           c={"action": "loss", "percent": 5}, d={"action": "flap", "period_s": 1, "duty": 0.5}))
    assert sc.links.backend == "kernel" and sc.launch.hosts == "netns"
    with pytest.raises(ScenarioError) as e:
        from_dict(_kernel(a={"action": "reset_peer"}, b={"action": "degrade", "latency_ms": 40,
                                                         "bandwidth_kbps": 800}))
    msg = str(e.value)
    assert "faults[0].action = 'reset_peer': not supported by the kernel backend" in msg
    assert "faults[1].action = 'degrade'" in msg and "cannot carry degrade's latency_ms" in msg, msg
    with pytest.raises(ScenarioError, match="loss.*runs on: kernel"):
        from_dict({"faults": [{"action": "loss", "learner": 0, "percent": 1}], "links": {"proxy": "embedded"}})
    with pytest.raises(ScenarioError) as e:
        from_dict({"links": {"backend": "kernel"}})
    assert "links.backend = 'kernel': needs launch.hosts = 'netns'" in str(e.value)
    with pytest.raises(ScenarioError, match="links.proxy = 'embedded': netns hosts reach the syncer directly"):
        from_dict({"launch": {"hosts": "netns"}, "links": {"proxy": "embedded"}})
    with pytest.raises(ScenarioError, match="links.backend = 'toxiproxy': on netns hosts no proxy can carry"):
        from_dict(_kernel({"links": {"backend": "toxiproxy"}}, a={"action": "partition"}))


def test_auto_links_on_netns_hosts_resolve_to_no_proxy_and_the_kernel_backend_for_link_faults() -> None:
    """links.proxy and links.backend left at auto: off and kernel on netns hosts (toxiproxy when no fault needs a
    carrier); on local hosts auto stays auto (the server is picked at start) and the backend is toxiproxy."""
    quiet = from_dict({"launch": {"hosts": "netns"}})
    assert (quiet.links.proxy, quiet.links.backend) == ("auto", "auto"), "what was written is kept (config.json)"
    assert (quiet.links_in_effect.proxy, quiet.links_in_effect.backend) == ("off", "toxiproxy")
    faulty = from_dict(_kernel({"links": {}}, a={"action": "partition"}, b={"action": "loss", "percent": 5}))
    assert (faulty.links_in_effect.proxy, faulty.links_in_effect.backend) == ("off", "kernel")
    with pytest.raises(ScenarioError, match="reset_peer': not supported by the kernel backend .links.backend = 'auto'"):
        from_dict(_kernel({"links": {}}, a={"action": "reset_peer"}))
    local = from_dict({"faults": [{"action": "partition", "learner": 0}]})
    assert (local.links_in_effect.proxy, local.links_in_effect.backend) == ("auto", "toxiproxy")


def test_the_capability_table_names_every_link_kind() -> None:
    table = dict(faults.capabilities())
    assert table["partition"] == {"embedded": "yes", "toxiproxy": "yes", "kernel": "yes"}
    assert table["degrade"]["kernel"] == "only bandwidth_kbps"
    assert table["loss"] == {"embedded": "no", "toxiproxy": "no", "kernel": "yes"}
    assert table["corrupt"]["kernel"] == "no" and table["reset_peer"]["kernel"] == "no"
    doc = (REPO / "docs" / "multi-host.md").read_text()
    for name, cells in table.items():
        assert f"| `{name}` | {' | '.join(cells.values())} |" in doc, f"docs/multi-host.md: row of {name}"


@pytest.fixture
def hosts():
    made = NetnsHosts.create(1)
    yield made
    assert made.close() == []
    assert residue(made.prefix) == []


@needs_netns
def test_hosts_reach_the_bridge_and_leave_nothing_after_close(hosts) -> None:
    from diloco_chaos.harness.hosts.netns_probe import in_netns

    h = hosts.hosts[0]
    assert residue(hosts.prefix), "the namespace, veth and bridge exist while the hosts are up"
    with socket.create_server((hosts.syncer_address, 0)) as listener:
        port = listener.getsockname()[1]

        def connect() -> str:
            with socket.create_connection((hosts.syncer_address, port), timeout=5) as s:
                return s.getsockname()[0]

        assert in_netns(h.netns, connect, 10) == h.address, "the host's traffic leaves from its own address"


@needs_netns
@pytest.mark.parametrize("upstream", [True, False], ids=["upstream", "downstream"])
def test_a_kernel_bandwidth_limit_gives_the_rate_set(hosts, upstream: bool) -> None:
    from diloco_chaos.harness.hosts.netns_probe import measure_rate

    h = hosts.hosts[0]
    toxics = KernelToxics({proxy_name(0): HostLink(h.netns, INNER_DEV, h.outer_dev, 0)})
    toxics.prepare()
    chaos = LinkChaos(toxics, 1)
    kbps = 4000.0
    try:
        with chaos.degrade(0, bandwidth_kbps=kbps):
            sample = measure_rate(h.netns, hosts.syncer_address, upstream, seconds=1.5)
        free = measure_rate(h.netns, hosts.syncer_address, upstream, seconds=0.5, warmup_s=0.2)
    finally:
        chaos.clear_all()
        assert toxics.close() == []
    print(f"set {kbps:g} kbps, measured {sample.kbps:.0f} kbps; unlimited {free.kbps:.0f} kbps")
    assert abs(sample.kbps - kbps) <= RATE_TOLERANCE * kbps, sample
    assert free.kbps > 5 * kbps, "the limit is gone once the fault is cleared"


@needs_netns
def test_kernel_partitions_blackhole_and_refuse(hosts) -> None:
    from diloco_chaos.harness.hosts.netns_probe import in_netns

    h = hosts.hosts[0]
    with socket.create_server((hosts.syncer_address, 0)) as listener:
        port = listener.getsockname()[1]
        toxics = KernelToxics({proxy_name(0): HostLink(h.netns, INNER_DEV, h.outer_dev, port)})
        toxics.prepare()
        chaos = LinkChaos(toxics, 1)

        def attempt(timeout_s: float) -> str:
            try:
                with socket.create_connection((hosts.syncer_address, port), timeout=timeout_s):
                    return "connected"
            except TimeoutError:
                return "timeout"
            except ConnectionRefusedError:
                return "refused"

        try:
            assert in_netns(h.netns, lambda: attempt(5), 10) == "connected"
            with chaos.partition(0, "blackhole"):
                assert in_netns(h.netns, lambda: attempt(0.5), 10) == "timeout"
            assert in_netns(h.netns, lambda: attempt(5), 10) == "connected"
            with chaos.partition(0, "refuse"):
                assert in_netns(h.netns, lambda: attempt(5), 10) == "refused"
            assert in_netns(h.netns, lambda: attempt(5), 10) == "connected"
            rules = sh(["ip", "netns", "exec", h.netns, "nft", "list", "table", "inet", TABLE])
            assert "drop" not in rules and "reject" not in rules, rules
        finally:
            chaos.clear_all()
            assert toxics.close() == []


OWNER = """
import sys
from diloco_chaos.chaos.kernel_links import HostLink, KernelToxics
from diloco_chaos.chaos.links import LinkChaos
from diloco_chaos.harness.hosts.netns import INNER_DEV, NetnsHosts
hosts = NetnsHosts.create(2)
h = hosts.hosts[0]
toxics = KernelToxics({"learner-0": HostLink(h.netns, INNER_DEV, h.outer_dev, 9)})
toxics.prepare()
chaos = LinkChaos(toxics, 1)
chaos.degrade(0, bandwidth_kbps=800)
chaos.partition(0)
print(hosts.prefix, flush=True)
sys.stdin.read()
"""


@needs_netns
def test_a_sigkilled_owner_leaves_hosts_that_the_next_start_removes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the owner did not make its hosts within 30 s"
        prefix = proc.stdout.readline().decode().strip()
        assert prefix.startswith("dc"), prefix
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    left = residue(prefix)
    assert any(x.startswith("netns") for x in left) and any(x.startswith("qdisc") for x in left), left
    t0 = time.monotonic()
    made = NetnsHosts.create(1)
    try:
        assert {f"{prefix}n00", f"{prefix}n01", f"{prefix}b"} <= set(made.swept), made.swept
        assert residue(prefix) == [], "the next start removed every leftover of the killed owner"
    finally:
        assert made.close() == []
    print(f"sweep and create took {time.monotonic() - t0:.2f} s")


def test_a_run_on_netns_hosts_where_they_cannot_be_made_fails_before_any_process(tmp_path, monkeypatch) -> None:
    from diloco_chaos.harness.run.supervisor import RunFailed, Supervisor

    monkeypatch.setenv("PATH", str(tmp_path))  # no ip, tc or nft
    sup = Supervisor(from_dict(_kernel()), tmp_path / "runs")
    with pytest.raises(RunFailed, match="launch.hosts = 'netns': netns hosts need"):
        sup.run()
    assert sup.procs == {}, "nothing was started"


@needs_netns
def test_a_kernel_flap_goes_down_and_up_and_leaves_no_rule(hosts) -> None:
    import threading

    h = hosts.hosts[0]
    toxics = KernelToxics({proxy_name(0): HostLink(h.netns, INNER_DEV, h.outer_dev, 9)})
    toxics.prepare()
    flaps: list[bool] = []
    two_cycles = threading.Event()

    def on_event(ev: str, /, **fields: object) -> None:
        if ev == "link_flap":
            flaps.append(bool(fields["down"]))
            if len(flaps) >= 4:
                two_cycles.set()

    chaos = LinkChaos(toxics, 1, on_event=on_event)
    try:
        fault = chaos.flap(0, period_s=0.2, duty=0.5)
        assert two_cycles.wait(10), f"the link flapped only {flaps} in 10 s"
        fault.clear()
        rules = sh(["ip", "netns", "exec", h.netns, "nft", "list", "table", "inet", TABLE])
        assert "drop" not in rules, rules
        assert flaps[:4] == [True, False, True, False]
    finally:
        chaos.clear_all()
        assert toxics.close() == []
