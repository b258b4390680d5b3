"""Learner hosts as Linux network namespaces on one machine (`[launch] hosts = "netns"`), and their clean-up.

Why: with every process on loopback, a "link" is only ever a proxy's idea of
one. Here each learner host gets its own network namespace, whose only way out
is a veth pair to a bridge in the root namespace; the syncer (and the Gloo
rendezvous store) listen on the bridge's address. Learner<->syncer traffic
then crosses a real kernel path (a TCP stack per host, a veth, a bridge), on
which the kernel link backend (diloco_chaos/chaos/kernel_links.py) puts tc qdiscs and
nftables rules. The chips of one learner share its namespace and reach each
other on its loopback (Gloo is told so: GLOO_SOCKET_IFNAME=lo); a chip enters
its namespace first thing in its process (`enter_netns`), before any thread or
socket exists, so everything it opens and forks lives there.

Clean-up is guaranteed two ways. `NetnsHosts.close()` removes every namespace,
veth, bridge, qdisc and nft table of the run (the supervisor calls it at the end
of every run, failed or not). And every name embeds the supervisor's pid
(`dc<pid, 6 hex><run, 2 hex>`, within the kernel's 15 characters for a link
name), so `sweep_leftovers()`, which every start runs first, removes whatever a
supervisor that died without its clean-up (SIGKILL) left behind: anything named
after a pid that no longer runs. A pid reused by an unrelated process keeps its
leftovers until that process ends too; nothing of a live run is ever touched.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import os
import re
import shutil
from dataclasses import dataclass, field

from diloco_chaos.chaos.kernel_links import KernelLinkError, sh
from diloco_chaos.harness.run.procutil import pid_alive

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
NAME_RE = re.compile(r"dc(?P<pid>[0-9a-f]{6})(?P<run>[0-9a-f]{2})(?P<what>b|h\d\d|n\d\d)")
"""Every name a run makes: its prefix, then `b` (the bridge), `h<i>` (learner i's veth end on the bridge) or
`n<i>` (learner i's namespace)."""
INNER_DEV = "eth0"
"""The veth end inside each namespace (every namespace has its own, so one name does)."""
SUBNET_BASE = "10.213"
"""Bridges take a free /24 under this /16: 10.213.<n>.0/24, the syncer on .1, learner i on .<i + 2>."""
MAX_HOSTS = 99
_runs = itertools.count()


def availability() -> str | None:
    """Why netns hosts cannot be made here (None: they can): root, `ip`, `tc` and `nft` are needed."""
    if os.geteuid() != 0:
        return "netns hosts need root (network namespaces, veths, tc and nft)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"netns hosts need `{tool}` on PATH (Debian: apt-get install iproute2 nftables)"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces"
    return _probe()


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    """Root is not always enough (a container without CAP_SYS_ADMIN or CAP_NET_ADMIN): make one namespace, a
    veth and an nft table for real, once per process, and remove them. Named like a run's (run ff), so a probe
    cut short is swept like any leftover."""
    netns, dev = f"dc{os.getpid():06x}ffn99", f"dc{os.getpid():06x}ffh99"
    try:
        for args in (["ip", "netns", "add", netns],
                     ["ip", "link", "add", dev, "type", "veth", "peer", "name", INNER_DEV, "netns", netns],
                     ["ip", "netns", "exec", netns, "nft", "add", "table", "inet", "probe"],
                     ["tc", "-n", netns, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "1mbit", "burst", "32kb",
                      "latency", "50ms"]):
            try:
                sh(args)
            except KernelLinkError as e:
                return f"netns hosts cannot be made here: {e}"
        return None
    finally:
        sh(["ip", "link", "del", dev], check=False)
        sh(["ip", "netns", "del", netns], check=False)


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace `name` (setns); what it opens, starts or forks afterwards lives
    there. Called first thing in a chip process, while it has one thread."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # the learner's chips meet on its own loopback


def _netns_names() -> list[str]:
    return [line.split()[0] for line in sh(["ip", "netns", "list"]).splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = []
    for line in sh(["ip", "-o", "link", "show"]).splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            out.append(parts[1].strip().split("@", 1)[0])
    return out


def ours(names: list[str]) -> list[str]:
    """The names among `names` that a run of this harness makes."""
    return [n for n in names if NAME_RE.fullmatch(n)]




def leftovers() -> list[str]:
    """Names (namespaces, then links) made by a supervisor whose pid no longer runs."""
    def dead(name: str) -> bool:
        m = NAME_RE.fullmatch(name)
        return m is not None and not pid_alive(int(m.group("pid"), 16))

    return [n for n in _netns_names() if dead(n)] + [n for n in _link_names() if dead(n)]


def sweep_leftovers() -> list[str]:
    """Remove what dead supervisors left (`leftovers()`); the names removed. Namespaces go first (with them
    their veth ends, nft tables and qdiscs), then bridges and any veth that outlived its namespace."""
    removed = []
    namespaces = set(_netns_names())
    for name in [n for n in leftovers() if n in namespaces]:
        sh(["ip", "netns", "del", name], check=False)
        removed.append(name)
    for name in leftovers():  # listed again: a namespace's removal took its veth peers with it
        sh(["ip", "link", "del", name], check=False)
        removed.append(name)
    return removed


def remaining(prefix: str) -> list[str]:
    """Everything of a run named with `prefix` that still exists, one line each: namespaces, links, qdiscs on
    such links (`tc qdisc show`) and the nft tables of the kernel link backend left in the root namespace."""
    from diloco_chaos.chaos.kernel_links import TABLE

    left = [f"netns {n}" for n in _netns_names() if n.startswith(prefix)]
    left += [f"link {n}" for n in _link_names() if n.startswith(prefix)]
    left += [f"qdisc {line}" for line in sh(["tc", "qdisc", "show"]).splitlines() if f" {prefix}" in line]
    left += [f"nft {line}" for line in sh(["nft", "list", "tables"]).splitlines() if TABLE in line]
    return left


def _free_subnet(seed: int) -> str:
    """A /24 under SUBNET_BASE that no interface here has an address in."""
    used = set()
    for line in sh(["ip", "-o", "-4", "addr", "show"]).splitlines():
        m = re.search(r"inet (\d+\.\d+\.\d+)\.\d+/", line)
        if m:
            used.add(m.group(1))
    for k in range(256):
        net = f"{SUBNET_BASE}.{(seed + k) % 256}"
        if net not in used:
            return net
    raise KernelLinkError(f"no free /24 under {SUBNET_BASE}.0.0/16 for the run's bridge")


@dataclass(frozen=True)
class HostNet:
    """One learner host: its namespace and its addresses."""

    netns: str
    """The namespace (/run/netns/<netns>)."""
    address: str
    """Its address on the bridge (on INNER_DEV inside the namespace)."""
    outer_dev: str
    """Its veth end on the bridge, in the root namespace."""


@dataclass
class NetnsHosts:
    """The namespaces, veths and bridge of one run; `close()` removes them all."""

    prefix: str
    bridge: str
    syncer_address: str
    """The bridge's address, where the syncer and the store listen for the hosts."""
    hosts: list[HostNet] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)
    """What `create` removed first, left behind by dead supervisors."""

    @classmethod
    def create(cls, learners: int) -> NetnsHosts:
        """Sweep leftovers, then make the bridge and one namespace + veth per learner, all or nothing."""
        if not 1 <= learners <= MAX_HOSTS:
            raise ValueError(f"netns hosts: learners = {learners}: must be in [1, {MAX_HOSTS}]")
        swept = sweep_leftovers()
        pid = os.getpid()
        prefix = f"dc{pid:06x}{next(_runs) % 256:02x}"
        net = _free_subnet(pid)
        made = cls(prefix, prefix + "b", f"{net}.1", swept=swept)
        try:
            sh(["ip", "link", "add", made.bridge, "type", "bridge"])
            sh(["ip", "addr", "add", f"{made.syncer_address}/24", "dev", made.bridge])
            sh(["ip", "link", "set", made.bridge, "up"])
            for i in range(learners):
                host = HostNet(f"{prefix}n{i:02d}", f"{net}.{i + 2}", f"{prefix}h{i:02d}")
                sh(["ip", "netns", "add", host.netns])
                made.hosts.append(host)
                sh(["ip", "link", "add", host.outer_dev, "type", "veth", "peer", "name", INNER_DEV,
                    "netns", host.netns])
                sh(["ip", "link", "set", host.outer_dev, "master", made.bridge, "up"])
                sh(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", INNER_DEV])
                sh(["ip", "-n", host.netns, "link", "set", INNER_DEV, "up"])
                sh(["ip", "-n", host.netns, "link", "set", "lo", "up"])
        except BaseException:
            made.close()
            raise
        return made

    def close(self) -> list[str]:
        """Remove the namespaces (their nft tables, qdiscs and veth ends go with them), the veths and the bridge;
        then check that nothing of the run is left (`remaining`). Never raises; what is left, one line each."""
        left: list[str] = []
        for args in [*(["ip", "netns", "del", h.netns] for h in self.hosts),
                     *(["ip", "link", "del", h.outer_dev] for h in self.hosts),  # normally gone with its peer
                     ["ip", "link", "del", self.bridge]]:
            try:
                sh(args, check=False)
            except KernelLinkError as e:  # timed out: what is left is listed below
                log.warning("netns hosts clean-up: %s", e)
        try:
            left = remaining(self.prefix)
        except KernelLinkError as e:
            left = [f"could not list what is left: {e}"]
        for line in left:
            log.warning("netns hosts: %s is left after clean-up", line)
        return left

    def describe(self) -> dict[str, dict[str, str]]:
        """Learner -> its namespace, address and veth end (the `hosts_ready` event's `hosts`)."""
        return {str(i): {"netns": h.netns, "address": h.address, "veth": h.outer_dev}
                for i, h in enumerate(self.hosts)}
