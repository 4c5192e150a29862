"""app.server.CoalescingTransport: an HTTP response's head and body in one write, nothing
reordered, delayed past the loop's turn, or lost; WebSocket connections take the transport
itself back."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from app.server import (
    BatchingWebSocketProtocol,
    CoalescingHttpToolsProtocol,
    CoalescingTransport,
)


class Recorder(asyncio.Transport):
    """What reaches the socket: each write, and whether it was closed or aborted."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def write_eof(self) -> None:
        self.events.append("eof")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        self.events.append("pause")

    def resume_reading(self) -> None:
        self.events.append("resume")


async def next_turn() -> None:
    """Let the loop run what was scheduled with call_soon before now."""
    await asyncio.sleep(0)


async def test_a_head_and_its_body_go_out_in_one_write_at_once() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert raw.writes == []  # held for the body
    transport.write(b"{}")
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]  # no wait
    await next_turn()
    assert len(raw.writes) == 1


async def test_a_write_alone_goes_out_at_the_end_of_the_turn() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert raw.writes == []
    await next_turn()
    assert raw.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


async def test_writes_keep_their_order_across_pairs_and_turns() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.writelines([b"1", b"2", b"3"])
    assert raw.writes == [b"12"]
    await next_turn()
    transport.write(bytearray(b"4"))
    transport.write(memoryview(b"5"))
    transport.write(b"")  # nothing to send: nothing held, nothing written
    await next_turn()
    assert b"".join(raw.writes) == b"12345"
    assert raw.writes == [b"12", b"3", b"45"]


async def test_close_and_eof_send_what_is_held_first_and_abort_drops_it() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"last")
    transport.write_eof()
    assert (raw.writes, raw.events) == ([b"last"], ["eof"])

    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"bye")
    transport.close()
    await next_turn()  # the scheduled flush finds nothing more to send
    assert (raw.writes, raw.events) == ([b"bye"], ["close"])

    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"never")
    transport.abort()
    await next_turn()
    assert (raw.writes, raw.events) == ([], ["abort"])


async def test_nothing_is_written_to_a_transport_that_is_closing() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    transport.write(b"late")
    raw.closing = True  # closed from elsewhere (the peer went away)
    await next_turn()
    assert raw.writes == []


async def test_everything_else_is_the_wrapped_transports() -> None:
    raw = Recorder()
    transport = CoalescingTransport(raw)
    assert transport.get_extra_info("peername") == ("127.0.0.1", 50000)
    transport.pause_reading()
    assert raw.events == ["pause"]
    transport.write(b"held")
    assert transport.wrapped is raw
    assert raw.writes == [b"held"]  # what was held goes first


def _config() -> Config:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    config = Config(
        app=app, http=CoalescingHttpToolsProtocol, ws=BatchingWebSocketProtocol, log_config=None
    )
    config.load()
    return config


async def test_http_connections_write_through_it_and_websockets_take_the_socket_back() -> None:
    config = _config()
    http = CoalescingHttpToolsProtocol(config=config, server_state=ServerState(), app_state={})
    raw = Recorder()
    http.connection_made(raw)
    assert isinstance(http.transport, CoalescingTransport)

    # What uvicorn does on an upgrade: the WebSocket protocol gets the HTTP one's transport.
    http.transport.write(b"held")
    ws = BatchingWebSocketProtocol(config=config, server_state=ServerState(), app_state={})
    ws.connection_made(http.transport)
    assert ws.transport is raw
    assert raw.writes == [b"held"]
