"""A small synchronous WebSocket test client for the MessageX protocol (contract §8).

Built on ``websockets.sync.client``. Frames are JSON text frames; ``expect`` waits for a frame
of one type and records the ``MESSAGE_DELIVERED`` frames that arrive meanwhile (so a test can
wait for a reply without losing deliveries). Every wait has a deadline: a test never sleeps.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import socket
import struct
import time
from collections import deque
from typing import Any

import httpx
import orjson
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Origin

from app.broker.wakeups import WakeHub
from tests.asyncapi_check import check_client_frame, check_server_frame
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer

DELIVERED = "MESSAGE_DELIVERED"

_ids = itertools.count(1)


def basic(username: str = ADMIN_USER, password: str = ADMIN_PASSWORD) -> dict[str, str]:
    raw = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class WsClient:
    """One WebSocket connection. ``deliveries`` holds MESSAGE_DELIVERED frames not yet taken."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.deliveries: deque[dict[str, Any]] = deque()
        self.connected: dict[str, Any] | None = None

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str,
        headers: dict[str, str] | None = None,
        *,
        origin: str | None = None,
        max_size: int | None = 16 * 1024 * 1024,
    ) -> WsClient:
        """Open the socket (no authentication step: pass headers, or send AUTH yourself)."""
        ws = connect(
            url,
            additional_headers=headers or {},
            origin=Origin(origin) if origin is not None else None,
            proxy=None,
            open_timeout=10,
            close_timeout=2,
            max_size=max_size,
            compression=None,
            legacy=True,  # a plain connection object, closed by WsClient.close()
        )
        return cls(ws)

    @classmethod
    def admin(cls, url: str) -> WsClient:
        """Authenticated as the bootstrap admin by header; CONNECTED already received."""
        return cls.as_user(url, ADMIN_USER, ADMIN_PASSWORD)

    @classmethod
    def as_user(cls, url: str, username: str, password: str) -> WsClient:
        client = cls.open(url, basic(username, password))
        client.connected = client.expect("CONNECTED")
        return client

    @classmethod
    def with_token(cls, url: str, token: str) -> WsClient:
        client = cls.open(url, bearer(token))
        client.connected = client.expect("CONNECTED")
        return client

    # -- raw frames -------------------------------------------------------------------------

    def send_json(self, frame: dict[str, Any]) -> None:
        check_client_frame(frame)
        self.ws.send(orjson.dumps(frame).decode())

    def send_raw(self, data: str | bytes) -> None:
        self.ws.send(data)

    def recv_json(self, timeout: float = 5.0) -> dict[str, Any]:
        """The next frame, whatever it is. TimeoutError when none arrives in time."""
        data = self.ws.recv(timeout=timeout)
        assert isinstance(data, str), f"the server sent a binary frame: {data!r}"
        frame = json.loads(data)  # the stdlib: integers beyond 64 bits stay exact
        assert isinstance(frame, dict), frame
        assert isinstance(frame.get("type"), str), frame
        check_server_frame(frame)
        return frame

    # -- waiting for frames -----------------------------------------------------------------

    def expect(
        self, type: str, timeout: float = 5.0, *, id: Any = None, allow: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """Wait for a frame of ``type`` (and ``id`` when given).

        MESSAGE_DELIVERED frames met on the way are recorded in ``deliveries``; frames whose
        type is in ``allow`` are skipped; any other frame fails the test.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {type} frame within {timeout}s")
            try:
                frame = self.recv_json(remaining)
            except TimeoutError:
                raise AssertionError(f"no {type} frame within {timeout}s") from None
            if frame["type"] == type and (id is None or frame.get("id") == id):
                return frame
            if frame["type"] == DELIVERED and type != DELIVERED:
                self.deliveries.append(frame)
                continue
            if frame["type"] in allow:
                continue
            raise AssertionError(f"expected {type} (id={id!r}), got {frame}")

    def delivery(self, timeout: float = 5.0) -> dict[str, Any]:
        """The next MESSAGE_DELIVERED frame (recorded ones first)."""
        if self.deliveries:
            return self.deliveries.popleft()
        return self.expect(DELIVERED, timeout)

    def deliveries_n(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        out = []
        for _ in range(n):
            out.append(self.delivery(max(deadline - time.monotonic(), 0.001)))
        return out

    def request(self, frame: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        """Send ``frame`` with a fresh id; return the one reply carrying that id (any type)."""
        frame_id = frame.get("id", f"r{next(_ids)}")
        self.send_json({**frame, "id": frame_id})
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no reply to {frame} within {timeout}s")
            try:
                reply = self.recv_json(remaining)
            except TimeoutError:
                raise AssertionError(f"no reply to {frame} within {timeout}s") from None
            if reply.get("id") == frame_id:
                return reply
            if reply["type"] == DELIVERED:
                self.deliveries.append(reply)
                continue
            raise AssertionError(f"unexpected frame {reply} while waiting for a reply to {frame}")

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Every frame that arrives within ``seconds`` (an empty list means the socket was
        quiet). Waits the whole time: use for 'nothing more arrives' assertions."""
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                frames.append(self.recv_json(remaining))
            except TimeoutError:
                break
        return frames

    def expect_close(self, timeout: float = 5.0) -> tuple[int | None, list[dict[str, Any]]]:
        """Read until the server closes; returns (close code, frames received before it)."""
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the server did not close within {timeout}s: {frames}")
            try:
                frames.append(self.recv_json(remaining))
            except TimeoutError:
                continue
            except ConnectionClosed as exc:
                return (exc.rcvd.code if exc.rcvd is not None else None), frames

    # -- protocol shortcuts -----------------------------------------------------------------

    def subscribe(self, queue: str, prefetch: int = 1) -> dict[str, Any]:
        reply = self.request({"type": "SUBSCRIBE", "queue": queue, "prefetch": prefetch})
        assert reply["type"] == "SUBSCRIBED", reply
        return reply

    def ack(self, tag: str) -> dict[str, Any]:
        return self.request({"type": "ACK", "delivery_tag": tag})

    def nack(self, tag: str, requeue: bool = True) -> dict[str, Any]:
        return self.request({"type": "NACK", "delivery_tag": tag, "requeue": requeue})

    def burst(self, frames: list[dict[str, Any]]) -> None:
        """Write ``frames`` in ONE TCP write, so that the server reads them all at once."""
        self.ws.socket.sendall(b"".join(_masked(1, orjson.dumps(f)) for f in frames))

    def burst_and_close(self, frames: list[dict[str, Any]]) -> None:
        """Write ``frames`` and a close frame in ONE TCP write, then drop the socket.

        The server then reads them all at once, which is how a client that ACKs and exits
        looks on a busy network; the library's own send path would space them out.
        """
        data = b"".join(_masked(1, orjson.dumps(f)) for f in frames)
        data += _masked(8, (1000).to_bytes(2, "big"))
        self.ws.socket.sendall(data)
        with contextlib.suppress(OSError):  # the server may have closed it already
            self.ws.socket.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.ws.close()

    def __enter__(self) -> WsClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _masked(opcode: int, payload: bytes) -> bytes:
    """One final client frame (RFC 6455 §5.2: client frames are masked)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, 0x80 | n])
    elif n < 65536:
        head = bytes([0x80 | opcode, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x80 | opcode, 0x80 | 127]) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def refused_status(
    url: str, headers: dict[str, str] | None = None, origin: str | None = None
) -> int:
    """The HTTP status of an upgrade the server refuses (fails when it is accepted)."""
    try:
        client = WsClient.open(url, headers, origin=origin)
    except InvalidStatus as exc:
        return exc.response.status_code
    client.close()
    raise AssertionError("the upgrade was accepted")


def wake_hub(server: LiveServer) -> WakeHub:
    """The delivery engine's wake-up hub of an in-process test server (white box: the only
    way to know that a long poll is really parked before publishing)."""
    return server.services.delivery.hub


def waiting_on(server: LiveServer, queue_id: int) -> int:
    """How many waiters (long polls, dispatchers) are parked on a queue's wake-up."""
    return len(wake_hub(server)._events.get(queue_id, ()))


# -- REST set-up helpers ------------------------------------------------------------------


def declare_queue(admin: httpx.Client, name: str, **body: Any) -> dict[str, Any]:
    r = admin.put(f"/queues/{name}", json=body)
    assert r.status_code in (200, 201), r.text
    result: dict[str, Any] = r.json()
    return result


def bind(admin: httpx.Client, exchange: str, queue: str, key: str = "") -> None:
    r = admin.post("/bindings", json={"exchange": exchange, "queue": queue, "routing_key": key})
    assert r.status_code in (200, 201), r.text


def publish(admin: httpx.Client, queue: str, body: Any = "m", **extra: Any) -> dict[str, Any]:
    """Publish straight into ``queue`` (the default exchange); ``body_base64=`` replaces body."""
    payload = extra if "body_base64" in extra else {"body": body, **extra}
    r = admin.post(f"/queues/{queue}/messages", json=payload)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def publish_many(admin: httpx.Client, queue: str, bodies: list[Any]) -> None:
    """Publish through ``amq.direct`` (``queue`` must be bound with key = its name)."""
    for start in range(0, len(bodies), 1000):
        chunk = bodies[start : start + 1000]
        r = admin.post(
            "/exchanges/amq.direct/publish-batch",
            json={"messages": [{"routing_key": queue, "body": b} for b in chunk]},
        )
        assert r.status_code == 200, r.text
        assert all(res["routed"] for res in r.json()["results"])


def stats(admin: httpx.Client, queue: str) -> dict[str, int]:
    r = admin.get(f"/queues/{queue}")
    assert r.status_code == 200, r.text
    result: dict[str, int] = r.json()["stats"]
    return result


def browse(admin: httpx.Client, queue: str, status: str | None = None) -> list[dict[str, Any]]:
    params = {"limit": 1000} | ({"status": status} if status else {})
    r = admin.get(f"/queues/{queue}/messages", params=params)
    assert r.status_code == 200, r.text
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def make_user(
    admin: httpx.Client,
    name: str,
    password: str = "user-password-1",
    *,
    configure: str = "",
    write: str = "",
    read: str = ".*",
) -> None:
    r = admin.put(
        f"/users/{name}",
        json={
            "password": password,
            "role": "user",
            "permissions": {"configure": configure, "write": write, "read": read},
        },
    )
    assert r.status_code in (200, 201), r.text
