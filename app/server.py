"""The uvicorn server a broker runs in (``messagex serve`` and the tests alike): an adapter
written against one minor version of uvicorn and of websockets (``SUPPORTED_VERSIONS``).

Its graceful shutdown first closes the broker's WebSockets with 1001 ("going away") and
releases what they hold, then lets uvicorn stop the rest: uvicorn on its own would close them
with 1012 only after it stopped accepting, and the release would wait for the lifespan.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import socket
import struct
import weakref
from collections.abc import Iterable
from importlib.metadata import version
from typing import Any, ClassVar

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.utils import ClientDisconnected
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import InvalidState
from websockets.frames import Frame
from websockets.http11 import Request
from websockets.protocol import State

try:  # websockets' C unmasking, as its own parser uses; the pure-Python one without it
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

from app import runtime, serverext
from app.config import Settings
from app.serverext import ABORT, RECEIVE_MANY, SEND_MANY, WRITE_BUFFER

log = logging.getLogger("messagex")

#: The uvicorn and websockets this adapter is written against, as major.minor. It subclasses
#: uvicorn's sans-I/O WebSocket protocol (eight methods overridden, a dozen private attributes
#: read) and frames with websockets' protocol objects: none of that is a public API, and a
#: newer release may change it without notice. pyproject.toml pins the same minor versions and
#: tests/unit/test_server_versions.py fails when the installed ones differ: to upgrade, read
#: their changes against this module, then change the three together.
SUPPORTED_VERSIONS = {"uvicorn": "0.55", "websockets": "17.4"}

#: how long shutdown waits for WebSocket handlers to release their deliveries
DRAIN_SECONDS = 5.0
#: how long a worker process may take to stop: the drain, uvicorn's graceful shutdown
#: (``timeout_graceful_shutdown``, 10 s) and a margin; then it is killed
WORKER_STOP_SECONDS = DRAIN_SECONDS + 15
#: the cyclic collector's thresholds in a broker process (CPython's default: 700, 10, 10)
GC_THRESHOLDS = (10_000, 10, 10)


def unsupported_versions() -> dict[str, str]:
    """The installed versions that differ from ``SUPPORTED_VERSIONS``, by package name."""
    found = {name: version(name) for name in SUPPORTED_VERSIONS}
    return {
        name: installed
        for name, installed in found.items()
        if ".".join(installed.split(".")[:2]) != SUPPORTED_VERSIONS[name]
    }


def tune_gc() -> None:
    """Once the broker has started: collect, then freeze what start-up built (modules, the
    app, pydantic's validators, SQLAlchemy's compiled statements) so that no later
    collection walks it again, and collect the young generation every 10,000 allocations
    instead of every 700.

    The hot path allocates futures, closures and frames by the thousand; with the defaults
    the collector ran 500+ times per 20,000 messages and its full passes walked the whole
    heap: 0.5 to 0.8 s of the broker's 2.7 to 3.4 s of CPU (docs/performance.md). Nothing is kept
    longer than before except cyclic garbage, which waits for the next young collection.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def text_frame_header(length: int) -> bytes:
    """The header of a final, unmasked text frame of ``length`` bytes (RFC 6455 §5.2)."""
    if length < 126:
        return bytes((0x81, length))
    if length < 65536:
        return struct.pack("!BBH", 0x81, 126, length)
    return struct.pack("!BBQ", 0x81, 127, length)


def framed_texts(frames: list[bytes], before: list[bytes] | None = None) -> bytes:
    """``frames`` (UTF-8 texts) as final, unmasked, uncompressed text frames, after the bytes
    ``before``: what websockets' ``send_text`` writes for each, at a tenth of its cost."""
    if not before and len(frames) == 1:
        return text_frame_header(len(frames[0])) + frames[0]
    out = before if before is not None else []
    for data in frames:
        out.append(text_frame_header(len(data)))
        out.append(data)
    return b"".join(out)


def plain_texts(data: bytes, max_size: int | None) -> list[str] | None:
    """The texts of ``data`` when it is nothing but whole, final, masked, uncompressed text
    frames of valid UTF-8, each of at most ``max_size`` bytes and 65,535 (a client's ACKs
    and PINGs); else None, and nothing is taken from it (websockets' parser reads it)."""
    texts: list[str] = []
    pos = 0
    end = len(data)
    while pos < end:
        if end - pos < 6 or data[pos] != 0x81:  # FIN, no RSV bits, opcode text
            return None
        length = data[pos + 1]
        if length < 0x80:  # not masked: websockets' parser closes with 1002
            return None
        length &= 0x7F
        if length < 126:
            start = pos + 6
        elif length == 126 and end - pos >= 8:
            length = (data[pos + 2] << 8) | data[pos + 3]
            start = pos + 8
        else:
            return None
        stop = start + length
        if stop > end or (max_size is not None and length > max_size):
            return None
        try:
            texts.append(apply_mask(data[start:stop], data[start - 4 : start]).decode())
        except UnicodeDecodeError:  # websockets' path closes with 1007
            return None
        pos = stop
    return texts


#: the keep-alive wheel's slot width, s (at most a quarter of the interval and of the timeout)
KEEPALIVE_TICK = 0.25
#: every keep-alive ping: a final, unmasked ping frame with a 2-byte payload (what answers it
#: is not compared: any bytes received after it prove the peer alive)
PING_FRAME = bytes((0x89, 2)) + b"mx"


class KeepAlive:
    """The keep-alive of the WebSockets of one event loop that share an interval and timeout.

    Sockets wait in slots (``tick`` wide) by the time each is next due; one timer, at the
    earliest slot, gives every due socket its turn (``keepalive_due``: ping, close, or
    nothing) and files it under its next due time. uvicorn instead kept three timers per ping
    and socket (the ping, the pong's deadline, the next ping): with 10,000 silent sockets
    that was 1,000 timer operations a second, each ping woke the loop on its own, and the
    keep-alive was most of an idle broker's CPU (docs/performance.md, "Scale"). Here a socket
    costs one turn per interval whatever it sends meanwhile (a talker only moves its
    ``_heard_at``), and the pings due together go out in one turn of the loop.
    """

    _wheels: ClassVar[
        weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[float, float | None], KeepAlive]
        ]
    ] = weakref.WeakKeyDictionary()

    @classmethod
    def of(
        cls, loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None
    ) -> KeepAlive:
        wheels = cls._wheels.setdefault(loop, {})
        wheel = wheels.get((interval, timeout))
        if wheel is None:
            wheel = wheels[(interval, timeout)] = cls(loop, interval, timeout)
        return wheel

    def __init__(
        self, loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None
    ) -> None:
        self.loop = loop
        self.interval = interval
        self.timeout = timeout
        self.tick = min(KEEPALIVE_TICK, min(interval, timeout or interval) / 4)
        self.slots: dict[int, set[BatchingWebSocketProtocol]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_slot = 0
        self._turning = False

    def add(self, sock: BatchingWebSocketProtocol, due: float) -> None:
        """File ``sock`` for its turn at the first slot boundary at or after ``due``."""
        slot = math.ceil(due / self.tick)
        sock._keepalive_slot = slot
        members = self.slots.get(slot)
        if members is not None:
            members.add(sock)
            return
        self.slots[slot] = {sock}
        if not self._turning and (self._timer is None or slot < self._timer_slot):
            self._arm(slot)

    def discard(self, sock: BatchingWebSocketProtocol) -> None:
        """Forget a closed socket now (not at its turn: it would hold the connection's
        objects until then)."""
        members = self.slots.get(sock._keepalive_slot)
        if members is not None:
            members.discard(sock)
            if not members and not self._turning:
                del self.slots[sock._keepalive_slot]

    def _arm(self, slot: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_slot = slot
        self._timer = self.loop.call_at(slot * self.tick, self._turn)

    def _turn(self) -> None:
        self._timer = None
        self._turning = True
        now = self.loop.time()
        try:
            for slot in sorted(s for s in self.slots if s * self.tick <= now):
                for sock in self.slots.pop(slot):
                    try:
                        due = sock.keepalive_due(now, self)
                    except Exception:
                        log.exception("WebSocket keep-alive failed")
                        continue
                    if due is not None:
                        self.add(sock, due)
        finally:
            self._turning = False
            if self.slots:
                self._arm(min(self.slots))
            else:  # nothing left: the next socket makes a new wheel
                wheels = self._wheels.get(self.loop, {})
                if wheels.get((self.interval, self.timeout)) is self:
                    del wheels[(self.interval, self.timeout)]


class BatchingWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol with three ASGI extensions (app/serverext.py),
    named in the scope so that the app falls back to plain messages under any other server:

    - ``SEND_MANY``: ``send_many([utf8_bytes, ...])`` sends several text frames with one
      socket write. A consumer with prefetch 100 is sent up to 100
      ``MESSAGE_DELIVERED`` frames at a time; one ASGI ``websocket.send`` each cost a str
      round trip of every body, the ASGI layers and a ``send()`` system call per frame. Without
      compression the frames are framed here (``text_frame_header``): websockets' own framing
      cost 2.1 µs per frame, this 0.3. Flow control is uvicorn's: the send waits while the
      transport is paused for writing.
      And ``send_now([utf8_bytes, ...])``, for a few small frames (the app keeps them
      small: ``SEND_NOW_MAX_BYTES`` in app/api/ws/connection.py): written at once, without
      waiting, when the socket is open, uncompressed and writable; False (nothing written)
      otherwise, and the caller sends them with ``send_many``. A consumer that gets one
      delivery at a time (many busy queues, docs/performance.md) then costs no wake-up of
      its send task per frame.
    - ``RECEIVE_MANY``: the text frames of one socket read reach the app as one
      ``{"type": RECEIVE_MANY, "texts": [str, ...]}`` (a single one as a plain
      ``websocket.receive``), in order with everything else: any other event (a binary
      frame, a close) first hands over the texts before it. A read of nothing but whole,
      small, masked text frames (``plain_texts``), with no partial frame or fragmented
      message before it, is unmasked and decoded here without websockets' parser (its
      generator, frame objects and events cost more than the rest of the read); any other
      read goes through the parser. Reading pauses until the app takes them, as uvicorn
      pauses after every message.
    - ``ABORT``: ``abort()`` drops the TCP connection at once, discarding unsent data. For a
      peer that stopped reading: a graceful close (the app returning, or ``websocket.close``)
      waits for the write buffer to drain, which never happens, so the socket would stay open
      for as long as the peer keeps its window shut.
    - ``WRITE_BUFFER``: ``size()``, the bytes written and not yet sent.

    And its keep-alive pings only a peer that sent nothing for the whole ping interval, from
    one wheel per process (``KeepAlive``, ``keepalive_due``) rather than uvicorn's timers.
    """

    _texts: list[str] | None = None  # while handle_events runs: text frames not handed over
    _heard_at = 0.0  # loop time of the last bytes received (the keep-alive ping skips a talker)
    _pinged_at: float | None = None  # loop time of the keep-alive ping not yet answered
    _keepalive_on = False  # on the process's keep-alive wheel
    _keepalive_slot = 0  # its slot there
    _wheel: KeepAlive | None = None  # the wheel it is on

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if isinstance(transport, CoalescingTransport):  # upgraded from our HTTP protocol
            transport = transport.wrapped
        super().connection_made(transport)

    def handle_connect(self, event: Request) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            extensions: dict[str, object] = scope["extensions"]
            extensions[SEND_MANY] = serverext.SendMany(
                send_many=self.send_many, send_now=self.send_now
            )
            extensions[RECEIVE_MANY] = serverext.ReceiveMany(receive=self.receive)
            extensions[ABORT] = serverext.Abort(abort=self.abort)
            extensions[WRITE_BUFFER] = serverext.WriteBuffer(size=self.write_buffer_size)

    async def run_asgi(self) -> None:
        try:
            await super().run_asgi()
        finally:
            # The extensions hold bound methods: drop them with the app's end, so that no
            # reference cycle keeps a closed connection for the cyclic collector.
            extensions = getattr(self, "scope", {}).get("extensions", {})
            for name in (SEND_MANY, RECEIVE_MANY, ABORT, WRITE_BUFFER):
                extensions.pop(name, None)

    def data_received(self, data: bytes) -> None:
        self._heard_at = self.loop.time()
        conn = self.conn
        if (
            conn.state is State.OPEN
            and self._texts is None
            and not self.close_sent
            and not conn.extensions
            and conn.current_size is None  # no fragmented message under way
            and not conn.reader.buffer  # no partial frame held by the parser
        ):
            texts = plain_texts(data, conn.max_message_size)
            if texts:
                self._hand(texts)
                return
        super().data_received(data)

    def start_keepalive(self) -> None:
        # One wheel per process and settings (``KeepAlive``) instead of uvicorn's three timers
        # per ping and socket.
        interval = self.ping_interval
        if interval is not None and interval > 0:
            self._heard_at = self.loop.time()
            self._keepalive_on = True
            self._wheel = KeepAlive.of(self.loop, interval, self.ping_timeout)
            self._wheel.add(self, self._heard_at + interval)

    def stop_keepalive(self) -> None:
        self._keepalive_on = False
        wheel, self._wheel = self._wheel, None
        if wheel is not None:
            wheel.discard(self)
        super().stop_keepalive()

    def keepalive_due(self, now: float, wheel: KeepAlive) -> float | None:
        """The wheel's turn at this socket: ping it if it sent nothing for the whole interval,
        close it (1011) if a ping went unanswered for the timeout. Any bytes received after a
        ping answer it (a pong, or anything else: the peer is alive). Returns when to look
        again, or None when the socket is done with."""
        if not self._keepalive_on or self.close_sent or self.transport.is_closing():
            return None
        sent = self._pinged_at
        if sent is not None:
            if self._heard_at >= sent:
                self._pinged_at = None
            elif wheel.timeout is not None and now < sent + wheel.timeout:
                return sent + wheel.timeout
            else:
                self._keepalive_on = False
                self.keepalive_timeout()
                return None
        due = self._heard_at + wheel.interval
        if due > now:
            return due
        if self.conn.state is not State.OPEN:
            return None
        # A ping's frame never changes (server frames are unmasked, control frames are never
        # compressed): written as it is, as send_many frames its texts.
        self.transport.write(PING_FRAME)
        if wheel.timeout is None:
            return now + wheel.interval
        self._pinged_at = now
        return now + wheel.timeout

    def abort(self) -> None:
        self.transport.abort()

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size()

    def handle_events(self) -> None:
        self._texts = []
        try:
            super().handle_events()
        finally:
            self._hand_texts()
            self._texts = None

    def send_receive_event_to_app(self) -> None:
        texts = self._texts
        if texts is not None and self.curr_msg_data_type == "text" and not self.close_sent:
            data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
            self.frames = []
            try:
                texts.append(data.decode())
            except UnicodeDecodeError:
                # what uvicorn does, less its ERROR log with a traceback per bad client frame
                self._hand_texts()
                log.info("closing a WebSocket with 1007: a text frame was not valid UTF-8")
                self.conn.send_close(1007)
                self.handle_parser_exception()
            return
        self._hand_texts()
        super().send_receive_event_to_app()

    def handle_close(self, event: Frame) -> None:
        self._hand_texts()
        super().handle_close(event)

    def _hand_texts(self) -> None:
        texts = self._texts
        if not texts:
            return
        self._texts = []
        self._hand(texts)

    def _hand(self, texts: list[str]) -> None:
        """Queue ``texts`` for the app and pause reading until it takes them (uvicorn's
        ``receive`` resumes it)."""
        if len(texts) == 1:
            self.queue.put_nowait({"type": "websocket.receive", "text": texts[0]})
        else:
            self.queue.put_nowait({"type": RECEIVE_MANY, "texts": texts})  # type: ignore[arg-type]
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    async def send_many(self, frames: list[bytes]) -> None:
        await self.writable.wait()
        if self.disconnected:
            raise ClientDisconnected()
        if not self.handshake_complete or self.close_sent or self.initial_response is not None:
            raise RuntimeError(f"'{SEND_MANY}' is only valid on an open WebSocket")
        if self.conn.extensions or self.conn.state is not State.OPEN:
            try:  # compressed (or closing): the protocol frames them
                for data in frames:
                    self.conn.send_text(data)
            except InvalidState:
                raise ClientDisconnected() from None
            self.transport.write(b"".join(self.conn.data_to_send()))
        else:
            # after anything the protocol still has to send
            self.transport.write(framed_texts(frames, self.conn.data_to_send()))
        if not self.writable.is_set():
            # Past the transport's high-water mark: wait here, so that the caller's send
            # timeout covers a peer that stopped reading even when this was the last send
            # (otherwise nothing would wait, and nothing would time out).
            await self.writable.wait()

    def send_now(self, frames: list[bytes]) -> bool:
        """Write ``frames`` at once if the socket is open, uncompressed, writable and has
        nothing of the protocol's to send first; else False, and nothing is written."""
        conn = self.conn
        if (
            conn.state is not State.OPEN
            or self.close_sent
            or self.disconnected
            or conn.extensions
            or conn.writes
            or not self.writable.is_set()
            or self.transport.is_closing()
            or not self.handshake_complete
            or self.initial_response is not None
        ):
            return False
        self.transport.write(framed_texts(frames))
        return True


class CoalescingTransport:
    """An HTTP connection's transport that writes a response's head and body together.

    uvicorn writes a response in two: its head on ``http.response.start`` and its body on
    ``http.response.body``, each a ``send()`` system call and a TCP segment of its own, and
    the client wakes up for each. Here a write is held until the next one, which goes out
    with it at once; a write that no other follows in the same turn of the event loop goes
    out at the end of that turn (``call_soon``). Order is kept; ``close`` and ``write_eof``
    send what is held first, ``abort`` drops it, as a transport's own buffer would be.
    Everything else is the wrapped transport's. A WebSocket connection takes the wrapped
    transport back (``BatchingWebSocketProtocol.connection_made``): it writes a burst of frames
    in one write already, and must not wait for the end of the turn.

    On loopback a write also runs the receiving side's TCP processing, and the two writes of a
    response were a fifth of the broker's samples for single publishes; with this, broker CPU
    per single publish went from 381 to 356 µs (medians of 12 interleaved bursts,
    docs/performance.md, round 8).
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: bytes | None = None

    @property
    def wrapped(self) -> asyncio.Transport:
        """The transport itself, after what is held (so writes to it keep their order)."""
        self._flush()
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            self._held = data if type(data) is bytes else bytes(data)
            self._loop.call_soon(self._flush)
        else:
            self._held = None
            self._transport.write(held + data)

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in chunks:
            self.write(data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a CoalescingTransport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(CoalescingTransport(transport))  # type: ignore[arg-type]


class BrokerServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI, *, own_process: bool = False) -> None:
        """``own_process``: the server is the whole process (``messagex serve`` and its
        workers, not a test's server in a thread), so it may tune the process's collector."""
        super().__init__(config)
        self.broker_app = app
        self.own_process = own_process
        app.state.listen_host = config.host  # the default of MESSAGEX_ALLOWED_HOSTS (§3)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.own_process and not self.should_exit:
            tune_gc()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        services = getattr(self.broker_app.state, "services", None)
        # Stop accepting connections before the WebSockets are closed: the clients that
        # reconnect at once must reach another broker, not this one (uvicorn closes the
        # listeners again in its own shutdown, which is harmless).
        for server in self.servers:
            server.close()
        if services is not None:
            try:
                await asyncio.wait_for(services.delivery.drain(), DRAIN_SECONDS)
            except TimeoutError:
                log.warning("WebSockets did not close within %.0f s", DRAIN_SECONDS)
        await super().shutdown(sockets)


def server_config(
    app: FastAPI, settings: Settings, host: str, port: int, log_level: str | None = None
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        log_level=log_level,
        access_log=False,
        # X-Forwarded-For / Forwarded only from MESSAGEX_TRUSTED_PROXIES (app.api.exposure);
        # uvicorn's own would believe them from 127.0.0.1 by default
        proxy_headers=False,
        loop="auto",
        http=CoalescingHttpToolsProtocol,
        ws=BatchingWebSocketProtocol,
        ws_max_size=settings.ws_max_frame_bytes,
        ws_per_message_deflate=settings.ws_compression,
        ws_ping_interval=settings.ws_ping_interval_seconds or None,
        ws_ping_timeout=settings.ws_ping_timeout_seconds,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )


def build_server(
    app: FastAPI,
    settings: Settings,
    host: str,
    port: int,
    log_level: str | None = None,
    *,
    own_process: bool = False,
) -> BrokerServer:
    for name, installed in unsupported_versions().items():
        log.warning(
            "%s %s is installed; this server is written for %s %s.x (app/server.py)",
            name,
            installed,
            name,
            SUPPORTED_VERSIONS[name],
        )
    config = server_config(app, settings, host, port, log_level)
    return BrokerServer(config, app, own_process=own_process)


def run_workers(settings: Settings, host: str, port: int, workers: int) -> int:
    """``messagex serve --workers N``: the runtime's supervisor, running ``_worker``."""
    return runtime.run_workers(
        settings, host, port, workers, _worker, stop_seconds=WORKER_STOP_SECONDS
    )


def _worker(settings: Settings, sock: socket.socket, host: str, port: int) -> None:
    from app import logs
    from app.main import create_app

    logs.configure(settings.log_level, settings.log_format)
    app = create_app(settings)
    build_server(app, settings, host, port, own_process=True).run(sockets=[sock])
