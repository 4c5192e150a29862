"""What every scenario shares: the 1 KiB message, the receiving sink, percentiles, results."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Generic, TypeVar

import orjson

#: every benchmark message is exactly this many bytes of JSON
MESSAGE_BYTES = 1024

_PAD = b"x" * MESSAGE_BYTES


class BenchError(Exception):
    """A scenario could not run (a setup step failed, the broker answered an error)."""


def now_ns() -> int:
    """The clock of send and receipt timestamps (monotonic; publisher and consumer share it)."""
    return time.perf_counter_ns()


def make_body(seq: int, size: int = MESSAGE_BYTES) -> bytes:
    """A JSON object of exactly ``size`` bytes carrying its sequence number and send time."""
    head = b'{"seq":%d,"ts":%d,"pad":"' % (seq, now_ns())
    return head + _PAD[: size - len(head) - 2] + b'"}'


def parse_body(body: bytes | str) -> tuple[int, int]:
    """(seq, send timestamp in ns) of a benchmark message."""
    value = orjson.loads(body)
    return int(value["seq"]), int(value["ts"])


def chunks(items: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def shares(count: int, parts: int) -> list[range]:
    """``range(count)`` dealt round-robin to ``parts`` workers."""
    return [range(i, count, parts) for i in range(parts)]


class Sink:
    """Where consumers report what they received: latencies, duplicates, completion."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.latencies_ns: list[int] = []
        self.seen: set[int] = set()
        self.duplicates = 0
        self.done = asyncio.Event()
        self.last_ns = 0
        if expected <= 0:
            self.done.set()

    def record(self, seq: int, sent_ns: int, received_ns: int) -> None:
        if seq in self.seen:
            self.duplicates += 1
            return
        self.seen.add(seq)
        self.latencies_ns.append(received_ns - sent_ns)
        self.last_ns = received_ns
        if len(self.seen) >= self.expected:
            self.done.set()

    def record_body(self, body: bytes | str, received_ns: int) -> None:
        seq, sent = parse_body(body)
        self.record(seq, sent, received_ns)

    @property
    def received(self) -> int:
        return len(self.seen)


T = TypeVar("T")

#: how the consumers of a throughput scenario ack: one ack per message, or in groups
ACK_MODES = ("each", "batch")
#: a batching consumer acks what it holds after this long without reaching its group size
ACK_BATCH_DELAY_S = 0.002


def scenario_name(
    system: str, publish: str, prefetch: int, ack: str, size: str = "prefetch"
) -> str:
    """``mx ws publish=batch prefetch=100`` (acks one by one), ``… ack=batch`` in groups;
    pull scenarios name their ``size`` ``max_messages``."""
    name = f"{system} publish={publish} {size}={prefetch}"
    return name if ack == "each" else f"{name} ack={ack}"


def ack_group_size(prefetch: int) -> int:
    """A batching consumer acks in groups of half its prefetch window (so credit comes back
    while the other half is still being worked on), the usual AMQP ``multiple`` practice."""
    return max(1, prefetch // 2)


class AckBatcher(Generic[T]):
    """Collects what a consumer has handled and acks it in groups: at ``size`` items, or
    ACK_BATCH_DELAY_S after the first of a group, whichever comes first. ``send`` gets the
    group (MessageX: one ``ACK`` frame with ``delivery_tags``; RabbitMQ: ``basic.ack`` of
    the last one with ``multiple``)."""

    def __init__(self, size: int, send: Callable[[list[T]], Awaitable[None] | None]) -> None:
        self.size = size
        self.send = send
        self.pending: list[T] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def add(self, item: T) -> None:
        if self._add(item):
            await self.flush()

    def add_nowait(self, item: T) -> None:
        """``add`` for a ``send`` that does not wait (returns None)."""
        if self._add(item):
            self.send(self._take())

    def _add(self, item: T) -> bool:
        """Queue ``item``; True when its group is full."""
        self.pending.append(item)
        if len(self.pending) >= self.size:
            return True
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(ACK_BATCH_DELAY_S, self._on_timer)
        return False

    def _take(self) -> list[T]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        group, self.pending = self.pending, []
        return group

    async def flush(self) -> None:
        group = self._take()
        if group:
            sent = self.send(group)
            if sent is not None:
                await sent

    async def drain(self) -> None:
        """Send what is pending now and wait for every send already started, so nothing is
        sent after this returns (a consumer's channel or socket may be closed next)."""
        await self.flush()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _on_timer(self) -> None:
        self._timer = None
        task = asyncio.ensure_future(self.flush())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def latency_summary(samples_ns: Iterable[int]) -> dict[str, float] | None:
    """p50/p95/p99/max/mean in milliseconds, or None without samples."""
    values = sorted(v / 1e6 for v in samples_ns)
    if not values:
        return None
    return {
        "p50": round(percentile(values, 0.50), 3),
        "p95": round(percentile(values, 0.95), 3),
        "p99": round(percentile(values, 0.99), 3),
        "max": round(values[-1], 3),
        "mean": round(sum(values) / len(values), 3),
        "n": len(values),
    }


def pace_check(latencies_ns: Sequence[int], interval_s: float) -> tuple[dict[str, float], str]:
    """Median latency of the first and last fifth of a paced run (in arrival order), and a
    note when it grows: the consumer is not keeping up and messages queue up."""
    fifth = max(1, len(latencies_ns) // 5)
    first = sorted(latencies_ns[:fifth])
    last = sorted(latencies_ns[-fifth:])
    if not first:
        return {}, ""
    trend = {
        "first_fifth_p50_ms": round(percentile(first, 0.5) / 1e6, 3),
        "last_fifth_p50_ms": round(percentile(last, 0.5) / 1e6, 3),
    }
    grows = trend["last_fifth_p50_ms"] > max(1.5 * trend["first_fifth_p50_ms"], 5e3 * interval_s)
    note = (
        f"latency grows during the run ({trend['first_fifth_p50_ms']:.0f} → "
        f"{trend['last_fifth_p50_ms']:.0f} ms): the consumer does not keep up with this pace"
        if grows
        else ""
    )
    return trend, note


@dataclass
class Result:
    """One scenario's outcome, as it goes into the JSON and the table."""

    group: str
    name: str
    params: dict[str, Any]
    status: str = "ok"
    messages: int = 0
    elapsed_s: float | None = None
    rate: float | None = None
    latency_ms: dict[str, float] | None = None
    cpu_s_per_1k: dict[str, float | None] = field(default_factory=dict)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def throughput_result(
    group: str,
    name: str,
    params: dict[str, Any],
    sink: Sink,
    started_ns: int,
    status: str,
) -> Result:
    """Rate from the first publish to the last delivery; latencies from the sink."""
    elapsed = (sink.last_ns - started_ns) / 1e9 if sink.received else None
    rate = sink.received / elapsed if elapsed else None
    result = Result(
        group=group,
        name=name,
        params=params,
        status=status,
        messages=sink.received,
        elapsed_s=round(elapsed, 4) if elapsed else None,
        rate=round(rate, 1) if rate else None,
        latency_ms=latency_summary(sink.latencies_ns),
    )
    if sink.duplicates:
        result.extra["duplicates"] = sink.duplicates
    if status == "ok" and sink.received < sink.expected:
        result.status = "incomplete"
    return result


async def race(done: asyncio.Event, tasks: Sequence[asyncio.Task[Any]], limit_s: float) -> str:
    """Wait until ``done`` is set ("ok"), a task fails (raises), or ``limit_s`` passes
    ("timeout"). Tasks that end normally (publishers) are simply no longer watched."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    waiter = asyncio.ensure_future(done.wait())
    pending: set[asyncio.Future[Any]] = {waiter, *tasks}
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            finished, pending = await asyncio.wait(
                pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter in finished:
                return "ok"
            for task in finished:
                exc = task.exception()
                if exc is not None:
                    raise exc
    finally:
        waiter.cancel()


def failure(tasks: Iterable[asyncio.Task[Any]]) -> str:
    """The first error of a finished task (after ``race`` returned, errors go unraised)."""
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            return f"{type(exc).__name__}: {exc}"
    return ""


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
