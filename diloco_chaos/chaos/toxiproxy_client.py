"""A safe client for any Toxiproxy v2 server, built on toxiproxy-python 0.1.1.

What: ``ToxiproxyClient(url, timeout_s)`` drives one Toxiproxy HTTP API (the Go
``toxiproxy-server`` or our ``diloco_chaos.chaos.toxiproxy_server.EmbeddedToxiproxy``): proxies
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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import requests
import toxiproxy.api
from toxiproxy import Toxiproxy
from toxiproxy.api import APIConsumer
from toxiproxy.exceptions import InvalidToxic, NotFound, ProxyExists

from diloco_chaos.chaos.toxiproxy_http import _RequestFailed, _TimeoutRequests
from diloco_chaos.chaos.toxiproxy_records import (
    EMBEDDED_ONLY_TOXICS,
    STREAMS,
    ProxyInfo,
    ToxicInfo,
    ToxiproxyError,
    _check_address,
    _check_attributes,
    _check_name,
    _check_timeout,
    _check_toxicity,
    _handle,
    _proxy_info,
    _toxic_info,
)

LOG = logging.getLogger(__name__)

__all__ = ["ProxyInfo", "ToxicInfo", "ToxiproxyClient", "ToxiproxyError"]

#: Longest single /version probe inside ``wait_ready`` (tries stay short so the deadline holds).
READY_TRY_S = 1.0
#: First and largest pause between ``wait_ready`` probes.
READY_BACKOFF_S = (0.02, 0.5)

_T = TypeVar("_T")
# toxiproxy-python's global APIConsumer.host/port and toxiproxy.api.requests: one user at a time.
_LIBRARY_LOCK = threading.Lock()



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
                  **attributes: float) -> ToxicInfo:
        """Add a toxic (e.g. ``type="latency", latency=100, jitter=10``); returns it as the server stored it."""
        _check_name("proxy", proxy)
        _check_name("toxic", name)
        if not isinstance(type, str) or not type:
            raise ValueError(f"toxic type must be a non-empty string, got {type!r}")
        if stream not in STREAMS:
            raise ValueError(f"stream = {stream!r}: must be 'upstream' or 'downstream'")
        level = _check_toxicity(toxicity)
        attrs = _check_attributes(attributes, allow_float=type in EMBEDDED_ONLY_TOXICS)
        subject = f"toxic {name!r} on proxy {proxy!r}"
        try:
            _, facade = self._library(
                "add_toxic", subject,
                lambda: _handle(proxy).add_toxic(name=name, type=type, stream=stream, toxicity=level, attributes=attrs),
            )
        except ToxiproxyError as exc:
            if type in EMBEDDED_ONLY_TOXICS and exc.status == 400 and "invalid toxic type" in str(exc):
                raise ToxiproxyError(
                    f"add_toxic {subject}: toxic type {type!r} is an extension of the embedded server "
                    f"(diloco_chaos.chaos.toxiproxy_server), embedded-only: "
                    f"this Toxiproxy server at {self.url} does not "
                    f"implement it ({exc})", exc.status) from exc
            raise
        # The library's add_toxic returns None; the server answered with the stored toxic in
        # that same response, which the facade kept (no second request, no race).
        info = self._parsed("add_toxic", subject, lambda r: _toxic_info(r.json()), facade.last)
        LOG.debug("toxiproxy.toxic_added url=%s proxy=%s toxic=%s type=%s stream=%s toxicity=%s attributes=%s",
                  self.url, proxy, name, type, stream, level, info.attributes)
        return info

    def update_toxic(self, proxy: str, name: str, toxicity: float | None = None, **attributes: float) -> ToxicInfo:
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
