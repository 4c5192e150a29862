"""The server's own text frame header (app/server.py, SEND_MANY) is byte for byte what the
websockets protocol writes for the same frame."""

from __future__ import annotations

import pytest
from websockets.protocol import State
from websockets.server import ServerProtocol

from app.server import text_frame_header


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_the_header_is_the_one_websockets_writes(length: int) -> None:
    protocol = ServerProtocol()
    protocol.state = State.OPEN
    data = b"x" * length
    protocol.send_text(data)
    assert text_frame_header(length) + data == b"".join(protocol.data_to_send())
