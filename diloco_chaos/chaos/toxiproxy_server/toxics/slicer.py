"""``slicer``: cuts each chunk into pieces of about ``average_size`` bytes (± ``size_variation``),
with ``delay`` microseconds between pieces, by Toxiproxy's recursive halving."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from ..common import _CLOSED, _REMOVED
from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


def _slice_bounds(rng: random.Random, start: int, end: int, average: int, variation: int, out: list[int]) -> None:
    """Append piece ends to ``out``; stop halving once a piece is within average+variation."""
    if (end - start) - average <= variation:
        out.append(end)
        return
    mid = start + (end - start) // 2
    if variation > 0:
        mid += rng.randrange(2 * variation) - variation
    mid = min(max(mid, start + 1), end - 1)
    _slice_bounds(rng, start, mid, average, variation, out)
    _slice_bounds(rng, mid, end, average, variation, out)


@register("slicer")
class Slicer(Toxic):
    struct = "SlicerToxic"
    attrs = (
        Attr("average_size", "int", "average piece size in bytes"),
        Attr("size_variation", "int", "variation of the piece size in bytes"),
        Attr("delay", "int", "delay between pieces in microseconds"),
    )

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        seq = state.toxic.seq
        attrs = state.toxic.attributes
        delay = attrs["delay"] / 1_000_000.0
        ends: list[int] = []
        average, variation = max(1, int(attrs["average_size"])), max(0, int(attrs["size_variation"]))
        _slice_bounds(link.rng, 0, len(data), average, variation, ends)
        view = memoryview(data)
        start = 0
        for end in ends:
            await link.emit(bytes(view[start:end]), stamp, seq)
            start = end
            if delay > 0:
                outcome = await link.sleep(delay, seq)
                if outcome == _CLOSED:
                    return
                if outcome == _REMOVED:
                    if start < len(data):
                        await link.emit(bytes(view[start:]), stamp, seq)
                    return
