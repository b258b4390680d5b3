"""``bandwidth``: limits throughput to ``rate`` KB/s, releasing at most 100 ms worth at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _CLOSED, _REMOVED
from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("bandwidth")
class Bandwidth(Toxic):
    struct = "BandwidthToxic"
    attrs = (Attr("rate", "int64", "rate in KB/s; 0 or less means unlimited"),)

    def attached(self, link: _Link, state: _ToxicState) -> None:
        state.debt = 0.0

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        seq = state.toxic.seq
        rate = int(state.toxic.attributes["rate"])  # KB/s == bytes per ms
        if rate <= 0:
            state.debt = 0.0
            await link.emit(data, stamp, seq)
            return
        state.debt += len(data) / (rate * 1000.0)
        piece = rate * 100  # what the rate allows in 100 ms
        while len(data) > piece:
            outcome = await link.sleep(0.1, seq)
            if outcome == _CLOSED:
                return
            if outcome == _REMOVED:
                break
            await link.emit(data[:piece], stamp, seq)
            data = data[piece:]
            state.debt -= 0.1
        else:
            start = link.loop.time()
            outcome = await link.sleep(state.debt, seq)
            if outcome == _CLOSED:
                return
            state.debt -= link.loop.time() - start
        await link.emit(data, stamp, seq)
