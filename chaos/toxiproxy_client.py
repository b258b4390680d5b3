"""A safe client for any Toxiproxy v2 server, built on toxiproxy-python 0.1.1.

What: ``ToxiproxyClient(url, timeout_s)`` drives one Toxiproxy HTTP API (the Go
``toxiproxy-server`` or our ``chaos.toxiproxy_server.EmbeddedToxiproxy``): proxies
(create, list, show, enable/disable, delete), toxics (add, update, list, remove), reset,
version and a bounded ``wait_ready``.  Every answer is a frozen ``ProxyInfo``/``ToxicInfo``
and every failure is one ``ToxiproxyError`` whose message names the operation, the
proxy/toxic, the request (method and URL), and the HTTP status with the server's error
text, or "unreachable"/"timed out"; ``.status`` holds the HTTP status (``None`` when no
HTTP answer came).  Arguments are checked before anything is sent (``ValueError``).

Why a wrapper: the harness must be able to change links mid-run and must never hang or
act on the wrong server, and toxiproxy-python 0.1.1 has sharp edges in exactly those places:

* It sets no HTTP timeout: one stuck server hangs the caller forever.  For the duration
  of each library call we bind a small facade (``_TimeoutRequests``) in place of the
  ``requests`` module that ``toxiproxy.api`` calls (it looks the name up in its module
  globals on every call).  The facade adds our timeout (connect and each read, so one
  request takes about ``timeout_s`` at most unless the server trickles bytes), uses a
  fresh ``requests.Session`` per request with ``trust_env`` off (an ``HTTP_PROXY`` in the
  environment must not reroute a loopback control API, and no stale keep-alive
  connection survives a restarted server), and turns every non-2xx answer into an error
  that carries the status and body, before the library looks at it.
* It keeps the server address as process-global state (the class attributes
  ``APIConsumer.host``/``port``).  Each library call runs under one process-wide lock
  that sets host/port to this client's server and binds the facade, and restores the
  previous values afterwards; two clients for different servers (or threads) can
  therefore be used in any interleaving.  All toxiproxy-python use in this process
  should go through this module (code that sets ``APIConsumer`` itself is not locked).
  Only library calls take the lock; they are bounded by the timeout, so it cannot be
  held forever.
* Its ``Proxy.add_toxic``, ``enable`` and ``disable`` return ``None`` and throw the
  server's answer away.  The facade keeps the last response of the call, so we read the
  new toxic / proxy state from that very answer: no second request, no race with
  another writer.
* It cannot update a toxic: ``update_toxic`` is the one call that goes to the HTTP API
  directly (same facade, same timeout and error handling, no lock needed).
* It turns a server 500 into ``KeyError`` (a 500 passes its status check, then it reads
  ``name`` from the ``{"error", "status"}`` body), and 400/404/409 into bare exceptions
  holding only the body.  The facade raises on any status >= 400 first, so our errors
  always carry the real status and error text.  The library's own ``ProxyExists``
  (``create`` checks the proxy list before posting) is mapped to status 409.
* ``Toxiproxy.version`` first probes the port with a socket that has no timeout; we call
  ``APIConsumer.get("/version")`` instead (and accept the JSON and the old plain-text
  forms of the answer).

Names are not URL-quoted by the library, so proxy and toxic names that would change the
URL (``/ ? # %``, whitespace, control characters) are rejected up front.  A ``listen``
address must name its host: Toxiproxy binds *all* interfaces when it is omitted (``":0"``),
which is never what a test harness wants by accident.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
import toxiproxy.api
from toxiproxy import Proxy, Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

LOG = logging.getLogger(__name__)

__all__ = ["ProxyInfo", "ToxicInfo", "ToxiproxyClient", "ToxiproxyError"]

STREAMS = ("upstream", "downstream")
#: Longest single /version probe inside ``wait_ready`` (tries stay short so the deadline holds).
READY_TRY_S = 1.0
#: First and largest pause between ``wait_ready`` probes.
READY_BACKOFF_S = (0.02, 0.5)
#: Most characters of a server's error text kept in a message.
MAX_ERROR_TEXT = 500

_T = TypeVar("_T")
# toxiproxy-python's global APIConsumer.host/port and toxiproxy.api.requests: one user at a time.
_LIBRARY_LOCK = threading.Lock()
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
    attributes: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# HTTP: the requests facade (used by the library calls and by the direct calls alike)
# --------------------------------------------------------------------------------------


class _RequestFailed(Exception):
    """Raised inside the facade; turned into a ToxiproxyError that names the operation."""

    def __init__(self, method: str, url: str, what: str, status: int | None) -> None:
        super().__init__(f"{method} {url} -> {what}")
        self.method = method
        self.url = url
        self.what = what
        self.status = status


class _TimeoutRequests:
    """Stands in for the ``requests`` module inside ``toxiproxy.api`` (get/post/delete).

    Adds the timeout, skips environment proxies, raises ``_RequestFailed`` for transport
    errors and for every status >= 400, and remembers the last response for callers whose
    library method discards it.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last: requests.Response | None = None

    def request(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        kwargs["timeout"] = self.timeout_s
        try:
            with requests.Session() as session:
                session.trust_env = False
                response = session.request(method, url, **kwargs)
        except requests.Timeout as exc:
            raise _RequestFailed(method, url, f"timed out after {self.timeout_s:g}s", None) from exc
        except requests.ConnectionError as exc:
            raise _RequestFailed(method, url, f"unreachable ({_root_cause(exc)})", None) from exc
        except requests.RequestException as exc:
            raise _RequestFailed(method, url, f"request failed ({_root_cause(exc)})", None) from exc
        self.last = response
        if response.status_code >= 400:
            what = f"HTTP {response.status_code}: {_error_text(response)}"
            raise _RequestFailed(method, url, what, response.status_code)
        return response

    def get(self, url: str, params: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("GET", url, params=params, **kwargs)

    def post(self, url: str, data: Any = None, json: Any = None, **kwargs: Any) -> requests.Response:
        return self.request("POST", url, data=data, json=json, **kwargs)

    def delete(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", url, **kwargs)


def _error_text(response: requests.Response) -> str:
    """The server's error text: Toxiproxy's ``{"error": ...}`` body, else the body, else the reason."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        text = body["error"]
    else:
        text = response.text.strip() or (response.reason or "")
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "..."


def _root_cause(exc: BaseException) -> str:
    """The innermost OS error behind a requests/urllib3 exception chain, e.g. 'Connection refused'."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    found: OSError | None = None
    while todo:
        cur = todo.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.strerror:
            found = cur
        nested = [getattr(cur, "reason", None), cur.__cause__, cur.__context__, *cur.args[:1]]
        todo.extend(e for e in nested if isinstance(e, BaseException))
    if found is not None:
        return f"[Errno {found.errno}] {found.strerror}" if found.errno is not None else str(found.strerror)
    return f"{type(exc).__name__}: {exc}"


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


def _check_attributes(attributes: dict[str, Any]) -> dict[str, int]:
    for key, value in attributes.items():
        if isinstance(value, bool) or not isinstance(value, int):
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
    attrs: dict[str, int] = {}
    for key, attr in attributes.items():
        if isinstance(attr, bool) or not isinstance(attr, int | float) or attr != int(attr):
            raise ValueError(f"toxic {name!r} attribute {key} = {attr!r} is not an integer")
        attrs[str(key)] = int(attr)
    return ToxicInfo(name=name, type=type_, stream=stream, toxicity=float(toxicity), attributes=attrs)


def _handle(name: str) -> Proxy:
    """A toxiproxy-python ``Proxy`` used only as a handle: its methods use nothing but ``name``."""
    return Proxy(name=name, upstream="", enabled=False, listen="")


# --------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------


class ToxiproxyClient:
    """One Toxiproxy v2 server's HTTP API, with a timeout on every request.

    Thread-safe; any number of clients (for the same or different servers) may be used
    from any threads.  Every method raises ``ToxiproxyError`` when the call fails and
    ``ValueError`` for bad arguments (nothing is sent then).
    """

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"url = {url!r}: expected 'http://HOST:PORT' (toxiproxy-python speaks plain http)")
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None or parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError(f"url = {url!r}: expected exactly 'http://HOST:PORT', e.g. 'http://127.0.0.1:8474'")
        host = parts.hostname
        self._api_host = f"[{host}]" if ":" in host else host  # APIConsumer formats "http://%s:%s"
        self._api_port = port
        self.url = f"http://{self._api_host}:{port}"
        self.timeout_s = _check_timeout("timeout_s", timeout_s)

    def __repr__(self) -> str:
        return f"ToxiproxyClient({self.url!r}, timeout_s={self.timeout_s:g})"

    # ---- server ----------------------------------------------------------------------

    def version(self) -> str:
        """The server's version, e.g. '2.12.0'."""
        return self._version(self.timeout_s)

    def wait_ready(self, timeout_s: float) -> str:
        """Poll GET /version with short tries until the server answers; return its version.

        Raises ``ToxiproxyError`` (with the last try's error) once ``timeout_s`` has passed.
        """
        budget = _check_timeout("wait_ready timeout_s", timeout_s)
        deadline = time.monotonic() + budget
        pause = threading.Event()  # never set: wait() is a bounded, interruptible-by-design pause
        backoff, max_backoff = READY_BACKOFF_S
        while True:
            remaining = deadline - time.monotonic()
            try:
                return self._version(max(0.01, min(self.timeout_s, READY_TRY_S, remaining)))
            except ToxiproxyError as exc:
                last = exc
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ToxiproxyError(f"wait_ready: Toxiproxy at {self.url} did not answer GET /version within "
                                     f"{budget:g}s; last try: {last}", last.status) from None
            pause.wait(min(backoff, remaining))
            backoff = min(backoff * 2, max_backoff)

    def reset(self) -> None:
        """POST /reset: enable every proxy and remove every toxic (on the whole server)."""
        self._library("reset", "", lambda: Toxiproxy().reset())
        LOG.debug("toxiproxy.reset url=%s", self.url)

    # ---- proxies ---------------------------------------------------------------------

    def create_proxy(self, name: str, upstream: str, listen: str = "127.0.0.1:0", enabled: bool = True) -> ProxyInfo:
        """Create a proxy; the answer's ``listen`` is the bound address (port included) when enabled."""
        _check_name("proxy", name)
        _check_address("upstream", upstream, port_zero_ok=False)
        _check_address("listen", listen, port_zero_ok=True)
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be a bool, got {enabled!r}")
        created, _ = self._library(
            "create_proxy", f"proxy {name!r}",
            lambda: Toxiproxy().create(upstream=upstream, name=name, listen=listen, enabled=enabled),
        )
        info = self._parsed("create_proxy", f"proxy {name!r}", _proxy_info, created)
        LOG.debug("toxiproxy.proxy_created url=%s name=%s listen=%s upstream=%s", self.url, name, info.listen,
                  upstream)
        return info

    def proxies(self) -> dict[str, ProxyInfo]:
        """Every proxy on the server, by name."""
        found, _ = self._library("proxies", "", lambda: Toxiproxy().proxies())
        return {name: self._parsed("proxies", f"proxy {name!r}", _proxy_info, p) for name, p in found.items()}

    def get_proxy(self, name: str) -> ProxyInfo:
        """One proxy; ``ToxiproxyError(status=404)`` if there is none of that name."""
        _check_name("proxy", name)
        found, _ = self._library("get_proxy", f"proxy {name!r}", lambda: Toxiproxy().get_proxy(name))
        if found is None:  # the library lists all proxies and returns None for a missing one
            raise ToxiproxyError(f"get_proxy proxy {name!r} failed: GET {self.url}/proxies -> not in the "
                                 "server's proxy list (status 404: proxy not found)", 404)
        return self._parsed("get_proxy", f"proxy {name!r}", _proxy_info, found)

    def delete_proxy(self, name: str, missing_ok: bool = False) -> None:
        """Delete a proxy (its connections are closed); a missing one is fine with ``missing_ok``."""
        _check_name("proxy", name)
        try:
            self._library("delete_proxy", f"proxy {name!r}", lambda: _handle(name).destroy())
        except ToxiproxyError as exc:
            if not (missing_ok and exc.status == 404):
                raise
        LOG.debug("toxiproxy.proxy_deleted url=%s name=%s", self.url, name)

    def set_enabled(self, name: str, enabled: bool) -> ProxyInfo:
        """Enable (listen again) or disable (stop listening, drop live connections) a proxy."""
        _check_name("proxy", name)
        if not isinstance(enabled, bool):
            raise ValueError(f"enabled must be a bool, got {enabled!r}")
        handle = _handle(name)
        _, facade = self._library("set_enabled", f"proxy {name!r}", handle.enable if enabled else handle.disable)
        # The library's enable()/disable() discard the server's answer (the updated proxy);
        # read it from the facade's copy of that same response instead of a second GET.
        info = self._parsed("set_enabled", f"proxy {name!r}", lambda r: _proxy_info(r.json()), facade.last)
        LOG.debug("toxiproxy.proxy_enabled url=%s name=%s enabled=%s", self.url, name, info.enabled)
        return info

    # ---- toxics ----------------------------------------------------------------------

    def add_toxic(self, proxy: str, name: str, type: str, stream: str = "downstream", toxicity: float = 1.0,
                  **attributes: int) -> ToxicInfo:
        """Add a toxic (e.g. ``type="latency", latency=100, jitter=10``); returns it as the server stored it."""
        _check_name("proxy", proxy)
        _check_name("toxic", name)
        if not isinstance(type, str) or not type:
            raise ValueError(f"toxic type must be a non-empty string, got {type!r}")
        if stream not in STREAMS:
            raise ValueError(f"stream = {stream!r}: must be 'upstream' or 'downstream'")
        level = _check_toxicity(toxicity)
        attrs = _check_attributes(attributes)
        subject = f"toxic {name!r} on proxy {proxy!r}"
        _, facade = self._library(
            "add_toxic", subject,
            lambda: _handle(proxy).add_toxic(name=name, type=type, stream=stream, toxicity=level, attributes=attrs),
        )
        # The library's add_toxic returns None; the server answered with the stored toxic in
        # that same response, which the facade kept (no second request, no race).
        info = self._parsed("add_toxic", subject, lambda r: _toxic_info(r.json()), facade.last)
        LOG.debug("toxiproxy.toxic_added url=%s proxy=%s toxic=%s type=%s stream=%s toxicity=%s attributes=%s",
                  self.url, proxy, name, type, stream, level, info.attributes)
        return info

    def update_toxic(self, proxy: str, name: str, toxicity: float | None = None, **attributes: int) -> ToxicInfo:
        """Change a toxic's toxicity and/or some attributes (the others keep their values); live links follow."""
        _check_name("proxy", proxy)
        _check_name("toxic", name)
        body: dict[str, Any] = {"attributes": _check_attributes(attributes)}
        if toxicity is not None:
            body["toxicity"] = _check_toxicity(toxicity)
        subject = f"toxic {name!r} on proxy {proxy!r}"
        # Direct HTTP: toxiproxy-python 0.1.1 has no way to update a toxic.  Same facade
        # (timeout, error mapping); no library state is involved, so no lock.
        path = f"/proxies/{quote(proxy, safe='')}/toxics/{quote(name, safe='')}"
        facade = _TimeoutRequests(self.timeout_s)
        try:
            response = facade.request("POST", self.url + path, json=body)
        except _RequestFailed as exc:
            raise self._failed("update_toxic", subject, exc) from exc
        info = self._parsed("update_toxic", subject, lambda r: _toxic_info(r.json()), response)
        LOG.debug("toxiproxy.toxic_updated url=%s proxy=%s toxic=%s toxicity=%s attributes=%s",
                  self.url, proxy, name, info.toxicity, info.attributes)
        return info

    def remove_toxic(self, proxy: str, name: str, missing_ok: bool = False) -> None:
        """Remove a toxic; with ``missing_ok`` a missing toxic (or proxy) is fine."""
        _check_name("proxy", proxy)
        _check_name("toxic", name)
        try:
            self._library("remove_toxic", f"toxic {name!r} on proxy {proxy!r}",
                          lambda: _handle(proxy).destroy_toxic(name))
        except ToxiproxyError as exc:
            if not (missing_ok and exc.status == 404):
                raise
        LOG.debug("toxiproxy.toxic_removed url=%s proxy=%s toxic=%s", self.url, proxy, name)

    def toxics(self, proxy: str) -> dict[str, ToxicInfo]:
        """Every toxic of a proxy, by name."""
        _check_name("proxy", proxy)
        found, _ = self._library("toxics", f"proxy {proxy!r}", lambda: _handle(proxy).toxics())
        return {name: self._parsed("toxics", f"toxic {name!r} on proxy {proxy!r}", _toxic_info, t)
                for name, t in found.items()}

    # ---- internals -------------------------------------------------------------------

    def _version(self, timeout_s: float) -> str:
        # APIConsumer.get rather than Toxiproxy.version(): the latter first probes the port
        # with a socket that has no timeout, and returns the raw body.
        _, facade = self._library("version", "", lambda: APIConsumer.get("/version"), timeout_s)

        def parse(response: requests.Response) -> str:
            try:
                body = response.json()
            except ValueError:  # servers before 2.6 answer with the bare version text
                body = response.text.strip()
            version = body.get("version") if isinstance(body, dict) else body
            if not isinstance(version, str) or not version:
                raise ValueError(f"no version in {response.text[:200]!r}")
            return version

        return self._parsed("version", "", parse, facade.last)

    @contextmanager
    def _bound(self, timeout_s: float) -> Iterator[_TimeoutRequests]:
        """Point toxiproxy-python's global state at this server, with the timeout facade, for one call."""
        facade = _TimeoutRequests(timeout_s)
        with _LIBRARY_LOCK:
            saved = (APIConsumer.host, APIConsumer.port, toxiproxy.api.requests)
            APIConsumer.host, APIConsumer.port = self._api_host, self._api_port
            toxiproxy.api.requests = facade  # type: ignore[assignment]
            try:
                yield facade
            finally:
                APIConsumer.host, APIConsumer.port, toxiproxy.api.requests = saved

    def _library(self, op: str, subject: str, call: Callable[[], _T],
                 timeout_s: float | None = None) -> tuple[_T, _TimeoutRequests]:
        """Run one toxiproxy-python call against this server; map every failure to ToxiproxyError."""
        with self._bound(self.timeout_s if timeout_s is None else timeout_s) as facade:
            try:
                return call(), facade
            except _RequestFailed as exc:
                raise self._failed(op, subject, exc) from exc
            except (ProxyExists, NotFound, InvalidToxic) as exc:
                # Raised by the library without an HTTP error (create() checks the proxy list
                # first); HTTP errors never reach it because the facade raises first.
                status = {ProxyExists: 409, NotFound: 404, InvalidToxic: 400}[type(exc)]
                text = exc.args[0] if exc.args else type(exc).__name__
                text = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
                raise ToxiproxyError(f"{self._prefix(op, subject)} failed: {self.url} -> HTTP {status} "
                                     f"(reported by toxiproxy-python): {text}", status) from exc
            except (KeyError, ValueError, TypeError, AttributeError) as exc:
                raise self._malformed(op, subject, facade.last, exc) from exc

    def _parsed(self, op: str, subject: str, parse: Callable[[Any], _T], value: Any) -> _T:
        """``parse(value)``, with a malformed or missing server answer reported as ToxiproxyError."""
        try:
            if value is None:
                raise ValueError("no response was recorded")
            return parse(value)
        except (KeyError, ValueError, TypeError, AttributeError) as exc:
            raise self._malformed(op, subject, value if isinstance(value, requests.Response) else None,
                                  exc) from exc

    @staticmethod
    def _prefix(op: str, subject: str) -> str:
        return f"{op} {subject}" if subject else op

    def _failed(self, op: str, subject: str, exc: _RequestFailed) -> ToxiproxyError:
        return ToxiproxyError(f"{self._prefix(op, subject)} failed: {exc}", exc.status)

    def _malformed(self, op: str, subject: str, response: requests.Response | None,
                   exc: BaseException) -> ToxiproxyError:
        if response is None:
            where, status = self.url, None
        else:
            where, status = f"{response.request.method} {response.url} -> HTTP {response.status_code}", \
                response.status_code
        return ToxiproxyError(f"{self._prefix(op, subject)} failed: {where}: unexpected answer from the server "
                              f"({type(exc).__name__}: {exc})", status)
