"""``slow_close``: delays passing on the end of the stream by ``delay`` ms; data is untouched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _CLOSED
from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("slow_close")
class SlowClose(Toxic):
    struct = "SlowCloseToxic"
    attrs = (Attr("delay", "int64", "delay before closing, in milliseconds"),)

    async def close(self, link: _Link, state: _ToxicState) -> bool:
        delay = state.toxic.attributes["delay"] / 1000.0
        return await link.sleep(delay, state.toxic.seq, closing_ok=True) != _CLOSED
