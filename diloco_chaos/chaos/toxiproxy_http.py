"""HTTP side of ``diloco_chaos.chaos.toxiproxy_client``: the bounded ``requests`` facade and error texts.

Why separate: toxiproxy-python calls the ``requests`` module with no timeout and hides the
server's answer; the facade bound in its place during each library call adds the timeout,
keeps the last response and turns non-2xx answers into errors carrying status and body
(see the client module's docstring for the whole story).
"""

from __future__ import annotations

import logging
from typing import Any

import requests

LOG = logging.getLogger(__name__)

#: Most characters of a server's error text kept in a message.
MAX_ERROR_TEXT = 500


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


