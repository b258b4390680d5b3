"""``latency``: delays every chunk by ``latency`` ms plus a uniform jitter in ``[-jitter, jitter)``.

The delay counts from when the chunk was read, so time already spent earlier in the chain
(or buffered) is not added twice, as in Toxiproxy's ``LatencyToxic``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _CLOSED, _DONE
from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("latency")
class Latency(Toxic):
    struct = "LatencyToxic"
    attrs = (Attr("latency", "int64", "delay in milliseconds"), Attr("jitter", "int64", "jitter in milliseconds"))

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        attrs = state.toxic.attributes
        delay_ms = int(attrs["latency"])
        jitter = int(attrs["jitter"])
        if jitter > 0:
            delay_ms += link.rng.randrange(2 * jitter) - jitter
        sleep = delay_ms / 1000.0 - (link.loop.time() - stamp)
        if sleep > 0:
            outcome = await link.sleep(sleep, state.toxic.seq)
            if outcome == _CLOSED:
                return
            if outcome == _DONE:
                stamp += sleep
        await link.emit(data, stamp, state.toxic.seq)
