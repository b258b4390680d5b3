"""Constants, API errors, Go-compatible JSON decoding/encoding and address parsing for the
embedded Toxiproxy server.

Why separate: every other module of the package (routing, proxies, links) needs the same
Go ``encoding/json`` and ``net`` semantics, so clients written for the real server observe the
same error texts and addresses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import struct
from typing import Any

LOG = logging.getLogger(__name__)


#: Version reported by ``GET /version`` (the Toxiproxy release whose API this mirrors).
VERSION = "2.12.0"
#: Largest chunk read from a socket in one go.
CHUNK_SIZE = 64 * 1024
#: Bytes a link may buffer between its reader and its toxic chain before reading pauses.
LINK_BUFFER_BYTES = 4 * 1024 * 1024
#: Seconds allowed for dialing a proxy's upstream before the client is dropped.
UPSTREAM_CONNECT_TIMEOUT_S = 10.0
#: Largest HTTP request body the API accepts.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Seconds an API connection may sit idle between requests (Go's server uses 60 s).
API_IDLE_TIMEOUT_S = 60.0
#: Seconds allowed to read one request's headers and body (Go's server uses 15 s).
API_READ_TIMEOUT_S = 15.0

_DIRECTIONS = ("upstream", "downstream")
_INT_LIMITS = {"int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1)}

_HTTP_REASONS = {
    100: "Continue",
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Request Entity Too Large",
    500: "Internal Server Error",
}

# Outcomes of an interruptible sleep inside a link.
_DONE, _REMOVED, _CLOSED = 0, 1, 2


# --------------------------------------------------------------------------------------
# Errors and JSON helpers (Go ``encoding/json`` semantics where clients can observe them)
# --------------------------------------------------------------------------------------


class ApiError(Exception):
    """An error with an HTTP status, rendered as Toxiproxy's ``{"error", "status"}`` body."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def to_json(self) -> dict[str, Any]:
        return {"error": self.message, "status": self.status}


def _bad_body(detail: str) -> ApiError:
    return ApiError(f"bad request body: {detail}", 400)


def _missing(field_name: str) -> ApiError:
    return ApiError(f"missing required field: {field_name}", 400)


def _err_proxy_not_found() -> ApiError:
    return ApiError("proxy not found", 404)


def _err_toxic_not_found() -> ApiError:
    return ApiError("toxic not found", 404)


class _AlreadyStarted(Exception):
    """Raised by ``_Proxy.start`` when the proxy is already listening."""


def _dumps(value: Any) -> bytes:
    """Compact JSON with Go's HTML-safe escaping of ``<``, ``>`` and ``&``."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for raw, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, esc)
    return text.encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid character '{name[0]}' looking for beginning of value")


def _decode_json(body: bytes) -> Any:
    """Decode the first JSON value of ``body`` like Go's ``json.Decoder.Decode``."""
    text = body.decode("utf-8", errors="replace").lstrip(" \t\r\n")
    if not text:
        raise _bad_body("EOF")
    try:
        value, _ = json.JSONDecoder(parse_constant=_reject_constant).raw_decode(text)
    except json.JSONDecodeError as exc:
        if exc.pos >= len(text):
            raise _bad_body("unexpected EOF") from None
        raise _bad_body(f"invalid character '{text[exc.pos]}' {exc.msg[0].lower()}{exc.msg[1:]}") from None
    except ValueError as exc:
        raise _bad_body(str(exc)) from None
    return value


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_error(value: Any, where: str, gotype: str) -> ApiError:
    kind = _json_kind(value)
    return _bad_body(f"json: cannot unmarshal {kind} into Go struct field {where} of type {gotype}")


def _fold_keys(obj: dict[str, Any]) -> dict[str, Any]:
    """Go matches JSON keys to struct fields case-insensitively; the last occurrence wins."""
    return {key.lower(): value for key, value in obj.items()}


def _as_object(value: Any, gotype: str) -> dict[str, Any] | None:
    """Return ``value`` as a key-folded object, ``None`` for JSON null, or raise a 400."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _bad_body(f"json: cannot unmarshal {_json_kind(value)} into Go value of type {gotype}")
    return _fold_keys(value)


def _get_typed(obj: dict[str, Any], key: str, default: Any, where: str, kind: type, go_name: str) -> Any:
    """obj[key] if it is a `kind` (Go's `go_name` in the error), the default if absent or null."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise _type_error(value, f"{where}.{key}", go_name)
    return value


def _get_str(obj: dict[str, Any], key: str, default: str, where: str) -> str:
    return str(_get_typed(obj, key, default, where, str, "string"))


def _get_bool(obj: dict[str, Any], key: str, default: bool, where: str) -> bool:
    return bool(_get_typed(obj, key, default, where, bool, "bool"))


def _get_float32(obj: dict[str, Any], key: str, default: float, where: str) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error(value, f"{where}.{key}", "float32")
    return struct.unpack("f", struct.pack("f", float(value)))[0]


def _get_int(obj: dict[str, Any], key: str, default: int, where: str, gotype: str) -> int:
    value = obj.get(key)
    if value is None:
        return default
    low, high = _INT_LIMITS[gotype]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            target = f"Go struct field {where}.{key} of type {gotype}"
            raise _bad_body(f"json: cannot unmarshal number {value} into {target}")
        raise _type_error(value, f"{where}.{key}", gotype)
    return value


def _float32_json(value: float) -> int | float:
    """Render a float32 the way Go's ``json.Marshal`` does (shortest round-trip form)."""
    packed = struct.pack("f", value)
    for digits in range(1, 10):
        candidate = float(f"{value:.{digits}g}")
        if struct.pack("f", candidate) == packed:
            value = candidate
            break
    return int(value) if value.is_integer() else value


# --------------------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------------------


def _split_hostport(address: str) -> tuple[str, int]:
    """Split ``host:port`` / ``[v6]:port`` / ``:port`` like Go's ``net.SplitHostPort``."""
    if not address:
        return "", 0  # Go's net.Listen("tcp", ""): all interfaces, any port
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or not address[end + 1 :].startswith(":"):
            raise ValueError(f"address {address}: missing port in address")
        host, port_text = address[1:end], address[end + 2 :]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address}: missing port in address")
        if ":" in host:
            raise ValueError(f"address {address}: too many colons in address")
    if not port_text:
        return host, 0  # "127.0.0.1:" means an ephemeral port, as in Go
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, int(port_text)


def _format_sockname(sockname: tuple[Any, ...]) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _resolve_listen(address: str) -> tuple[socket.AddressFamily, tuple[Any, ...]] | None:
    """Resolve a listen address to (family, sockaddr); ``None`` means "all interfaces"."""
    host, port = _split_hostport(address)
    if not host:
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(f"lookup {host}: no such host") from None
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # Go prefers IPv4
        return infos[0][0], infos[0][4]
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return family, (str(ip), port)


async def _canonical_listen(address: str) -> str:
    """What Go's ``net.ResolveTCPAddr(address).String()`` gives (used to detect changes)."""
    resolved = await _resolve_listen(address)
    if resolved is None:
        return f":{_split_hostport(address)[1]}"
    return _format_sockname(resolved[1])


async def _bind(address: str) -> socket.socket:
    """Create a listening socket for ``address`` (port 0 picks a free port)."""
    resolved = await _resolve_listen(address)
    if resolved is None:
        port = _split_hostport(address)[1]
        if socket.has_dualstack_ipv6():
            return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("0.0.0.0", port))
    family, sockaddr = resolved
    return socket.create_server(sockaddr, family=family)

