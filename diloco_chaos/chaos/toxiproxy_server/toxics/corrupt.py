"""``corrupt``: flips one random bit in a ``probability`` fraction of the bytes; length is kept.

An extension of the embedded server, not an upstream Toxiproxy toxic: it models a link that
delivers damaged payloads (which the wire's checksums must catch) rather than losing them.
Which bytes and bits are hit comes from the server's seeded RNG, so a run replays exactly;
the toxic's ``toxicity`` keeps its usual meaning (the chance that it applies to a link).
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

from ..toxic import Attr, Toxic, register

if TYPE_CHECKING:
    from ..link import _Link, _ToxicState


def corrupt_bytes(data: bytes, probability: float, rng: random.Random) -> bytes:
    """Return ``data`` with one random bit flipped in each byte chosen with ``probability``.

    Chosen positions are drawn as geometric gaps (one RNG draw per corrupted byte, not per
    byte), which gives each byte an independent ``probability`` of being chosen."""
    if probability <= 0.0 or not data:
        return data
    out = bytearray(data)
    log_keep = math.log1p(-probability) if probability < 1.0 else -math.inf
    pos = -1
    while True:
        pos += 1 + int(math.log(1.0 - rng.random()) / log_keep)
        if pos >= len(out):
            return bytes(out)
        out[pos] ^= 1 << rng.randrange(8)


@register("corrupt")
class Corrupt(Toxic):
    struct = "CorruptToxic"
    attrs = (Attr("probability", "float64", "fraction of bytes with one bit flipped, in [0, 1]", 0.0, 1.0),)

    async def pipe(self, link: _Link, state: _ToxicState, data: bytes, stamp: float) -> None:
        data = corrupt_bytes(data, float(state.toxic.attributes["probability"]), link.rng)
        await link.emit(data, stamp, state.toxic.seq)
