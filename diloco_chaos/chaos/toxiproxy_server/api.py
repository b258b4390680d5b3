"""The Toxiproxy v2 HTTP API of the embedded server: routing and JSON validation only.

Handlers parse and validate bodies with Go ``encoding/json`` semantics and delegate every
change to the proxies (``proxy.py``) and their links (``link.py``).
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable
from typing import Any

from .common import (
    _DIRECTIONS,
    VERSION,
    ApiError,
    _AlreadyStarted,
    _as_object,
    _bad_body,
    _canonical_listen,
    _decode_json,
    _err_proxy_not_found,
    _err_toxic_not_found,
    _get_bool,
    _get_float32,
    _get_str,
    _json_kind,
    _missing,
    _type_error,
)
from .http import _HttpServer, _json_response, _Response
from .link import _Toxic
from .proxy import _Proxy
from .toxic import TOXICS, default_attributes, load_toxics, parse_attributes

load_toxics()

LOG = logging.getLogger(__name__)

class _Core(_HttpServer):
    """Proxy collection plus the HTTP API; everything runs on one event loop."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = random.Random(seed)
        self.proxies: dict[str, _Proxy] = {}
        self._seq = itertools.count(1)

    async def stop_proxies(self) -> None:
        for proxy in list(self.proxies.values()):
            await proxy.stop()
        self.proxies.clear()

    def _route(self, seg: list[str]) -> tuple[dict[str, Callable[..., Any]], tuple[str, ...]] | None:
        if any(not part for part in seg):
            return None
        if seg == ["version"]:
            return {"GET": self._version}, ()
        if seg == ["reset"]:
            return {"POST": self._reset}, ()
        if seg == ["populate"]:
            return {"POST": self._populate}, ()
        if seg == ["proxies"]:
            return {"GET": self._proxy_index, "POST": self._proxy_create}, ()
        if len(seg) >= 2 and seg[0] == "proxies":
            if len(seg) == 2:
                update: Callable[..., Any] = self._proxy_update
                methods: dict[str, Callable[..., Any]] = {
                    "GET": self._proxy_show,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self._proxy_delete,
                }
                return methods, (seg[1],)
            if len(seg) == 3 and seg[2] == "toxics":
                return {"GET": self._toxic_index, "POST": self._toxic_create}, (seg[1],)
            if len(seg) == 4 and seg[2] == "toxics":
                update = self._toxic_update
                methods = {  # same type as above
                    "GET": self._toxic_show,
                    "POST": update,
                    "PATCH": update,
                    "DELETE": self._toxic_delete,
                }
                return methods, (seg[1], seg[3])
        return None

    def _get_proxy(self, name: str) -> _Proxy:
        proxy = self.proxies.get(name)
        if proxy is None:
            raise _err_proxy_not_found()
        return proxy

    # ---- handlers -------------------------------------------------------------------------

    async def _version(self, _body: bytes) -> _Response:
        return _Response(200, f'{{"version": "{VERSION}"}}\n'.encode(), "application/json;charset=utf-8")

    async def _reset(self, _body: bytes) -> _Response:
        for proxy in list(self.proxies.values()):
            try:
                await proxy.start()
            except _AlreadyStarted:
                pass
            for toxic in list(proxy.toxics):
                proxy.remove_toxic(toxic)
        LOG.info("api.reset proxies=%d", len(self.proxies))
        return _Response(204, b"", None)

    async def _proxy_index(self, _body: bytes) -> _Response:
        return _json_response({name: self.proxies[name].to_json() for name in sorted(self.proxies)})

    async def _proxy_create(self, body: bytes) -> _Response:
        obj = _as_object(_decode_json(body), "toxiproxy.Proxy") or {}
        name = _get_str(obj, "name", "", "Proxy")
        listen = _get_str(obj, "listen", "", "Proxy")
        upstream = _get_str(obj, "upstream", "", "Proxy")
        enabled = _get_bool(obj, "enabled", True, "Proxy")
        if not name:
            raise _missing("name")
        if not upstream:
            raise _missing("upstream")
        if name in self.proxies:
            raise ApiError("proxy already exists", 409)
        proxy = _Proxy(self, name, listen, upstream)
        if enabled:
            await proxy.start()
        self.proxies[name] = proxy
        return _json_response(proxy.to_json(), 201)

    async def _populate(self, body: bytes) -> _Response:
        proxies: list[_Proxy] = []
        error: ApiError | None = None
        try:
            proxies = await self._populate_proxies(body, proxies)
        except ApiError as err:
            error = err
        payload: dict[str, Any] = error.to_json() if error is not None else {}
        payload["proxies"] = [proxy.to_json() for proxy in proxies] or None
        return _json_response(payload, error.status if error is not None else 201)

    async def _populate_proxies(self, body: bytes, done: list[_Proxy]) -> list[_Proxy]:
        value = _decode_json(body)
        if value is None:
            value = []
        if not isinstance(value, list):
            kind = _json_kind(value)
            raise _bad_body(f"json: cannot unmarshal {kind} into Go value of type []toxiproxy.Proxy")
        specs: list[tuple[str, str, str, bool]] = []
        for item in value:
            obj = _as_object(item, "toxiproxy.Proxy") or {}
            name = _get_str(obj, "name", "", "")
            listen = _get_str(obj, "listen", "", "")
            upstream = _get_str(obj, "upstream", "", "")
            enabled = _get_bool(obj, "enabled", True, "")
            specs.append((name, listen, upstream, enabled))
        for index, (name, _listen, upstream, _enabled) in enumerate(specs, start=1):
            if not name:
                raise _missing(f"name at proxy {index}")
            if not upstream:
                raise _missing(f"upstream at proxy {index}")
        for name, listen, upstream, enabled in specs:
            existing = self.proxies.get(name)
            if existing is not None:
                try:
                    canonical = await _canonical_listen(listen)
                except (OSError, ValueError) as exc:
                    raise ApiError(str(exc), 500) from None
                if canonical == existing.listen and upstream == existing.upstream:
                    done.append(existing)
                    continue
                # Like Toxiproxy's AddOrReplace: the old proxy is stopped first (it may hold
                # the port) and stays registered, stopped, if the replacement fails to start.
                await existing.stop()
            proxy = _Proxy(self, name, listen, upstream)
            if enabled:
                await proxy.start()
            self.proxies[name] = proxy
            done.append(proxy)
        LOG.info("api.populate proxies=%d", len(done))
        return done

    async def _proxy_show(self, _body: bytes, name: str) -> _Response:
        return _json_response(self._get_proxy(name).to_json())

    async def _proxy_update(self, body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        obj = _as_object(_decode_json(body), "toxiproxy.Proxy") or {}
        listen = _get_str(obj, "listen", proxy.listen, "Proxy")
        upstream = _get_str(obj, "upstream", proxy.upstream, "Proxy")
        enabled = _get_bool(obj, "enabled", proxy.enabled, "Proxy")
        try:
            canonical = await _canonical_listen(listen)
        except (OSError, ValueError) as exc:
            raise ApiError(str(exc), 500) from None
        if canonical != proxy.listen or upstream != proxy.upstream:
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
        if enabled != proxy.enabled:
            if enabled:
                await proxy.start()
            else:
                await proxy.stop()
        return _json_response(proxy.to_json())

    async def _proxy_delete(self, _body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        await proxy.stop()
        del self.proxies[name]
        LOG.info("proxy.deleted name=%s", name)
        return _Response(204, b"", None)

    async def _toxic_index(self, _body: bytes, name: str) -> _Response:
        return _json_response(self._get_proxy(name).toxics_json())

    async def _toxic_create(self, body: bytes, name: str) -> _Response:
        proxy = self._get_proxy(name)
        obj = _as_object(_decode_json(body), "toxics.ToxicWrapper") or {}
        toxic_name = _get_str(obj, "name", "", "ToxicWrapper")
        toxic_type = _get_str(obj, "type", "", "ToxicWrapper")
        stream = _get_str(obj, "stream", "downstream", "ToxicWrapper")
        toxicity = _get_float32(obj, "toxicity", 1.0, "ToxicWrapper")
        raw_attrs = obj.get("attributes")
        if raw_attrs is not None and not isinstance(raw_attrs, dict):
            raise _type_error(raw_attrs, "ToxicWrapper.attributes", "toxics.Toxic")
        direction = stream.lower()
        if direction not in _DIRECTIONS:
            raise ApiError("stream was invalid, can be either upstream or downstream", 400)
        if not toxic_name:
            toxic_name = f"{toxic_type}_{stream}"
        if toxic_type not in TOXICS:
            raise ApiError("invalid toxic type", 400)
        if proxy.find_toxic(toxic_name) is not None:
            raise ApiError("toxic already exists", 409)
        attributes = default_attributes(toxic_type)
        attributes.update(parse_attributes(toxic_type, raw_attrs, attributes))
        toxic = _Toxic(toxic_name, toxic_type, stream, direction, toxicity, attributes, next(self._seq))
        proxy.add_toxic(toxic)
        LOG.info(
            "toxic.added proxy=%s toxic=%s type=%s stream=%s toxicity=%s attributes=%s",
            proxy.name,
            toxic.name,
            toxic.type,
            toxic.stream,
            toxic.toxicity,
            toxic.attributes,
        )
        return _json_response(toxic.to_json())

    async def _toxic_show(self, _body: bytes, name: str, toxic_name: str) -> _Response:
        toxic = self._get_proxy(name).find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        return _json_response(toxic.to_json())

    async def _toxic_update(self, body: bytes, name: str, toxic_name: str) -> _Response:
        proxy = self._get_proxy(name)
        toxic = proxy.find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        obj = _as_object(_decode_json(body), "struct { Attributes interface {}; Toxicity float32 }") or {}
        raw_attrs = obj.get("attributes")
        if raw_attrs is not None and not isinstance(raw_attrs, dict):
            raise _type_error(raw_attrs, ".attributes", "toxics.Toxic")
        toxicity = _get_float32(obj, "toxicity", toxic.toxicity, "")
        attributes = parse_attributes(toxic.type, raw_attrs, toxic.attributes)
        toxic.attributes.update(attributes)
        toxic.toxicity = toxicity
        proxy.update_toxic(toxic)
        LOG.info("toxic.updated proxy=%s toxic=%s attributes=%s", proxy.name, toxic.name, toxic.attributes)
        return _json_response(toxic.to_json())

    async def _toxic_delete(self, _body: bytes, name: str, toxic_name: str) -> _Response:
        proxy = self._get_proxy(name)
        toxic = proxy.find_toxic(toxic_name)
        if toxic is None:
            raise _err_toxic_not_found()
        proxy.remove_toxic(toxic)
        LOG.info("toxic.removed proxy=%s toxic=%s", proxy.name, toxic.name)
        return _Response(204, b"", None)
