"""Issue 18, finding 1: what a stranger can make the broker hold before authenticating.

On main every PING before AUTH got a PONG queued without limit, each pinning about 4 KiB
(orjson over-allocates small outputs), and a closed connection sat in a reference cycle the
tuned collector seldom visited: a raw socket that never read and sent 300,000 PINGs (28 MB)
in 4 s took the broker from 96 to 1,139 MiB, and none of it came back. Contract §8: before
authentication the server answers at most 10 frames and closes on the 11th with 1008.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.faults.harness import BrokerProc, brokers, raw_upgrade
from tests.support import wait_for

MB = 1024 * 1024
PINGS = 300_000
SECONDS = 4.0


@pytest.fixture(scope="module")
def broker(module_db: str, module_logs: Path) -> Iterator[BrokerProc]:
    with brokers(module_db, module_logs, 1, MESSAGEX_LOG_LEVEL="warning") as (b,):
        yield b


def ping_frames(first: int, n: int) -> bytes:
    """``n`` masked PING frames (ids from ``first``), with a zero mask: cheap to make."""
    out = bytearray()
    for i in range(first, first + n):
        payload = b'{"type":"PING","id":%d}' % i
        out += bytes((0x81, 0x80 | len(payload))) + b"\0\0\0\0" + payload
    return bytes(out)


def flood(sock: socket.socket, total: int, seconds: float) -> tuple[int, int]:
    """Send up to ``total`` PINGs within ``seconds``, never reading; returns how many went
    and their bytes (the server may stop reading or close: that ends the flood)."""
    block = ping_frames(0, 5000)
    sock.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < total and time.monotonic() < deadline:
        batch = min(5000, total - sent)
        try:
            sock.sendall(block if batch == 5000 else ping_frames(0, batch))
        except (TimeoutError, OSError):
            break
        sent += batch
    return sent, sent * len(block) // 5000


def parse(data: bytes) -> tuple[list[bytes], int | None, bool]:
    """Server frames in ``data``: (text payloads, close code, whether a close was seen)."""
    texts: list[bytes] = []
    at = 0
    while at + 2 <= len(data):
        opcode, length = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if length == 126:
            (length,) = struct.unpack("!H", data[at : at + 2])
            at += 2
        elif length == 127:
            (length,) = struct.unpack("!Q", data[at : at + 8])
            at += 8
        if at + length > len(data):
            break
        payload = data[at : at + length]
        at += length
        if opcode == 8:
            code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
            return texts, code, True
        texts.append(payload)
    return texts, None, False


def server_frames(sock: socket.socket, timeout: float) -> tuple[list[bytes], int | None]:
    """Read the server's frames until its close frame (or EOF, or ``timeout``): (text
    payloads, close code)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(TimeoutError, OSError):
        while chunk := sock.recv(65536):
            data += chunk
            texts, code, closed = parse(data)
            if closed:
                return texts, code
    texts, code, _ = parse(data)
    return texts, code


def test_a_ping_flood_before_auth_holds_no_memory(broker: BrokerProc) -> None:
    baseline = broker.rss()
    sock = raw_upgrade(broker.port)
    started = time.monotonic()
    sent, size = flood(sock, PINGS, SECONDS)
    flooded = time.monotonic() - started
    time.sleep(0.5)  # let the broker read what is in flight
    peak = broker.rss()
    texts, code = server_frames(sock, 5)
    sock.close()
    # the broker is still serving, and what it held is gone
    assert httpx.get(f"{broker.base_url}/readyz", timeout=5).status_code == 200
    after = broker.rss()
    print(
        f"unauthenticated PING flood: {sent} PINGs ({size / MB:.1f} MiB) sent in "
        f"{flooded:.1f} s, never read; broker RSS {baseline / MB:.0f} → {peak / MB:.0f} MiB "
        f"(+{(peak - baseline) / MB:.1f}), {after / MB:.0f} MiB after close; "
        f"{len(texts)} replies, close code {code}"
    )
    assert code == 1008
    assert len(texts) == 10
    assert all(b'"PONG"' in t for t in texts)
    assert peak - baseline < 16 * MB
    assert after - baseline < 16 * MB


def test_many_unauthenticated_floods_leave_nothing_behind(broker: BrokerProc) -> None:
    """Connections closed by the rule are freed at once (no cycle waits for the collector):
    200 of them, each sending 20 PINGs, leave the broker's memory where it was."""
    baseline = broker.rss()
    for _ in range(200):
        sock = raw_upgrade(broker.port)
        flood(sock, 20, 2)
        _, code = server_frames(sock, 5)
        sock.close()
        assert code == 1008
    wait_for(
        lambda: broker.rss() - baseline < 8 * MB,
        10,
        message=f"broker RSS back near {baseline / MB:.0f} MiB (now {broker.rss() / MB:.0f})",
    )
