"""Oversized input is refused before it is buffered: a huge REST body with a Content-Length
(413 on the headers alone), the same without one (chunked: 413 once the 16 MiB request limit
is passed), and a huge WebSocket frame (closed 1009 from the frame header). The broker's peak
RSS (VmHWM, reset before each case) stays far below the input size.
"""

from __future__ import annotations

import base64
import contextlib
import os
import select
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from tests.faults.harness import ADMIN, BrokerProc, brokers
from tests.wsclient import WsClient, basic

MB = 1024 * 1024
CHUNK = 256 * 1024


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def send_until_answered(
    port: int, head: bytes, body: Iterator[bytes], timeout: float = 60
) -> tuple[bytes, int]:
    """Send ``head`` then ``body`` until the server answers or closes; (answer, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setblocking(False)
    sent = 0
    answer = b""
    pending = head
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock] if pending else [], [], 0.5)
            if readable:
                try:
                    data = sock.recv(65536)
                except (ConnectionResetError, BlockingIOError):
                    data = b""
                answer += data
                if not data or b"\r\n\r\n" in answer:
                    break
            if writable and pending:
                try:
                    n = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += n
                pending = pending[n:] or next(body, b"")
        # read the rest of a response that started arriving
        sock.setblocking(True)
        sock.settimeout(2)
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" in answer and len(answer) < 65536:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
    finally:
        sock.close()
    return answer, sent


def zeros(total: int, chunked: bool) -> Iterator[bytes]:
    block = b"0" * CHUNK
    left = total
    while left > 0:
        piece = block[: min(CHUNK, left)]
        left -= len(piece)
        yield (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
    if chunked:
        yield b"0\r\n\r\n"


def rest_head(length: int | None) -> bytes:
    auth = base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    lines = [
        "POST /api/v1/queues/big/messages HTTP/1.1",
        "Host: 127.0.0.1",
        f"Authorization: Basic {auth}",
        "Content-Type: application/json",
        f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def run_oversize(broker: BrokerProc, size: int) -> dict[str, float]:
    with broker.client() as api:
        assert api.put("/queues/big", json={}).status_code in (200, 201)
    figures: dict[str, float] = {}
    for case, chunked in (("content-length", False), ("chunked", True)):
        reset_peak(broker.pid)
        before = rss(broker.pid)
        started = time.monotonic()
        answer, sent = send_until_answered(
            broker.port, rest_head(None if chunked else size), zeros(size, chunked)
        )
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"message_too_large" in answer
        figures[f"rest_{case}_peak_mb"] = (peak_rss(broker.pid) - before) / MB
        figures[f"rest_{case}_sent_mb"] = sent / MB
        figures[f"rest_{case}_seconds"] = time.monotonic() - started

    # WebSocket: one text frame declaring `size` bytes, streamed after the header
    reset_peak(broker.pid)
    before = rss(broker.pid)
    ws = WsClient.open(broker.ws_url, basic())
    ws.expect("CONNECTED")
    mask = os.urandom(4)
    sock = ws.ws.socket
    sent = 0
    code = None
    try:
        sock.sendall(bytes([0x81, 0x80 | 127]) + struct.pack("!Q", size) + mask)
        for piece in zeros(size, chunked=False):
            sock.sendall(piece)
            sent += len(piece)
    except OSError:  # the server closed it (the client library may have closed it too)
        pass
    with contextlib.suppress(ConnectionClosed):
        code, _ = ws.expect_close(10)
    with contextlib.suppress(Exception):
        ws.close()
    figures["ws_peak_mb"] = (peak_rss(broker.pid) - before) / MB
    figures["ws_sent_mb"] = sent / MB
    assert code == 1009, code  # "message too big", from the frame header alone
    assert broker.alive()
    with broker.client() as api:
        assert api.get("/queues/big").json()["stats"]["ready"] == 0
    return figures


def check(figures: dict[str, float], size: int) -> None:
    print(
        f"oversized input of {size // MB} MB: "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(figures.items()))
    )
    limit = 40.0  # MB: the 16 MiB request limit plus the server's own working set
    assert figures["rest_content-length_peak_mb"] < limit
    assert figures["rest_chunked_peak_mb"] < limit
    assert figures["ws_peak_mb"] < limit
    # refused on the headers: next to nothing of the body was read
    assert figures["rest_content-length_sent_mb"] < size / MB / 2


@pytest.fixture(scope="module")
def broker(module_db: str, module_logs: Path) -> Iterator[BrokerProc]:
    with brokers(module_db, module_logs, 1) as (b,):
        yield b


def test_oversized_input_is_refused_before_it_is_buffered(broker: BrokerProc) -> None:
    size = 32 * MB
    check(run_oversize(broker, size), size)


@pytest.mark.slow
def test_100_mb_inputs_are_refused_before_they_are_buffered(broker: BrokerProc) -> None:
    size = 100 * MB
    check(run_oversize(broker, size), size)
