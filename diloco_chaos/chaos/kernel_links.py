"""The kernel link backend: a learner host's link faults made by `tc` and `nft` on its veth, not by a proxy.

With `[launch] hosts = "netns"` each learner host is a network namespace whose
only way out is a veth pair to a bridge in the root namespace, where the
syncer listens (diloco_chaos/harness/hosts/netns.py). `links.backend = "kernel"` then
carries link faults on that veth: diloco_chaos/chaos/links.py (`LinkChaos`) drives this
object exactly as it drives a Toxiproxy client, because a fault there is a
set of per-direction "toxics", and each toxic type this kernel can carry maps
onto one kernel object:

  * `bandwidth` (degrade's bandwidth_kbps): a `tbf` qdisc at the egress of
    the veth end that sends that direction (upstream: the end inside the
    namespace; downstream: the end on the bridge). tbf counts frames on the
    wire, so the rate set is the payload rate times `WIRE_PER_PAYLOAD` (the
    headers of a full TCP segment), which keeps Toxiproxy's meaning: the
    figure is what the application's bytes get.
  * `timeout` with timeout 0 (partition blackhole, flap): an nftables `drop`
    rule for the syncer's port and that direction, in a table inside the
    host's namespace.
  * a disabled proxy (partition refuse): `reject with tcp reset` both ways,
    so both ends see a reset and a new connect is refused at once.
  * `loss` (the kernel-only `loss` fault): nftables `numgen random` drops
    that share of the packets; this kernel has no `netem`, so there is no
    added latency, jitter or reordering (the capability table, docs/multi-host.md).

Only the learner<->syncer flow (the syncer's TCP port) is matched by the
nft rules, as only it goes through a learner's proxy with Toxiproxy; the
rendezvous store's few bytes share the tbf shaper. Every command runs with a
timeout and raises `KernelLinkError` (a ToxiproxyError, so LinkChaos's
roll-back and teardown handle it like a proxy's error).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from dataclasses import dataclass, field

from diloco_chaos.chaos.toxiproxy_records import ToxiproxyError

log = logging.getLogger(__name__)

KERNEL_TOXICS = frozenset({"bandwidth", "timeout", "loss"})
"""Toxic types this backend carries (plus enabling and disabling a link)."""
TABLE = "diloco_chaos"
"""The nftables table (family inet) inside each host's namespace."""
WIRE_PER_PAYLOAD = 1514 / 1448
"""Wire bytes per payload byte of a full-sized TCP segment on a 1500-byte-MTU Ethernet veth: 1448 bytes of data
(MSS with timestamps) carried in 1514 bytes (plus 52 of TCP/IP and 14 of Ethernet headers)."""
BURST_S = 0.004
"""tbf bucket depth in seconds of the rate (at least MIN_BURST_BYTES): what a link may send at once after an
idle spell."""
MIN_BURST_BYTES = 4 * 1514
QUEUE_S = 0.5
"""tbf queue in seconds of the rate (at least 64 KiB): packets past it are dropped, like a router's buffer."""
CMD_TIMEOUT_S = 10.0
_ALREADY_GONE = ("No such file", "Cannot find", "handle of zero", "does not exist", "Invalid handle",
                 "Cannot open network namespace")
"""What tc, ip and nft say when the thing to remove is not there (nothing to clean)."""


class KernelLinkError(ToxiproxyError):
    """A tc, nft or ip command failed or timed out."""


def sh(args: list[str], timeout_s: float = CMD_TIMEOUT_S, stdin: str | None = None, check: bool = True) -> str:
    """Run one command (no shell), bounded by `timeout_s`; its stdout. KernelLinkError when it fails and `check`."""
    try:
        out = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise KernelLinkError(f"{' '.join(args)}: no answer within {timeout_s}s") from None
    except OSError as e:
        raise KernelLinkError(f"{' '.join(args)}: {e}") from None
    if check and out.returncode != 0:
        raise KernelLinkError(f"{' '.join(args)}: exit {out.returncode}: {out.stderr.strip()[-300:]}")
    return out.stdout


@dataclass(frozen=True)
class HostLink:
    """One learner host's link as the kernel sees it."""

    netns: str
    """The host's network namespace (a name under /run/netns)."""
    inner_dev: str
    """The veth end inside the namespace: its egress is the upstream (learner -> syncer) direction."""
    outer_dev: str
    """The veth end on the bridge in the root namespace: its egress is the downstream direction."""
    syncer_port: int
    """The syncer's TCP port: what the nft rules match (0: every TCP port, for probes of the link alone)."""


@dataclass
class _Link:
    host: HostLink
    rates: dict[str, dict[str, float]] = field(default_factory=lambda: {"upstream": {}, "downstream": {}})
    """stream -> toxic name -> bytes/s of payload; the tightest one is in force."""
    rules: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    """toxic name (or "disabled") -> (chain, comment) of each nft rule it added."""


def tbf_args(rate_bytes_s: float) -> list[str]:
    """tbf parameters for a payload rate in bytes/s (the wire rate is WIRE_PER_PAYLOAD higher)."""
    wire = rate_bytes_s * WIRE_PER_PAYLOAD
    burst = max(MIN_BURST_BYTES, round(wire * BURST_S))
    limit = max(65536, round(wire * QUEUE_S))
    return ["tbf", "rate", f"{round(wire * 8)}bit", "burst", str(burst), "limit", str(limit)]


class KernelToxics:
    """The part of the Toxiproxy client API that LinkChaos uses, carried by tc and nft on each host's veth.

    `links` maps a proxy name (diloco_chaos/chaos/links.py `proxy_name(m)`) to its host. `prepare()` makes each host's
    empty nft table; `close()` removes every qdisc and table this object made (never raises: it runs at teardown)."""

    def __init__(self, links: dict[str, HostLink], timeout_s: float = CMD_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._links = {name: _Link(h) for name, h in links.items()}
        self._lock = threading.Lock()

    # -- lifetime --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """One nft table per host with an output and an input chain (rules are added per fault)."""
        for link in self._links.values():
            self._nft(link, f"add table inet {TABLE}\n"
                            f"add chain inet {TABLE} out {{ type filter hook output priority 0; }}\n"
                            f"add chain inet {TABLE} in {{ type filter hook input priority 0; }}\n")

    def close(self) -> list[str]:
        """Remove every qdisc and nft table made here; what could not be removed, one line each."""
        failed: list[str] = []
        for link in self._links.values():
            h = link.host
            for args in (["tc", "-n", h.netns, "qdisc", "del", "dev", h.inner_dev, "root"],
                         ["tc", "qdisc", "del", "dev", h.outer_dev, "root"],
                         ["ip", "netns", "exec", h.netns, "nft", "delete", "table", "inet", TABLE]):
                try:
                    sh(args, self.timeout_s)
                except KernelLinkError as e:
                    if not any(gone in str(e) for gone in _ALREADY_GONE):
                        failed.append(str(e))
            link.rates = {"upstream": {}, "downstream": {}}
            link.rules.clear()
        for line in failed:
            log.warning("kernel link clean-up: %s", line)
        return failed

    # -- the client API LinkChaos uses -----------------------------------------------------------
    def add_toxic(self, proxy: str, name: str, type_: str, /, stream: str = "downstream", toxicity: float = 1.0,
                  **attributes: float) -> None:
        link = self._link(proxy)
        with self._lock:
            if type_ == "bandwidth":
                link.rates[stream][name] = float(attributes["rate"]) * 1000.0  # Toxiproxy's KB/s
                try:
                    self._shape(link, stream)
                except KernelLinkError:
                    del link.rates[stream][name]
                    raise
            elif type_ == "timeout" and attributes.get("timeout", 0) == 0:
                self._rule(link, name, [stream], "drop")
            elif type_ == "loss":
                per_10k = round(float(attributes["percent"]) * 100)
                self._rule(link, name, [stream], f"numgen random mod 10000 < {per_10k} drop")
            else:
                raise KernelLinkError(f"the kernel link backend cannot carry a {type_} toxic "
                                      f"(it carries {', '.join(sorted(KERNEL_TOXICS))})")

    def update_toxic(self, proxy: str, name: str, /, toxicity: float | None = None, **attributes: float) -> None:
        raise KernelLinkError(f"the kernel link backend cannot update toxic {name} (no netem: no latency)")

    def remove_toxic(self, proxy: str, name: str, missing_ok: bool = False) -> None:
        link = self._link(proxy)
        with self._lock:
            for stream, rates in link.rates.items():
                if rates.pop(name, None) is not None:
                    self._shape(link, stream)
                    return
            if name in link.rules:
                self._unrule(link, name)
            elif not missing_ok:
                raise KernelLinkError(f"no toxic {name} on {proxy}")

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        """Disabled: every packet of the flow is answered with a TCP reset, both ways (a refuse partition)."""
        link = self._link(proxy)
        with self._lock:
            if enabled and "disabled" in link.rules:
                self._unrule(link, "disabled")
            elif not enabled and "disabled" not in link.rules:
                self._rule(link, "disabled", ["upstream", "downstream"], "reject with tcp reset",
                           spare_resets=True)

    # -- internals -------------------------------------------------------------------------------
    def _link(self, proxy: str) -> _Link:
        link = self._links.get(proxy)
        if link is None:
            raise KernelLinkError(f"no kernel link {proxy!r}")
        return link

    def _nft(self, link: _Link, script: str) -> str:
        return sh(["ip", "netns", "exec", link.host.netns, "nft", "-f", "-"], self.timeout_s, stdin=script)

    def _match(self, link: _Link, stream: str) -> tuple[str, str]:
        """(chain, match) of the flow's packets in one direction, as seen inside the host's namespace."""
        h = link.host
        if stream == "upstream":
            port = f"tcp dport {h.syncer_port}" if h.syncer_port else "meta l4proto tcp"
            return "out", f'oifname "{h.inner_dev}" {port}'
        port = f"tcp sport {h.syncer_port}" if h.syncer_port else "meta l4proto tcp"
        return "in", f'iifname "{h.inner_dev}" {port}'

    def _rule(self, link: _Link, name: str, streams: list[str], verdict: str, spare_resets: bool = False) -> None:
        """Add one rule per stream, tagged with the toxic's name, all or nothing. `spare_resets`: resets pass,
        so that the reset a `reject` sends the other way is not itself rejected."""
        added: list[tuple[str, str]] = []
        script = ""
        for stream in streams:
            chain, match = self._match(link, stream)
            comment = f"{name}-{stream}"
            spare = " tcp flags & rst == 0" if spare_resets else ""
            script += f'add rule inet {TABLE} {chain} {match}{spare} {verdict} comment "{comment}"\n'
            added.append((chain, comment))
        self._nft(link, script)  # one nft transaction: every rule or none
        link.rules[name] = added

    def _unrule(self, link: _Link, name: str) -> None:
        listing = sh(["ip", "netns", "exec", link.host.netns, "nft", "-a", "list", "table", "inet", TABLE],
                     self.timeout_s)
        script = ""
        for chain, comment in link.rules[name]:
            for line in listing.splitlines():
                if f'comment "{comment}"' in line and "# handle " in line:
                    script += f"delete rule inet {TABLE} {chain} handle {line.rsplit('# handle ', 1)[1].strip()}\n"
        if script:
            self._nft(link, script)
        del link.rules[name]

    def _shape(self, link: _Link, stream: str) -> None:
        """Put the tightest rate of the stream's bandwidth toxics in force (or no qdisc when there is none)."""
        h = link.host
        ns = ["-n", h.netns] if stream == "upstream" else []
        dev = h.inner_dev if stream == "upstream" else h.outer_dev
        rates = link.rates[stream]
        if rates:
            sh(["tc", *ns, "qdisc", "replace", "dev", dev, "root", *tbf_args(min(rates.values()))], self.timeout_s)
        else:
            sh(["tc", *ns, "qdisc", "del", "dev", dev, "root"], self.timeout_s, check=False)
