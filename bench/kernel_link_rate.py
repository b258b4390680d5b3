"""Benchmark: the payload rate a kernel-backend bandwidth limit really gives, each direction, and what loss does.

What: one netns host (diloco_chaos/harness/hosts/netns.py), a `degrade` bandwidth limit set through the kernel link
backend (diloco_chaos/chaos/kernel_links.py: tbf on the host's veth) at each rate of `--kbps`, and one TCP flow's
payload rate measured over `--seconds` after a warm-up (diloco_chaos/harness/hosts/netns_probe.py), upstream (host ->
bridge) and downstream. With `--loss`, the same flow unthrottled under each `loss` percentage (nftables numgen drops):
its rate, to show what the kernel carries in place of netem.

Why: the kernel backend promises Toxiproxy's meaning of bandwidth_kbps (the application's bytes), but tbf
counts frames on the wire; the table shows how far the measured rate is from the one set (tests hold it to
10 %).

Usage (root, `ip`, `tc`, `nft`): ``python bench/kernel_link_rate.py [--kbps 800 4000 16000 64000]
[--seconds 2] [--loss 1 5]``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import Column, emit, parser  # noqa: E402
from diloco_chaos.chaos.kernel_links import HostLink, KernelToxics  # noqa: E402
from diloco_chaos.chaos.links import LinkChaos, proxy_name  # noqa: E402
from diloco_chaos.harness.hosts.netns import INNER_DEV, NetnsHosts, availability  # noqa: E402
from diloco_chaos.harness.hosts.netns_probe import measure_rate  # noqa: E402

COLUMNS = (Column("fault", "fault", 22, left=True), Column("direction", "direction", 11, left=True),
           Column("set_kbps", "set kbps", 10, ".0f"), Column("measured_kbps", "measured kbps", 15, ".0f"),
           Column("ratio", "measured/set", 14, ".3f"))


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--kbps", type=float, nargs="+", default=[800.0, 4000.0, 16000.0, 64000.0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--loss", type=float, nargs="*", default=[])
    args = ap.parse_args()
    why = availability()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    rows = []
    hosts = NetnsHosts.create(1)
    try:
        h = hosts.hosts[0]
        # the probe's flows use ports of their own: match every TCP port (a host has no other traffic here)
        toxics = KernelToxics({proxy_name(0): HostLink(h.netns, INNER_DEV, h.outer_dev, 0)})
        toxics.prepare()
        chaos = LinkChaos(toxics, 1)
        try:
            for direction, up in (("upstream", True), ("downstream", False)):
                sample = measure_rate(h.netns, hosts.syncer_address, up, args.seconds)
                rows.append({"fault": "none", "direction": direction, "measured_kbps": sample.kbps})
            for kbps in args.kbps:
                with chaos.degrade(0, bandwidth_kbps=kbps):
                    for direction, up in (("upstream", True), ("downstream", False)):
                        sample = measure_rate(h.netns, hosts.syncer_address, up, args.seconds)
                        rows.append({"fault": f"degrade {kbps:g} kbps", "direction": direction, "set_kbps": kbps,
                                     "measured_kbps": sample.kbps, "ratio": sample.kbps / kbps})
            for pct in args.loss:
                with chaos.add_toxics(0, "loss", [("loss", s, {"percent": pct}) for s in ("upstream", "downstream")]):
                    sample = measure_rate(h.netns, hosts.syncer_address, True, args.seconds)
                    rows.append({"fault": f"loss {pct:g} %", "direction": "upstream", "measured_kbps": sample.kbps})
        finally:
            chaos.clear_all()
            toxics.close()
    finally:
        left = hosts.close()
    emit(COLUMNS, rows, args.json)
    if left:
        print(f"left after clean-up: {left}")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
