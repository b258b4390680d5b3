"""Records and argument checks of ``diloco_chaos.chaos.toxiproxy_client``.

What: the frozen ``ProxyInfo``/``ToxicInfo`` answers, ``ToxiproxyError``, the checks run on
arguments before anything is sent (names, addresses, toxicity, attributes, timeouts) and the
parsers from server JSON or library objects to the records.  Why separate: these are pure
functions with no HTTP; the client module keeps the calls.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from toxiproxy import Proxy

STREAMS = ("upstream", "downstream")
#: Toxic types only the embedded server (``diloco_chaos.chaos.toxiproxy_server``) implements.
EMBEDDED_ONLY_TOXICS = frozenset({"corrupt"})
# Characters that would change the meaning of the URL the library builds by "%s" formatting.
_UNSAFE_NAME = re.compile(r"[/?#%\s]")


class ToxiproxyError(RuntimeError):
    """A Toxiproxy API call failed; ``status`` is the HTTP status, ``None`` if no HTTP answer came."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ProxyInfo:
    """A proxy as the server reports it (``listen`` is the bound address once enabled)."""

    name: str
    listen: str
    upstream: str
    enabled: bool

    @property
    def listen_host(self) -> str:
        """Host part of ``listen`` without IPv6 brackets ("" if the server listens on all interfaces)."""
        return _split_hostport(self.listen)[0]

    @property
    def listen_port(self) -> int:
        """Port part of ``listen`` (0 while a proxy created disabled has not bound yet)."""
        return _split_hostport(self.listen)[1]


@dataclass(frozen=True)
class ToxicInfo:
    """A toxic as the server reports it."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int | float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Argument checks and response parsing
# --------------------------------------------------------------------------------------


def _split_hostport(address: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host, port); ValueError if malformed."""
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            raise ValueError(f"{address!r} is not '[host]:port'")
        host, port_text = address[1:end], address[end + 2 :]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"{address!r} has no ':port'")
        if ":" in host:
            raise ValueError(f"{address!r}: an IPv6 host must be in brackets, e.g. '[::1]:8080'")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError(f"{address!r}: port must be a number in [0, 65535]")
    return host, int(port_text)


def _check_address(what: str, address: object, port_zero_ok: bool) -> str:
    if not isinstance(address, str):
        raise ValueError(f"{what} must be a 'host:port' string, got {address!r}")
    example = "'127.0.0.1:0'" if port_zero_ok else "'127.0.0.1:8080'"
    if address.isascii() and address.isdigit():  # a bare port, e.g. "0"
        host = ""
    else:
        try:
            host, port = _split_hostport(address)
        except ValueError as exc:
            raise ValueError(f"{what} {exc}; give 'host:port' with an explicit host, e.g. {example}") from None
    if not host:
        hint = " (Toxiproxy would listen on ALL interfaces; say '0.0.0.0:PORT' if you really mean that)"
        raise ValueError(f"{what} {address!r} has no host{hint if what == 'listen' else ''}; "
                         f"give one explicitly, e.g. {example}")
    if port == 0 and not port_zero_ok:
        raise ValueError(f"{what} {address!r}: port 0 is not a destination")
    return address


def _check_name(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{kind} name must be a non-empty string, got {name!r}")
    if _UNSAFE_NAME.search(name) or not name.isprintable():
        raise ValueError(f"{kind} name {name!r} must not contain '/', '?', '#', '%', whitespace or control "
                         "characters (it is put into the API URL unescaped)")
    return name


def _check_toxicity(toxicity: object) -> float:
    if isinstance(toxicity, bool) or not isinstance(toxicity, int | float) or not math.isfinite(toxicity):
        raise ValueError(f"toxicity must be a number in [0, 1], got {toxicity!r}")
    if not 0.0 <= toxicity <= 1.0:
        raise ValueError(f"toxicity = {toxicity!r}: must be in [0, 1]")
    return float(toxicity)


def _check_attributes(attributes: dict[str, Any], allow_float: bool = False) -> dict[str, int | float]:
    """Ints; finite floats only where ``allow_float`` (the embedded ``corrupt.probability``)."""
    for key, value in attributes.items():
        number = (int, float) if allow_float else (int,)
        if isinstance(value, bool) or not isinstance(value, number) or not math.isfinite(value):
            raise ValueError(f"toxic attribute {key} = {value!r}: must be an int (Toxiproxy attributes are integers)")
    return dict(attributes)


def _check_timeout(what: str, seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise ValueError(f"{what} must be a positive number of seconds, got {seconds!r}")
    return float(seconds)


def _proxy_info(value: Any) -> ProxyInfo:
    """From a library ``Proxy`` or a JSON object."""
    get = value.get if isinstance(value, dict) else lambda key: getattr(value, key)
    name, listen, upstream, enabled = get("name"), get("listen"), get("upstream"), get("enabled")
    if not (isinstance(name, str) and isinstance(listen, str) and isinstance(upstream, str)
            and isinstance(enabled, bool)):
        raise ValueError(f"not a proxy: {value!r}")
    return ProxyInfo(name=name, listen=listen, upstream=upstream, enabled=enabled)


def _toxic_info(value: Any) -> ToxicInfo:
    """From a library ``Toxic`` or a JSON object."""
    get = value.get if isinstance(value, dict) else lambda key: getattr(value, key)
    name, type_, stream, toxicity = get("name"), get("type"), get("stream"), get("toxicity")
    attributes = get("attributes") or {}
    if not (isinstance(name, str) and isinstance(type_, str) and isinstance(stream, str)) \
            or not isinstance(attributes, dict) or isinstance(toxicity, bool) or not isinstance(toxicity, int | float):
        raise ValueError(f"not a toxic: {value!r}")
    attrs: dict[str, int | float] = {}
    for key, attr in attributes.items():
        if isinstance(attr, bool) or not isinstance(attr, int | float) or not math.isfinite(attr):
            raise ValueError(f"toxic {name!r} attribute {key} = {attr!r} is not a number")
        attrs[str(key)] = int(attr) if attr == int(attr) else float(attr)  # whole numbers as ints, as before
    return ToxicInfo(name=name, type=type_, stream=stream, toxicity=float(toxicity), attributes=attrs)


def _handle(name: str) -> Proxy:
    """A toxiproxy-python ``Proxy`` used only as a handle: its methods use nothing but ``name``."""
    return Proxy(name=name, upstream="", enabled=False, listen="")


