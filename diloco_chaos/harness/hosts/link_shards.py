"""A learner's link to a sharded synchronizer: one `SyncerLink` (one TCP connection, through its own proxy) per
shard, behind the one interface the link process drives (diloco_chaos/harness/learner/link_process.py).

Why one connection per shard, not one multiplexed: a shard is a process on its own host in the paper, so a
learner's connection to it fails, reconnects and is restored with it alone, while its connections to the other
shards go on; each has its own proxy (`learner-<i>-shard<k>`, diloco_chaos/chaos/links.py), and a link fault on the
learner applies to all of them. Every shard gets each step's META (each runs the rounds of its own fragments and pulls
from this learner's snapshot); a final push of fragment p goes to the shard that owns p
(diloco_chaos/trainers/syncers/shards.py).
The synchronous baselines never shard (validated), so `exchange` goes to shard 0.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from diloco_chaos.harness.learner.syncer_link import SyncerLink
from diloco_chaos.harness.wire.framing import Message
from diloco_chaos.trainers.messages import FragmentPush


class ShardedLink:
    """`SyncerLink`'s interface over one link per synchronizer shard (`links[k]`: shard k's)."""

    def __init__(self, links: Sequence[SyncerLink], owners: Sequence[int]) -> None:
        self.links = list(links)
        self.owners = list(owners)
        """The owning shard of each fragment."""

    def start(self) -> ShardedLink:
        for link in self.links:
            link.start()
        return self

    @property
    def fatal(self) -> str | None:
        return next((link.fatal for link in self.links if link.fatal is not None), None)

    @property
    def stop_requested(self) -> bool:
        return any(link.stop_requested for link in self.links)

    @property
    def bytes_up(self) -> int:
        return sum(link.bytes_up for link in self.links)

    @property
    def bytes_down(self) -> int:
        return sum(link.bytes_down for link in self.links)

    @property
    def thread_cpu_s(self) -> dict[str, float]:
        """CPU seconds of every link's threads, each name suffixed with its shard (`.s<k>`)."""
        return {f"{name}.s{k}": s for k, link in enumerate(self.links) for name, s in link.thread_cpu_s.items()}

    def publish(self, snapshot: Any, partition: list[list[str]]) -> None:
        for link in self.links:
            link.publish(snapshot, partition)

    def push(self, push: FragmentPush) -> None:
        shard = self.owners[push.fragment] if 0 <= push.fragment < len(self.owners) else 0
        self.links[shard].push(push)

    def exchange(self, msg: Message) -> dict[str, Tensor]:
        return self.links[0].exchange(msg)

    def close(self, flush_timeout_s: float, bye: bool = True) -> None:
        """Close every shard's link at once (each flushes within the bound, in its own thread)."""
        closers = [threading.Thread(target=link.close, args=(flush_timeout_s, bye), name=f"link-close-s{k}",
                                    daemon=True) for k, link in enumerate(self.links)]
        for th in closers:
            th.start()
        for link, th in zip(self.links, closers, strict=True):  # SyncerLink.close is itself bounded
            th.join(timeout=flush_timeout_s + 2 * link.t.socket_op_s + 1.0)
