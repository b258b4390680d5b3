"""Embedded, Toxiproxy-compatible TCP fault-injection server (asyncio, stdlib only).

What: an in-process re-implementation of Shopify Toxiproxy's v2 HTTP API
(``/version``, ``/proxies``, ``/populate``, ``/proxies/{p}``, ``/proxies/{p}/toxics``,
``/proxies/{p}/toxics/{t}``, ``/reset``) and of its TCP data path with the ``latency``,
``bandwidth``, ``timeout``, ``reset_peer``, ``slow_close``, ``slicer``, ``limit_data`` (and
``noop``) toxics.  Clients written for the real server (toxiproxy-python, toxiproxy-cli) talk
to it unchanged: same routes, methods, JSON shapes, status codes and error bodies.

Why: the chaos harness puts one proxy on every learner -> synchronizer link and must run
where the Go ``toxiproxy-server`` binary is not installed.  Embedding the server also lets a
test own it (start/stop per test) and makes every random decision (jitter, toxicity, slicer
sizes) come from one seeded ``random.Random`` so a failing chaos run can be replayed.

Design: every proxied connection has two *links* (upstream = client -> server, downstream =
server -> client).  A link is a reader task that reads chunks of up to ``CHUNK_SIZE`` bytes
and time-stamps them into a bounded buffer, plus a processor task that pushes each chunk
through the link's current toxic chain (ordered by creation, like Toxiproxy's chain) and
writes it out.  Toxics act per chunk (never per byte).  Adding, updating or removing a toxic
re-links live connections immediately: a toxic sleeping on a chunk is interrupted and the
chunk continues down the chain, as Toxiproxy's ``InterruptToxic`` does.  All state lives on
one event loop (no thread locks; one asyncio lock serialises API calls, as Toxiproxy's
collection mutexes do); ``EmbeddedToxiproxy`` runs that loop in a daemon thread, ``main()``
runs it in the foreground.

Layout: ``api.py`` routes and validates API calls (over the HTTP plumbing in ``http.py``),
``proxy.py`` owns listeners and connections, ``link.py`` runs one direction's toxic chain,
``toxic.py`` is the toxic interface and registry, and ``toxics/`` holds one self-registering
module per toxic (``corrupt`` is an extension of this server, absent from upstream Toxiproxy).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import threading

from .api import _Core
from .common import VERSION, ApiError, _split_hostport

LOG = logging.getLogger(__name__)

__all__ = ["VERSION", "ApiError", "EmbeddedToxiproxy", "main"]

# --------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------


class EmbeddedToxiproxy:
    """A Toxiproxy-compatible server running on an asyncio loop in a daemon thread.

    >>> with EmbeddedToxiproxy(seed=1) as server:   # doctest: +SKIP
    ...     toxiproxy.Toxiproxy().update_api_consumer("127.0.0.1", server.port)
    """

    START_TIMEOUT_S = 10.0
    STOP_TIMEOUT_S = 10.0

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int = 0) -> None:
        self._host = host
        self._port = port
        self._seed = seed
        self._address = ""
        self._core: _Core | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._start_error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL of the HTTP API, e.g. ``http://127.0.0.1:8474``."""
        if not self._address:
            raise RuntimeError("EmbeddedToxiproxy is not running")
        return f"http://{self._address}"

    @property
    def port(self) -> int:
        """Port of the HTTP API (the real one when constructed with ``port=0``)."""
        return _split_hostport(self._address)[1] if self._address else self._port

    def start(self) -> None:
        """Start the loop thread and return once the API socket is listening."""
        if self._thread is not None:
            raise RuntimeError("EmbeddedToxiproxy already started")
        self._ready.clear()
        self._start_error = None
        self._thread = threading.Thread(target=self._run, name="embedded-toxiproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(self.START_TIMEOUT_S):
            raise TimeoutError(f"toxiproxy API did not start within {self.START_TIMEOUT_S}s")
        if self._start_error is not None:
            self._thread.join(self.STOP_TIMEOUT_S)
            self._thread = None
            raise self._start_error

    def stop(self) -> None:
        """Close every proxy, connection and the API listener, then end the loop thread."""
        loop, core, thread = self._loop, self._core, self._thread
        if loop is None or core is None or thread is None:
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(core.shutdown(), loop)
            try:
                future.result(self.STOP_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - shutdown must not raise past stop()
                LOG.warning("embedded.shutdown_failed error=%r", exc)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(self.STOP_TIMEOUT_S)
        if thread.is_alive():
            LOG.warning("embedded.thread_still_alive after=%ss", self.STOP_TIMEOUT_S)
        self._thread = None
        self._loop = None
        self._core = None
        self._address = ""

    def __enter__(self) -> EmbeddedToxiproxy:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._core = _Core(self._seed)
            self._address = loop.run_until_complete(self._core.start_api(self._host, self._port))
        except BaseException as exc:  # noqa: BLE001 - reported to start()'s caller
            self._start_error = exc
            self._ready.set()
            loop.close()
            self._loop = None
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            _cancel_pending(loop)
            loop.close()


def _cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())


async def _serve_forever(host: str, port: int, seed: int) -> None:
    core = _Core(seed)
    await core.start_api(host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        LOG.info("api.signal_received shutting_down=1")
        await core.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Run the server in the foreground until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description="Embedded Toxiproxy-compatible server")
    parser.add_argument("--host", default="127.0.0.1", help="API listen host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8474, help="API listen port (default 8474)")
    parser.add_argument("--seed", type=int, default=0, help="seed for jitter/toxicity/slicer randomness")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        asyncio.run(_serve_forever(args.host, args.port, args.seed))
    except OSError as exc:
        LOG.error("api.start_failed host=%s port=%d error=%s", args.host, args.port, exc)
        return 1
    return 0

