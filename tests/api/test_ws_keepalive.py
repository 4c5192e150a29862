"""The server's WebSocket keep-alive (MESSAGEX_WS_PING_INTERVAL_SECONDS and
MESSAGEX_WS_PING_TIMEOUT_SECONDS): a socket that sends nothing for an interval is pinged and
closed (1011) when it does not answer; one that talks is not pinged at all."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest
from websockets.sync.client import connect

from tests.faults.harness import raw_upgrade
from tests.support import LiveServer, wait_for
from tests.wsclient import basic

#: this module's shared server (the ``srv`` fixture in tests/conftest.py)
SERVER_SETTINGS = {"ws_ping_interval_seconds": 1.5, "ws_ping_timeout_seconds": 1.0}


def read_frame(sock: socket.socket, deadline: float) -> tuple[int, bytes]:
    """The next frame's opcode and payload (server frames are unmasked)."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(n - len(data))
            assert chunk, "the server closed the TCP connection"
            data += chunk
        return data

    first, second = exactly(2)
    length = second & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", exactly(2))
    elif length == 127:
        (length,) = struct.unpack("!Q", exactly(8))
    return first & 0x0F, exactly(length)


def test_a_silent_socket_is_pinged_then_closed_when_it_does_not_answer(srv: LiveServer) -> None:
    port = int(srv.base_url.rsplit(":", 1)[1])
    sock = raw_upgrade(port, basic())
    try:
        started = time.monotonic()
        deadline = started + 10
        opcodes: list[int] = []
        while not opcodes or opcodes[-1] != 0x8:
            opcode, payload = read_frame(sock, deadline)
            opcodes.append(opcode)
            if opcode == 0x9:
                pinged = time.monotonic() - started
        closed = time.monotonic() - started
        # (CONNECTED may have come with the 101's head) one ping after an interval of
        # silence, unanswered: a close, 1011
        assert opcodes in ([0x1, 0x9, 0x8], [0x9, 0x8]), opcodes
        assert struct.unpack("!H", payload[:2])[0] == 1011
        assert 1.0 <= pinged <= 4.0, pinged
        assert 0.8 <= closed - pinged <= 4.0, (pinged, closed)
    finally:
        sock.close()


class Pings(logging.Handler):
    """Counts the pings a websockets client logs as received."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("< PING"):
            self.count += 1


def test_a_socket_that_talks_is_not_pinged(srv: LiveServer) -> None:
    logger = logging.getLogger("tests.keepalive.client")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    pings = Pings()
    logger.addHandler(pings)
    try:
        # the client itself never pings; it answers the server's pings by itself
        with connect(
            srv.ws_url, additional_headers=basic(), ping_interval=None, logger=logger
        ) as ws:
            assert '"CONNECTED"' in str(ws.recv(5))
            talk_until = time.monotonic() + 5  # more than three intervals
            while time.monotonic() < talk_until:
                ws.send('{"type":"PING"}')
                assert '"PONG"' in str(ws.recv(5))
                with pytest.raises(TimeoutError):  # nothing else arrives meanwhile
                    ws.recv(0.4)
            assert pings.count == 0
            # silent now: pinged within an interval (and it answered, so it stays open)
            wait_for(lambda: pings.count >= 1, 4, message="a ping to a silent socket")
            ws.send('{"type":"PING"}')
            assert '"PONG"' in str(ws.recv(5))
    finally:
        logger.removeHandler(pings)
