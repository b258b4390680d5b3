"""``limit_data``: lets ``bytes`` bytes through per link, then closes the stream."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("limit_data")
class LimitData(Toxic):
    struct = "LimitDataToxic"
    attrs = (Attr("bytes", "int64", "bytes to let through before closing"),)

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        limit = int(state.toxic.attributes["bytes"])
        remaining = max(0, limit - state.transmitted)
        if remaining < len(data):
            data = data[:remaining]
        if data:
            state.transmitted += len(data)
            await link.emit(data, stamp, state.toxic.seq)
        if limit - state.transmitted <= 0:
            link.request_close(state.toxic.seq)
