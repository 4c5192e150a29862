"""A TCP proxy on loopback that can pass, black-hole and heal (issue 23, item 4).

``Blackhole(upstream_port)`` listens on a free loopback port and forwards every connection to
``127.0.0.1:upstream_port``. ``drop()`` makes it a black hole: it stops forwarding and stops
reading in both directions — no FIN, no RST, nothing answered — so a peer sees its bytes
accepted by TCP and then silence, exactly what a silently dropped link (a firewall, a dead
middlebox, a frozen peer) looks like to an application that waits for an answer. New
connections made meanwhile are accepted by the kernel but never forwarded. ``heal()`` lets
everything through again, including what was held back, as TCP retransmission would after a
short outage.

The proxy's own kernel still acknowledges the bytes it is sent, so TCP-level timeouts
(keep-alives, ``TCP_USER_TIMEOUT``) never fire here: what this measures is the application's
own timeouts, which are the ones that must bound a request.

It runs its own event loop in a daemon thread, so that tests (synchronous) can drive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

from bench.pgbouncer import loopback_url
from tests.support import free_port

CHUNK = 65536


def _reading(writer: asyncio.StreamWriter, on: bool) -> None:
    """Let the socket behind ``writer`` be read (``on``) or leave its bytes in the kernel."""
    transport = writer.transport
    assert isinstance(transport, asyncio.Transport)  # a TCP socket's: it reads as well
    if on:
        transport.resume_reading()
    else:
        transport.pause_reading()


class Blackhole:
    def __init__(
        self,
        upstream_port: int,
        upstream_host: str = "127.0.0.1",
        *,
        socket_path: str | None = None,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        #: a Unix socket to forward to instead of ``upstream`` (the embedded PostgreSQL)
        self.socket_path = socket_path
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0  # accepted so far
        self.dropped_at: float | None = None
        self.healed_at: float | None = None
        self._thread = threading.Thread(target=self._run, name="blackhole", daemon=True)
        self._started = threading.Event()

    # -- control (from the test's thread) -------------------------------------------------

    def start(self) -> Blackhole:
        self._thread.start()
        assert self._started.wait(10), "the proxy did not start"
        return self

    def drop(self) -> None:
        """Stop forwarding and reading, silently, on every connection, old and new."""

        def hole() -> None:
            self._flow().clear()
            for w in self._writers:  # the sockets' bytes stay in the kernel, unread
                _reading(w, False)

        self._call(hole)
        self.dropped_at = time.monotonic()

    def heal(self) -> None:
        def mend() -> None:
            self._flow().set()
            for w in self._writers:
                _reading(w, True)

        self._call(mend)
        self.healed_at = time.monotonic()

    def close(self) -> None:
        if not self._thread.is_alive():
            return

        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @classmethod
    def in_front_of(cls, database_url: str) -> Blackhole:
        """A proxy to the server of ``database_url``: over TCP, or over its Unix socket when
        the URL names a socket directory (``?host=/dir``, as the embedded PostgreSQL's)."""
        parts = urlsplit(database_url)
        port = parts.port or 5432
        directory = dict(parse_qsl(parts.query)).get("host")
        if not parts.hostname and directory and directory.startswith("/"):
            return cls(port, socket_path=f"{directory}/.s.PGSQL.{port}")
        return cls(port, parts.hostname or "127.0.0.1")

    def url_for(self, database_url: str) -> str:
        """``database_url`` (postgresql://user@host:port/db) pointed at this proxy (a ``host``
        query parameter, a Unix socket directory, is dropped: the proxy is TCP)."""
        return loopback_url(database_url, self.port)

    def __enter__(self) -> Blackhole:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the event loop -------------------------------------------------------------------

    def _call(self, fn: Callable[[], None]) -> None:
        async def run() -> None:
            fn()

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def _flow(self) -> asyncio.Event:
        assert self._flowing is not None
        return self._flowing

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def serve() -> None:
            self._flowing = asyncio.Event()
            self._flowing.set()
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
            self._started.set()

        self.loop.run_until_complete(serve())
        try:
            self.loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                self.loop.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        if not self._flow().is_set():
            _reading(writer, False)
        try:
            await self._flow().wait()  # a connection made during the black hole waits
            if self.socket_path is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self.socket_path)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        if not self._flow().is_set():
            _reading(up_writer, False)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
        )
        for w in (writer, up_writer):
            self._writers.discard(w)
            with contextlib.suppress(Exception):
                w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        flowing = self._flow()
        try:
            while True:
                await flowing.wait()
                data = await reader.read(CHUNK)
                if not data:
                    break
                await flowing.wait()  # read just before the drop: held, not forwarded
                writer.write(data)
                await writer.drain()
        finally:
            # one side closed (or failed): pass the close on, once the hole is healed
            await flowing.wait()
            with contextlib.suppress(Exception):
                writer.write_eof()
