"""``noop``: passes data through unchanged (Toxiproxy's ``NoopToxic``)."""

from __future__ import annotations

from ..toxic import Toxic, register


@register("noop")
class Noop(Toxic):
    struct = "NoopToxic"
