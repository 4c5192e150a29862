"""A WebSocket consumer client for the benchmark: websockets' sans-I/O protocol on a plain
asyncio transport, with the frames it sends during one socket read written together.

The websockets asyncio client makes one ``send()`` system call per frame, and each of its
``send`` calls runs a lock, a context manager and a write: at one ``ACK`` frame per message
that was a quarter of the harness's CPU (py-spy), on the same two cores as the broker. This
client still sends one ``ACK`` frame per message; it handles every frame a read brought in
(``on_text``), then writes whatever they produced in one go, as an efficient client library
would. Pings are answered by the protocol itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from bench.stats import BenchError

#: how long the handshake, a reply during set-up, and the closing handshake may take
REPLY_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 5.0


class WsClient(asyncio.Protocol):
    """One WebSocket connection. Until ``on_text`` is set, text frames queue up for
    ``recv_json``; then each is passed to ``on_text`` as it arrives."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.proto = ClientProtocol(parse_uri(url), max_size=None)
        self.request = self.proto.connect()
        for name, value in headers.items():
            self.request.headers[name] = value
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.on_text: Callable[[bytes], None] | None = None
        self._parts: list[bytes] = []

    @classmethod
    async def open(cls, url: str, headers: dict[str, str]) -> WsClient:
        uri = parse_uri(url)
        loop = asyncio.get_running_loop()
        _, client = await loop.create_connection(lambda: cls(url, headers), uri.host, uri.port)
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                await asyncio.shield(client.opened)
        except BaseException:
            client.abort()
            raise
        return client

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.proto.send_request(self.request)
        self.flush()

    def data_received(self, data: bytes) -> None:
        self.proto.receive_data(data)
        for event in self.proto.events_received():
            if isinstance(event, Response):
                if self.proto.handshake_exc is not None:
                    self._fail(BenchError(f"WebSocket handshake failed: {event.status_code}"))
                elif not self.opened.done():
                    self.opened.set_result(None)
            elif isinstance(event, Frame) and event.opcode in (Opcode.TEXT, Opcode.CONT):
                self._parts.append(bytes(event.data))
                if event.fin:
                    text = b"".join(self._parts) if len(self._parts) > 1 else self._parts[0]
                    self._parts = []
                    if self.on_text is not None:
                        self.on_text(text)
                    else:
                        self.inbox.put_nowait(text)
        self.flush()
        if self.proto.close_expected() and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.proto.receive_eof()
        self.inbox.put_nowait(None)
        if not self.opened.done():
            self.opened.set_exception(BenchError("the WebSocket connection closed"))
        if not self.closed.done():
            self.closed.set_result(None)

    # -- use ----------------------------------------------------------------------------------

    def send_text(self, text: bytes) -> None:
        """Queue a text frame; it goes out at the end of the current read, or at ``flush``."""
        self.proto.send_text(text)

    def send_json(self, frame: dict[str, Any]) -> None:
        self.send_text(orjson.dumps(frame))
        self.flush()

    def flush(self) -> None:
        data = self.proto.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(data))

    async def recv_json(self) -> Any:
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            text = await self.inbox.get()
        if text is None:
            raise BenchError("the WebSocket connection closed")
        return orjson.loads(text)

    async def serve(self, on_text: Callable[[bytes], None]) -> None:
        """Pass every text frame to ``on_text`` (those queued so far first, then each as it
        arrives) until the connection closes."""
        while not self.inbox.empty():
            raw = self.inbox.get_nowait()
            if raw is not None:
                on_text(raw)
        self.flush()
        self.on_text = on_text
        await asyncio.wait({self.closed})  # not ``await closed``: a cancel would cancel it

    async def close(self) -> None:
        if self.proto.state is State.OPEN:
            self.proto.send_close(1000)
            self.flush()
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await asyncio.shield(self.closed)
        except TimeoutError:
            self.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        if not self.opened.done():
            self.opened.set_exception(exc)
        self.abort()
