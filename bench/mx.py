"""MessageX end to end: HTTP publish → WebSocket consumers or HTTP pull, and idle latency."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from bench.infra import Meters
from bench.stats import (
    AckBatcher,
    BenchError,
    Result,
    Sink,
    ack_group_size,
    cancel_all,
    chunks,
    failure,
    latency_summary,
    make_body,
    now_ns,
    pace_check,
    race,
    scenario_name,
    shares,
    throughput_result,
)
from bench.wsclient import WsClient

JSON = {"content-type": "application/json"}
#: the direct exchange every bench queue is bound to (routing key = queue name)
EXCHANGE = "bench.direct"
#: messages per publish-batch request
BATCH = 100
#: pull acks in flight at once per pull consumer (there is no batch ack; SQS deletes by 10)
ACK_CONCURRENCY = 10

_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_names)}-{int(time.time() * 1000) % 1_000_000}"


class RawHttp:
    """A keep-alive HTTP/1.1 connection that sends pre-built requests and reads the reply.

    For the scenarios where the client's own cost would be measured as the broker's: httpx's
    async client spends ~2 ms of the harness's CPU per request on this machine (sequential
    publishes to one broker: p50 5.6 ms with httpx.AsyncClient, 3.4 ms with this), and in a
    latency test that time lands between the timestamp and the delivery.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> RawHttp:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    @staticmethod
    def post_request(port: int, authorization: str, path: str, body: bytes) -> bytes:
        return RawHttp.request("POST", port, authorization, path, body)

    @staticmethod
    def request(method: str, port: int, authorization: str, path: str, body: bytes) -> bytes:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: {authorization}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    async def send(self, request: bytes, expect: int = 200) -> bytes:
        """Send one request; the response body. Raises BenchError unless the status is
        ``expect``."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        body = await self.reader.readexactly(length)
        if not head.startswith(b"HTTP/1.1 %d" % expect):
            status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
            method, path = request.split(b" ", 2)[:2]
            raise BenchError(f"{method.decode()} {path!r} → {status_line}: {body[:300]!r}")
        return body

    def close(self) -> None:
        self.writer.close()


@dataclass
class Mx:
    """An HTTP client for /api/v1 and WebSocket consumers, authenticated with HTTP Basic."""

    base_url: str
    ws_url: str
    user: str
    password: str
    http: httpx.AsyncClient = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        self.authorization = f"Basic {token}"
        self.http = httpx.AsyncClient(
            base_url=self.base_url + "/api/v1",
            headers={"authorization": self.authorization},
            limits=httpx.Limits(max_connections=128, max_keepalive_connections=128),
            timeout=httpx.Timeout(30.0),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, body: Any = None, ok: int = 200) -> Any:
        content = None if body is None else orjson.dumps(body)
        response = await self.http.request(method, path, content=content, headers=JSON)
        if response.status_code not in (ok, 201, 204):
            raise BenchError(f"{method} {path} → {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    async def setup(self) -> None:
        await self.call("PUT", f"/exchanges/{EXCHANGE}", {"type": "direct"})

    async def declare_queue(self, name: str) -> None:
        await self.call("PUT", f"/queues/{name}", {})
        body = {"exchange": EXCHANGE, "queue": name, "routing_key": name}
        await self.call("POST", "/bindings", body)

    async def delete_queue(self, name: str) -> None:
        with contextlib.suppress(BenchError, httpx.HTTPError):
            await self.call("DELETE", f"/queues/{name}")

    async def stats(self, name: str) -> dict[str, int]:
        queue = await self.call("GET", f"/queues/{name}")
        stats: dict[str, int] = queue["stats"]
        return stats

    async def counters(self) -> dict[str, float]:
        """The broker's counters (summed over their labels), from /metrics."""
        response = await self.http.get(f"{self.base_url}/metrics")
        totals: dict[str, float] = {}
        for line in response.text.splitlines():
            if line.startswith("messagex_") and "_total" in line:
                name = line.split("{", 1)[0].split(" ", 1)[0]
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return totals

    async def wait_drained(self, name: str, within: float) -> bool:
        """Poll until the queue holds nothing ready or in flight (all acks committed)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            stats = await self.stats(name)
            if stats["ready"] == 0 and stats["in_flight"] == 0 and stats["delayed"] == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    # -- publishing -------------------------------------------------------------------------

    async def publish_one(self, queue: str, seq: int) -> None:
        content = b'{"body":' + make_body(seq) + b"}"
        response = await self.http.post(f"/queues/{queue}/messages", content=content, headers=JSON)
        if response.status_code != 200:
            raise BenchError(f"publish → {response.status_code}: {response.text[:300]}")

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def post(self, path: str, body: bytes) -> bytes:
        """A ready-to-send ``POST /api/v1{path}`` for RawHttp."""
        return self.raw("POST", path, body)

    def raw(self, method: str, path: str, body: bytes) -> bytes:
        """A ready-to-send ``{method} /api/v1{path}`` for RawHttp."""
        return RawHttp.request(method, self.port, self.authorization, "/api/v1" + path, body)

    async def publisher(self, queue: str, seqs: range, mode: str) -> None:
        """Publish ``seqs`` over one keep-alive connection (RawHttp: the load generator must
        not be what limits the figure), one message or BATCH per request."""
        http = await RawHttp.open(self.port)
        try:
            if mode == "single":
                for seq in seqs:
                    body = b'{"body":' + make_body(seq) + b"}"
                    await http.send(self.post(f"/queues/{queue}/messages", body))
            else:
                key = b'{"routing_key":"' + queue.encode() + b'","body":'
                for chunk in chunks(seqs, BATCH):
                    items = b",".join(key + make_body(seq) + b"}" for seq in chunk)
                    body = b'{"messages":[' + items + b"]}"
                    await http.send(self.post(f"/exchanges/{EXCHANGE}/publish-batch", body))
        finally:
            http.close()

    # -- consuming --------------------------------------------------------------------------

    async def subscribe(self, queue: str, prefetch: int) -> WsClient:
        ws = await WsClient.open(self.ws_url, {"Authorization": self.authorization})
        try:
            hello = await ws.recv_json()
            if hello.get("type") != "CONNECTED":
                raise BenchError(f"expected CONNECTED, got {hello}")
            ws.send_json({"type": "SUBSCRIBE", "queue": queue, "prefetch": prefetch})
            reply = await ws.recv_json()
            if reply.get("type") != "SUBSCRIBED":
                raise BenchError(f"expected SUBSCRIBED, got {reply}")
        except BaseException:
            ws.abort()
            raise
        return ws

    @staticmethod
    async def ws_consumer(ws: WsClient, sink: Sink, ack_group: int | None = None) -> None:
        """Receive deliveries and ack every one (no frame id: the broker sends no reply):
        one ``ACK`` frame each, or, with ``ack_group``, one ``ACK`` with ``delivery_tags``
        per group (AckBatcher). Returns when the connection closes."""
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def ack_many(tags: list[str]) -> None:
            ws.send_json({"type": "ACK", "delivery_tags": tags})

        batcher = AckBatcher(ack_group, ack_many) if ack_group is not None else None

        def on_text(raw: bytes) -> None:
            received = now_ns()
            frame = orjson.loads(raw)
            if frame.get("type") != "MESSAGE_DELIVERED":
                if frame.get("type") == "ERROR" and not failed.done():
                    failed.set_exception(BenchError(f"broker sent {frame}"))
                return
            body = frame["body"]
            sink.record(body["seq"], body["ts"], received)
            tag = frame["delivery_tag"]
            if batcher is not None:
                batcher.add_nowait(tag)
            else:  # written with the others of this read (WsClient)
                ws.send_text(b'{"type":"ACK","delivery_tag":"%s"}' % tag.encode())

        while not ws.inbox.empty():  # frames that came before this consumer started
            raw = ws.inbox.get_nowait()
            if raw is not None:
                on_text(raw)
        ws.flush()
        ws.on_text = on_text
        await asyncio.wait({failed, ws.closed}, return_when=asyncio.FIRST_COMPLETED)
        if failed.done():
            failed.result()

    async def pull_consumer(
        self, queue: str, max_messages: int, sink: Sink, ack: str = "each"
    ) -> None:
        """POST /queues/{q}/get, then ack every delivery: one request each (up to
        ACK_CONCURRENCY at once), or, with ``ack="batch"``, one ``POST /deliveries/ack`` for
        all that the get returned."""
        get = self.post(
            f"/queues/{queue}/get", orjson.dumps({"max_messages": max_messages, "wait_ms": 200})
        )
        http = await RawHttp.open(self.port)
        idle: asyncio.Queue[RawHttp] = asyncio.Queue()
        for _ in range(ACK_CONCURRENCY):
            idle.put_nowait(await RawHttp.open(self.port))

        async def ack_one(tag: str) -> None:
            conn = await idle.get()
            try:
                await conn.send(self.post(f"/deliveries/{tag}/ack", b""), expect=204)
            finally:
                idle.put_nowait(conn)

        try:
            while not sink.done.is_set():
                answer = await http.send(get)
                received = now_ns()
                messages = orjson.loads(answer)["messages"]
                for m in messages:
                    sink.record(m["body"]["seq"], m["body"]["ts"], received)
                if ack == "batch" and messages:
                    tags = [m["delivery_tag"] for m in messages]
                    body = orjson.dumps({"delivery_tags": tags})
                    await http.send(self.post("/deliveries/ack", body))
                else:
                    await asyncio.gather(*(ack_one(m["delivery_tag"]) for m in messages))
        finally:
            http.close()
            while not idle.empty():
                idle.get_nowait().close()


@dataclass
class Settings:
    """What every MessageX scenario shares."""

    mx: Mx
    meters: Meters
    count: int
    publishers: int
    consumers: int
    deadline: float
    workers: int = 1


#: broker counters whose deltas say how well the hot path batches (see docs/operations.md)
_COUNTERS = (
    "messagex_publish_group_writes_total",
    "messagex_claim_statements_total",
    "messagex_ack_statements_total",
    "messagex_messages_delivered_total",
    "messagex_deliveries_handed_off_total",
    "messagex_messages_acked_total",
)


def _per(total: float, statements: float) -> float | None:
    return round(total / statements, 1) if statements else None


async def _batching(s: Settings, before: dict[str, float] | None) -> dict[str, Any]:
    """Messages per statement over the scenario, from the broker's counters (one process's
    counters: only with a single worker)."""
    if before is None:
        return {}
    after = await s.mx.counters()
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _COUNTERS}
    return {
        "statements": {
            "group_writes": d["messagex_publish_group_writes_total"],
            "claims": d["messagex_claim_statements_total"],
            "acks": d["messagex_ack_statements_total"],
        },
        "handed_off": d["messagex_deliveries_handed_off_total"],
        "deliveries_per_claim": _per(
            d["messagex_messages_delivered_total"] - d["messagex_deliveries_handed_off_total"],
            d["messagex_claim_statements_total"],
        ),
        "acks_per_statement": _per(
            d["messagex_messages_acked_total"], d["messagex_ack_statements_total"]
        ),
    }


async def _counters_before(s: Settings) -> dict[str, float] | None:
    return await s.mx.counters() if s.workers == 1 else None


async def _finish(
    s: Settings, queue: str, status: str, tasks: list[asyncio.Task[Any]], sink: Sink
) -> tuple[str, str]:
    """Wait until every ack is committed (consumers still running), stop the load, read the
    meters."""
    note = ""
    if status == "ok" and not await s.mx.wait_drained(queue, within=min(s.deadline, 15)):
        note = f"queue not drained after the run {failure(tasks)}".rstrip()
    await cancel_all(tasks)
    s.meters.stop()
    return status, note


async def ws_throughput(s: Settings, mode: str, prefetch: int, ack: str = "each") -> Result:
    """HTTP publish (single or batches of 100) → WebSocket consumers that ack every message,
    one frame each (``ack="each"``) or in groups (``"batch"``)."""
    queue = unique(f"ws-{mode}-p{prefetch}")
    params = {
        "transport": "websocket",
        "publish": mode,
        "prefetch": prefetch,
        "ack": ack,
        "publishers": s.publishers,
        "consumers": s.consumers,
    }
    name = scenario_name("mx ws", mode, prefetch, ack)
    await s.mx.declare_queue(queue)
    sockets: list[WsClient] = []
    tasks: list[asyncio.Task[Any]] = []
    sink = Sink(s.count)
    try:
        for _ in range(s.consumers):
            sockets.append(await s.mx.subscribe(queue, prefetch))
        before = await _counters_before(s)
        s.meters.start()
        started = now_ns()
        group = ack_group_size(prefetch) if ack == "batch" else None
        tasks += [asyncio.create_task(s.mx.ws_consumer(ws, sink, group)) for ws in sockets]
        tasks += [
            asyncio.create_task(s.mx.publisher(queue, seqs, mode))
            for seqs in shares(s.count, s.publishers)
        ]
        status = await race(sink.done, tasks, s.deadline)
        status, note = await _finish(s, queue, status, tasks, sink)
        result = throughput_result("messagex", name, params, sink, started, status)
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        result.note = note
        result.extra.update(await _batching(s, before))
        return result
    finally:
        await cancel_all(tasks)
        for ws in sockets:
            await ws.close()
        await s.mx.delete_queue(queue)


async def pull_throughput(s: Settings, mode: str, max_messages: int, ack: str = "each") -> Result:
    """HTTP publish → HTTP pull (get up to max_messages, then ack each over HTTP, or all of
    them with one request)."""
    queue = unique(f"pull-{mode}-m{max_messages}")
    params = {
        "transport": "http-pull",
        "publish": mode,
        "max_messages": max_messages,
        "ack": ack,
        "publishers": s.publishers,
        "consumers": s.consumers,
    }
    name = scenario_name("mx pull", mode, max_messages, ack, "max_messages")
    await s.mx.declare_queue(queue)
    sink = Sink(s.count)
    tasks: list[asyncio.Task[Any]] = []
    try:
        before = await _counters_before(s)
        s.meters.start()
        started = now_ns()
        tasks += [
            asyncio.create_task(s.mx.pull_consumer(queue, max_messages, sink, ack))
            for _ in range(s.consumers)
        ]
        tasks += [
            asyncio.create_task(s.mx.publisher(queue, seqs, mode))
            for seqs in shares(s.count, s.publishers)
        ]
        status = await race(sink.done, tasks, s.deadline)
        status, note = await _finish(s, queue, status, tasks, sink)
        result = throughput_result("messagex", name, params, sink, started, status)
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        result.note = note
        result.extra.update(await _batching(s, before))
        return result
    finally:
        await cancel_all(tasks)
        await s.mx.delete_queue(queue)


async def paced(count: int, interval: float, send: Any) -> list[int]:
    """Call ``send(i)`` every ``interval`` seconds, ``count`` times; returns each call's ns."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    durations: list[int] = []
    for i in range(count):
        delay = start + i * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t0 = now_ns()
        await send(i)
        durations.append(now_ns() - t0)
    return durations


#: ``publish(queue, seq)`` of the idle scenario, when another way than REST is measured
IdlePublish = Callable[[str, int], Awaitable[None]]


async def idle_latency(
    s: Settings,
    count: int,
    interval: float = 0.01,
    *,
    via: IdlePublish | None = None,
    name: str = "mx idle 1 msg/10 ms",
    group: str = "idle",
) -> Result:
    """One message every 10 ms to a subscribed consumer (prefetch 1); the publisher is a raw
    keep-alive HTTP connection (RawHttp), or ``via``, the consumer a WebSocket."""
    queue = unique("idle")
    await s.mx.declare_queue(queue)
    sink = Sink(count)
    client = "raw" if via is None else "sql"
    params = {"interval_ms": interval * 1000, "prefetch": 1, "publish": "single", "client": client}
    ws = await s.mx.subscribe(queue, 1)
    http = await RawHttp.open(s.mx.port)

    async def publish(seq: int) -> None:
        if via is not None:
            await via(queue, seq)
            return
        body = b'{"body":' + make_body(seq) + b"}"
        await http.send(s.mx.post(f"/queues/{queue}/messages", body))

    tasks: list[asyncio.Task[Any]] = []
    try:
        before = await _counters_before(s)
        s.meters.start()
        started = now_ns()
        consumer = asyncio.create_task(s.mx.ws_consumer(ws, sink))
        publisher = asyncio.create_task(paced(count, interval, publish))
        tasks += [consumer, publisher]
        status = await race(sink.done, [consumer, publisher], s.deadline + count * interval)
        confirms = publisher.result() if publisher.done() and not publisher.cancelled() else []
        status, note = await _finish(s, queue, status, [consumer, publisher], sink)
        result = throughput_result(group, name, params, sink, started, status)
        result.rate = None
        result.cpu_s_per_1k = s.meters.per_1k(sink.received)
        result.extra["publish_confirm_ms"] = latency_summary(confirms)
        result.extra.update(await _batching(s, before))
        trend, growth = pace_check(sink.latencies_ns, interval)
        result.extra.update(trend)
        result.note = f"{note} {growth}".strip()
        return result
    finally:
        await cancel_all(tasks)
        http.close()
        await ws.close()
        await s.mx.delete_queue(queue)
