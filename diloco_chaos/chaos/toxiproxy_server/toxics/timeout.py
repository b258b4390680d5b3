"""``timeout``: drops all data and closes the stream after ``timeout`` ms without data.

With ``timeout`` 0 the stream is never closed (data is still dropped).  Removing an active
timeout toxic closes the stream, as Toxiproxy's ``TimeoutToxic.Cleanup`` does: data was
dropped, so the byte stream cannot be resumed consistently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


@register("timeout")
class Timeout(Toxic):
    struct = "TimeoutToxic"
    attrs = (Attr("timeout", "int64", "idle time before closing, in milliseconds; 0 means never"),)

    def attached(self, link: _Link, state: _ToxicState) -> None:
        link.cancel_timer(state)
        if state.active and state.toxic.attributes["timeout"] > 0:
            link.set_timer(state, state.toxic.attributes["timeout"] / 1000.0)

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        self.attached(link, state)  # data is dropped; Toxiproxy restarts its timer per chunk

    def detached(self, link: _Link, state: _ToxicState) -> None:
        if state.active:
            link.request_close(state.toxic.seq)
