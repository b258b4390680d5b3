"""``reset_peer``: after ``timeout`` ms, closes both sockets with RST (``SO_LINGER`` 0).

Like Toxiproxy: the first chunk (dropped) starts the countdown, which removing the toxic
does not cancel; at the end of the stream the countdown runs before the reset too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import _CLOSED
from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("reset_peer")
class ResetPeer(Toxic):
    struct = "ResetToxic"
    attrs = (Attr("timeout", "int64", "delay before the reset, in milliseconds"),)

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        outcome = await link.sleep(state.toxic.attributes["timeout"] / 1000.0, None)
        if outcome == _CLOSED:
            return
        link.conn.set_reset()
        link.request_close(state.toxic.seq)

    async def close(self, link: _Link, state: _ToxicState) -> bool:
        timeout = state.toxic.attributes["timeout"] / 1000.0
        if await link.sleep(timeout, None, closing_ok=True) == _CLOSED:
            return False
        link.conn.set_reset()
        return True
