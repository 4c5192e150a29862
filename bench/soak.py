"""``python -m bench soak --minutes N``: steady load for a long time, to see what drifts.

Issue 23 item 1. The headline scenario's load (4 publishers of ``publish-batch`` requests of
100 1 KiB messages, 2 WebSocket consumers with prefetch 100 acking every delivery) runs
paced at half of the maximum rate, measured first for a short time on the same broker and
database (or given with ``--rate``). Every ``--report-every`` seconds (60) a row is taken:
the rates published and delivered, publish → delivery p50/p99 (the send time is in each
body), the queue's backlog, the hot tables' total, heap and index sizes, each of their
indexes, live and dead tuples and autovacuum runs (pg_stat_user_tables), the broker's RSS
and the machine's load average. The rows go to ``soak.csv`` and ``soak.json`` (written
after every row, so a killed run keeps what it measured) and a plot to ``soak.png``.

The targets (``verdict`` in the JSON) compare an early window, after warm-up, with the
last part of the run: for 30 minutes, minutes 5-10 against 25-30 (the same sixths of any
other length): p99 and RSS within 20 %, and the hot tables and their indexes not growing
beyond 20 % once the load is steady (autovacuum keeps up): the largest size of the last
sixth against the largest reached between the warm-up and the last sixth.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import platform
import sys
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench import mx
from bench.infra import DEFAULT_DATABASE_URL, ROOT, BrokerProcess, Postgres
from bench.stats import BenchError, Sink, make_body, percentile
from bench.wsclient import WsClient

#: the tables a published, delivered and acked message writes to (publish_receipts: one row
#: per publish statement, swept), or that the broker writes on a timer while it runs
HOT_TABLES = ("messages", "publish_receipts", "publish_dedup", "queue_samples", "broker_processes")
#: the autovacuum settings of the server, recorded with the run
AUTOVACUUM_SETTINGS = (
    "autovacuum",
    "autovacuum_naptime",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_max_workers",
    "shared_buffers",
    "server_version",
)
PREFETCH = 100
#: the messages table's own autovacuum parameters (migration 0001); ``--reset-autovacuum``
#: resets them, to see what PostgreSQL's defaults would do
MESSAGES_AUTOVACUUM = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_vacuum_cost_delay",
)
#: the targets: last part within this ratio of the early window
TOLERANCE = 1.2
#: the largest backlog of the late window, in seconds of the pace, beyond which the load
#: was not kept up
KEPT_UP_BACKLOG_S = 5.0
#: how long the load must stay healthy: a backlog above this many messages means the
#: consumers fell behind (the rate is too high for the machine at that moment)
BACKLOG_WARN = 50_000


# ----------------------------------------------------------------------------- load


class WindowSink(Sink):
    """Deliveries counted per reporting window, with their latencies (ns, compact), and
    duplicates found with one byte per sequence number (a set of ints would cost ~100 MB
    over a 30-minute run)."""

    def __init__(self) -> None:
        super().__init__(expected=1 << 62)
        self.window = array("q")
        self.delivered = 0
        self._seen = bytearray()

    def record(self, seq: int, sent_ns: int, received_ns: int) -> None:
        if seq >= len(self._seen):
            self._seen.extend(bytes(max(seq + 1 - len(self._seen), 1 << 20)))
        if self._seen[seq]:
            self.duplicates += 1
            return
        self._seen[seq] = 1
        self.delivered += 1
        self.window.append(received_ns - sent_ns)
        self.last_ns = received_ns

    def take(self) -> array[int]:
        window, self.window = self.window, array("q")
        return window


@dataclass
class Load:
    """Paced batch publishers into one queue, and the WebSocket consumers that drain it."""

    client: mx.Mx
    queue: str
    publishers: int
    consumers: int
    sink: WindowSink = field(default_factory=WindowSink)
    published: int = 0
    #: batches sent late by more than one interval (the publishers could not keep the pace)
    late: int = 0
    seqs: itertools.count[int] = field(default_factory=itertools.count)
    sockets: list[WsClient] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def start_consumers(self) -> None:
        for _ in range(self.consumers):
            ws = await self.client.subscribe(self.queue, PREFETCH)
            self.sockets.append(ws)
            self.tasks.append(asyncio.create_task(self.client.ws_consumer(ws, self.sink)))

    async def publish(self, until: float, rate: float | None) -> None:
        """Publish from ``self.publishers`` connections until the loop time ``until``, as fast
        as the broker answers (``rate`` None) or paced to ``rate`` messages a second."""
        interval = None if rate is None else self.publishers * mx.BATCH / rate
        await asyncio.gather(*(self._publisher(until, interval, i) for i in range(self.publishers)))

    async def _publisher(self, until: float, interval: float | None, index: int) -> None:
        loop = asyncio.get_running_loop()
        http = await mx.RawHttp.open(self.client.port)
        key = b'{"routing_key":"' + self.queue.encode() + b'","body":'
        path = f"/exchanges/{mx.EXCHANGE}/publish-batch"
        # the publishers' batches spread evenly over one interval
        next_at = loop.time() + (interval or 0) * index / self.publishers
        try:
            while loop.time() < until:
                if interval is not None:
                    delay = next_at - loop.time()
                    if delay > 0:
                        await asyncio.sleep(min(delay, until - loop.time()))
                        if loop.time() >= until:
                            break
                    elif -delay > interval:
                        self.late += 1
                        next_at = loop.time()  # no burst to catch up: the pace restarts
                    next_at += interval
                items = b",".join(key + make_body(next(self.seqs)) + b"}" for _ in range(mx.BATCH))
                await http.send(self.client.post(path, b'{"messages":[' + items + b"]}"))
                self.published += mx.BATCH
        finally:
            http.close()

    def failed(self) -> str:
        for task in self.tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return f"a consumer failed: {task.exception()!r}"
        return ""

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for ws in self.sockets:
            await ws.close()


async def measure_max(load: Load, seconds: float) -> float:
    """Delivered messages a second with the publishers unpaced for ``seconds``, counted
    from the end of the first fifth (warm-up) to the end; then the backlog is drained."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    warm = start + seconds / 5
    publishing = asyncio.create_task(load.publish(start + seconds, None))
    await asyncio.sleep(warm - loop.time())
    first = load.sink.delivered
    await publishing
    rate = (load.sink.delivered - first) / (loop.time() - warm)
    if not await load.client.wait_drained(load.queue, within=120):
        raise BenchError("the backlog of the maximum-rate probe did not drain in 120 s")
    load.sink.take()
    return rate


async def describe_database(conn: asyncpg.Connection, pg: Postgres) -> dict[str, Any]:
    """The server's autovacuum settings, the hot tables' storage parameters, the schema."""
    settings = {s: await conn.fetchval(f"SHOW {s}") for s in AUTOVACUUM_SETTINGS}
    settings["embedded"] = pg.embedded is not None
    if settings["autovacuum"] != "on":
        print("WARNING: autovacuum is off on this server: nothing reclaims dead rows")
    reloptions = await conn.fetch(
        "SELECT relname, reloptions FROM pg_class WHERE relname = ANY($1::text[])",
        list(HOT_TABLES),
    )
    return {
        "postgres": settings,
        "reloptions": {r["relname"]: r["reloptions"] for r in reloptions},
        "schema_revision": await conn.fetchval("SELECT version_num FROM alembic_version"),
    }


async def standing_backlog(client: mx.Mx, conn: asyncpg.Connection, n: int) -> float:
    """``n`` ready 1 KiB copies in a queue nobody consumes (one SQL statement), then
    VACUUM ANALYZE as autovacuum would after such an insert: the messages table then counts
    n live rows, and autovacuum's default trigger (20 % of them dead) is far away. Seconds
    taken."""
    started = time.monotonic()
    queue = mx.unique("soak-backlog")
    await client.declare_queue(queue)
    queue_id = await conn.fetchval("SELECT id FROM queues WHERE name = $1", queue)
    print(f"filling a standing backlog of {n} copies …", file=sys.stderr, flush=True)
    await conn.execute(
        """
        INSERT INTO messages (queue_id, message_id, exchange, routing_key, body)
        SELECT $1, 'backlog-' || g, '', 'k', convert_to(repeat('x', 1000), 'UTF8')
        FROM generate_series(1, $2::bigint) AS g
        """,
        queue_id,
        n,
        timeout=1800,
    )
    await conn.execute("VACUUM ANALYZE messages", timeout=1800)
    return round(time.monotonic() - started, 1)


# ----------------------------------------------------------------------------- sampling


async def table_stats(conn: asyncpg.Connection) -> dict[str, Any]:
    """Sizes, tuples and autovacuum activity of the hot tables, and their indexes' sizes."""
    rows = await conn.fetch(
        """
        SELECT s.relname, pg_total_relation_size(s.relid) AS total,
               pg_relation_size(s.relid) AS heap, pg_indexes_size(s.relid) AS indexes,
               s.n_live_tup AS live, s.n_dead_tup AS dead,
               s.autovacuum_count, s.autoanalyze_count, s.last_autovacuum
        FROM pg_stat_user_tables AS s WHERE s.relname = ANY($1::text[])
        """,
        list(HOT_TABLES),
    )
    out: dict[str, Any] = {}
    for r in rows:
        last = r["last_autovacuum"]
        out[r["relname"]] = {
            "total_bytes": r["total"],
            "heap_bytes": r["heap"],
            "indexes_bytes": r["indexes"],
            "live": r["live"],
            "dead": r["dead"],
            "autovacuum_count": r["autovacuum_count"],
            "autoanalyze_count": r["autoanalyze_count"],
            "last_autovacuum": last.isoformat(timespec="seconds") if last else None,
            "index_bytes": {},
        }
    for r in await conn.fetch(
        "SELECT relname, indexrelname, pg_relation_size(indexrelid) AS size "
        "FROM pg_stat_user_indexes WHERE relname = ANY($1::text[]) ORDER BY indexrelname",
        list(HOT_TABLES),
    ):
        out[r["relname"]]["index_bytes"][r["indexrelname"]] = r["size"]
    return out


def rss_bytes(pid: int) -> int | None:
    """Resident memory of the broker and its children (``--workers``)."""
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except (psutil.Error, OSError):
        return None


def latency_row(samples: Sequence[int]) -> dict[str, float | None]:
    values = sorted(samples)
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "p50_ms": round(percentile(values, 0.50) / 1e6, 2),
        "p99_ms": round(percentile(values, 0.99) / 1e6, 2),
        "max_ms": round(values[-1] / 1e6, 2),
    }


# ----------------------------------------------------------------------------- the verdict


def windows_of(total_s: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """(early, late) windows in seconds from the start of the paced load: the second sixth
    (after warm-up) and the last sixth; minutes 5-10 and 25-30 of a 30-minute run."""
    sixth = total_s / 6
    return (sixth, 2 * sixth), (total_s - sixth, total_s)


def verdict(
    rows: list[dict[str, Any]], latencies: list[array[int]], total_s: float
) -> dict[str, Any]:
    """The targets, from the rows whose end falls in each window (``latencies`` per row)."""
    (e0, e1), (l0, l1) = windows_of(total_s)

    def picked(lo: float, hi: float) -> list[int]:
        return [i for i, r in enumerate(rows) if lo < r["t_s"] <= hi + 1e-6]

    early, late = picked(e0, e1), picked(l0, l1)
    out: dict[str, Any] = {
        "early_window_s": [round(e0), round(e1)],
        "late_window_s": [round(l0), round(l1)],
        "size_baseline_s": [round(e0), round(l0)],
        "tolerance": TOLERANCE,
    }
    if not early or not late:
        out["met"] = None
        out["why"] = "too few rows for the windows"
        return out

    def p99(indices: list[int]) -> float | None:
        merged = sorted(itertools.chain.from_iterable(latencies[i] for i in indices))
        return round(percentile(merged, 0.99) / 1e6, 2) if merged else None

    def mean(indices: list[int], key: str) -> float | None:
        values = [rows[i][key] for i in indices if rows[i].get(key) is not None]
        return sum(values) / len(values) if values else None

    def size(i: int) -> int:
        return sum(rows[i].get(f"{t}_total_bytes") or 0 for t in HOT_TABLES)

    # Sizes: a table's file does not shrink (but for an empty tail), so its size is the
    # high-water mark of the dead versions between two vacuums; one vacuum that comes late
    # raises it for good. "Stops growing" is therefore the late window's largest size
    # against the largest one reached between the warm-up and the late window.
    steady = picked(e0, l0)
    checks: dict[str, dict[str, Any]] = {}
    for name, before, after in (
        ("p99_ms", p99(early), p99(late)),
        ("broker_rss_bytes", mean(early, "broker_rss_bytes"), mean(late, "broker_rss_bytes")),
        ("hot_tables_total_bytes", max(size(i) for i in steady), max(size(i) for i in late)),
        (
            "messages_total_bytes",
            max(rows[i].get("messages_total_bytes") or 0 for i in steady),
            max(rows[i].get("messages_total_bytes") or 0 for i in late),
        ),
    ):
        ratio = round(after / before, 3) if before and after is not None else None
        checks[name] = {
            "early": before,
            "late": after,
            "ratio": ratio,
            "met": ratio is not None and ratio <= TOLERANCE,
        }
    # The load must have been kept up: a pace the machine cannot hold builds a backlog, and
    # then latency and sizes measure the backlog (both windows may drift alike).
    published = sum(rows[i]["published_per_s"] for i in late)
    delivered = sum(rows[i]["delivered_per_s"] for i in late)
    backlog = max(rows[i].get("backlog") or 0 for i in late)
    pace = rows[late[-1]]["published_per_s"] or 1.0
    checks["kept_up"] = {
        "early": None,
        "late": {
            "delivered_over_published": round(delivered / (published or 1.0), 3),
            "largest_backlog_s": round(backlog / pace, 1),
        },
        "ratio": None,
        "met": delivered >= 0.98 * published and backlog <= KEPT_UP_BACKLOG_S * pace,
    }
    out["checks"] = checks
    out["met"] = all(c["met"] for c in checks.values())
    return out


# ----------------------------------------------------------------------------- output

CSV_TABLE_FIELDS = (
    "total_bytes",
    "heap_bytes",
    "indexes_bytes",
    "live",
    "dead",
    "autovacuum_count",
)


def flat_row(
    t_s: float,
    published: int,
    delivered: int,
    span_s: float,
    latency: dict[str, float | None],
    tables: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "t_s": round(t_s, 1),
        "minute": round(t_s / 60, 2),
        "published_per_s": round(published / span_s, 1),
        "delivered_per_s": round(delivered / span_s, 1),
        **latency,
        **extra,
    }
    for table in HOT_TABLES:
        stats = tables.get(table, {})
        for key in CSV_TABLE_FIELDS:
            row[f"{table}_{key}"] = stats.get(key)
        row[f"{table}_last_autovacuum"] = stats.get("last_autovacuum")
        for index, size in stats.get("index_bytes", {}).items():
            row[f"index_{index}_bytes"] = size
    return row


def write_outputs(out_dir: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with (out_dir / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def markdown(rows: list[dict[str, Any]], every_s: float = 300.0) -> str:
    """The rows every ``every_s`` seconds (and the last) as a Markdown table, MiB sizes."""
    mib = 1 << 20
    step = max(1, round(every_s / (rows[0]["t_s"] if rows else 60.0)))
    picked = [r for i, r in enumerate(rows) if (i + 1) % step == 0 or r is rows[-1]]
    lines = [
        "| min | pub/s | del/s | p50 ms | p99 ms | backlog | messages MiB (heap + indexes) "
        "| messages dead | autovacuums | receipts MiB | broker RSS MiB | load 1 min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in picked:
        total = (r.get("messages_total_bytes") or 0) / mib
        heap = (r.get("messages_heap_bytes") or 0) / mib
        indexes = (r.get("messages_indexes_bytes") or 0) / mib
        lines.append(
            f"| {r['minute']:.0f} | {r['published_per_s']:.0f} | {r['delivered_per_s']:.0f} "
            f"| {r['p50_ms']} | {r['p99_ms']} | {r['backlog']} "
            f"| {total:.1f} ({heap:.1f} + {indexes:.1f}) | {r.get('messages_dead')} "
            f"| {r.get('messages_autovacuum_count')} "
            f"| {(r.get('publish_receipts_total_bytes') or 0) / mib:.2f} "
            f"| {(r.get('broker_rss_bytes') or 0) / mib:.0f} | {r['loadavg_1m']} |"
        )
    return "\n".join(lines)


def render(out_dir: Path) -> None:
    """Redraw the plot and print the table of a finished or killed run."""
    from bench.soak_plot import plot

    doc = json.loads((out_dir / "soak.json").read_text())
    plot(doc["meta"], doc["rows"], out_dir / "soak.png")
    print(markdown(doc["rows"]))


def print_row(row: dict[str, Any]) -> None:
    mib = 1 << 20
    print(
        f"{row['minute']:6.2f} min  pub {row['published_per_s']:7.0f}/s  "
        f"del {row['delivered_per_s']:7.0f}/s  p50 {row['p50_ms']} ms  p99 {row['p99_ms']} ms  "
        f"backlog {row['backlog']}  messages {(row['messages_total_bytes'] or 0) / mib:.1f} MiB "
        f"(indexes {(row['messages_indexes_bytes'] or 0) / mib:.1f}, "
        f"dead {row['messages_dead']}, autovacuums {row['messages_autovacuum_count']})  "
        f"receipts {(row['publish_receipts_total_bytes'] or 0) / mib:.2f} MiB  "
        f"rss {(row['broker_rss_bytes'] or 0) / mib:.0f} MiB  load {row['loadavg_1m']}",
        flush=True,
    )


@dataclass
class Report:
    """The rows taken so far, each row's latencies, and the counters at the last row."""

    last_t: float
    last_published: int
    last_delivered: int
    start: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    latencies: list[array[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.start = self.last_t

    async def take(
        self, now: float, load: Load, broker: BrokerProcess, conn: asyncpg.Connection
    ) -> None:
        """One row: what happened since the last one, and the sizes and memory now."""
        if load.failed():
            raise BenchError(load.failed())
        if not broker.running() or broker.pid is None:
            raise BenchError(f"the broker died:\n{broker.log_tail()}")
        window = load.sink.take()
        published, delivered = load.published, load.sink.delivered
        stats = await load.client.stats(load.queue)
        backlog = stats["ready"] + stats["in_flight"]
        extra: dict[str, Any] = {
            "backlog": backlog,
            "broker_rss_bytes": rss_bytes(broker.pid),
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "late_batches": load.late,
            "duplicates": load.sink.duplicates,
        }
        row = flat_row(
            now - self.start,
            published - self.last_published,
            delivered - self.last_delivered,
            now - self.last_t,
            latency_row(window),
            await table_stats(conn),
            extra,
        )
        self.rows.append(row)
        self.latencies.append(window)
        print_row(row)
        if backlog > BACKLOG_WARN:
            print(f"  backlog above {BACKLOG_WARN}: the consumers fall behind", flush=True)
        self.last_t, self.last_published, self.last_delivered = now, published, delivered


# ----------------------------------------------------------------------------- the run


@dataclass
class Options:
    seconds: float
    report_every: float
    rate: float | None
    probe_seconds: float
    publishers: int
    consumers: int
    database_url: str
    out_dir: Path
    plot: bool
    broker_env: dict[str, str]
    backlog: int = 0
    reset_autovacuum: bool = False


async def pick_rate(o: Options, load: Load, meta: dict[str, Any]) -> float:
    """The paced rate: ``--rate``, or half the maximum measured first (recorded either way
    unless ``--probe-seconds 0``)."""
    meta["max_rate"] = None
    if o.probe_seconds > 0:
        print(f"measuring the maximum rate for {o.probe_seconds:.0f} s …", file=sys.stderr)
        meta["max_rate"] = round(await measure_max(load, o.probe_seconds))
    if o.rate is not None:
        return o.rate
    if not meta["max_rate"]:
        raise BenchError("no rate: give --rate or a positive --probe-seconds")
    return float(meta["max_rate"]) / 2


async def run(o: Options) -> dict[str, Any]:
    pg = await Postgres.provide(o.database_url)
    stale = await pg.drop_stale("mx_soak_")
    if stale:
        print(f"dropped databases of killed runs: {', '.join(stale)}", file=sys.stderr)
    await pg.create_database(f"mx_soak_{os.getpid()}")
    broker = BrokerProcess(pg.url, extra_env=o.broker_env)
    client: mx.Mx | None = None
    load: Load | None = None
    conn: asyncpg.Connection | None = None
    meta: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m bench soak", *sys.argv[2:]]),
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        },
        "seconds": o.seconds,
        "report_every_s": o.report_every,
        "publishers": o.publishers,
        "consumers": o.consumers,
        "prefetch": PREFETCH,
        "publish_batch": mx.BATCH,
        "message_bytes": 1024,
        "broker_env": o.broker_env,
    }
    report = Report(0.0, 0, 0)
    publishing: asyncio.Task[None] | None = None
    try:
        await broker.start()
        assert broker.pid is not None
        client = mx.Mx(broker.base_url, broker.ws_url, broker.user, broker.password)
        await client.setup()
        queue = mx.unique("soak")
        await client.declare_queue(queue)
        conn = await asyncpg.connect(pg.url, timeout=10)
        if o.reset_autovacuum:
            await conn.execute(f"ALTER TABLE messages RESET ({', '.join(MESSAGES_AUTOVACUUM)})")
        meta.update(await describe_database(conn, pg))
        if o.backlog:
            meta["backlog_fill_s"] = await standing_backlog(client, conn, o.backlog)
        meta["standing_backlog"] = o.backlog
        load = Load(client, queue, o.publishers, o.consumers)
        await load.start_consumers()
        rate = await pick_rate(o, load, meta)
        meta["rate"] = round(rate)
        print(
            f"maximum {meta['max_rate']} msg/s; soak at {meta['rate']} msg/s for "
            f"{o.seconds / 60:.1f} min",
            flush=True,
        )
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + o.seconds
        publishing = asyncio.create_task(load.publish(end, rate))
        meta["soak_started_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        # the probe's messages are not the soak's
        report = Report(start, load.published, load.sink.delivered)
        next_report = start + o.report_every
        while True:
            await asyncio.sleep(max(0.0, min(next_report, end) - loop.time()))
            now = loop.time()
            if publishing.done() and publishing.exception() is not None:
                raise BenchError(f"a publisher failed: {publishing.exception()!r}")
            await report.take(now, load, broker, conn)
            meta["verdict"] = verdict(report.rows, report.latencies, o.seconds)
            write_outputs(o.out_dir, meta, report.rows)
            if now >= end - 1e-3:
                break
            next_report += o.report_every
        await publishing
    finally:
        if publishing is not None and not publishing.done():
            publishing.cancel()
            await asyncio.gather(publishing, return_exceptions=True)
        meta["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        meta["ended_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        if load is not None:
            await load.stop()
        if conn is not None:
            await conn.close()
        if client is not None:
            await client.close()
        await broker.stop()
        broker.cleanup()
        try:
            await pg.drop_database()
        finally:
            await asyncio.to_thread(pg.stop)
    meta["verdict"] = verdict(report.rows, report.latencies, o.seconds)
    write_outputs(o.out_dir, meta, report.rows)
    if o.plot and report.rows:
        from bench.soak_plot import plot

        plot(meta, report.rows, o.out_dir / "soak.png")
    return meta


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench soak",
        description="Steady load at half the maximum rate for a long time; what drifts.",
    )
    p.add_argument("--minutes", type=float, default=30.0, help="length of the paced load (30)")
    p.add_argument("--seconds", type=float, help="length in seconds (overrides --minutes)")
    p.add_argument(
        "--report-every", type=float, help="seconds between rows (60; shorter runs: a tenth)"
    )
    p.add_argument(
        "--rate", type=float, help="msg/s of the paced load (default: half the measured max)"
    )
    p.add_argument(
        "--probe-seconds", type=float, default=20.0, help="maximum-rate probe, s (20; 0: none)"
    )
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL, help="a loopback PostgreSQL")
    p.add_argument("--out", type=Path, help="results directory (bench/results/soak-<time>)")
    p.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="ready copies left in a queue nobody consumes, beside the load (0)",
    )
    p.add_argument(
        "--reset-autovacuum",
        action="store_true",
        help="reset the messages table's autovacuum parameters (migration 0001) to the "
        "server's defaults before the load",
    )
    p.add_argument(
        "--render",
        type=Path,
        metavar="DIR",
        help="only redraw DIR/soak.png and print the table of DIR/soak.json (a killed run)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip soak.png")
    p.add_argument("--broker-env", action="append", default=[], metavar="KEY=VALUE")
    return p


def options(argv: list[str]) -> Options:
    args = parser().parse_args(argv)
    seconds = args.seconds if args.seconds is not None else args.minutes * 60
    if seconds <= 0 or min(args.publishers, args.consumers) < 1:
        raise BenchError("the length, --publishers and --consumers must be positive")
    every = args.report_every or (60.0 if seconds >= 600 else max(1.0, seconds / 10))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Options(
        seconds=seconds,
        report_every=every,
        rate=args.rate,
        probe_seconds=args.probe_seconds,
        publishers=args.publishers,
        consumers=args.consumers,
        database_url=args.database_url,
        out_dir=args.out or ROOT / "bench" / "results" / f"soak-{stamp}",
        plot=not args.no_plot,
        broker_env=dict(kv.split("=", 1) for kv in args.broker_env),
        backlog=args.backlog,
        reset_autovacuum=args.reset_autovacuum,
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.render is not None:
        render(args.render)
        return 0
    try:
        o = options(argv)
    except BenchError as exc:
        print(f"bench soak: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        meta = asyncio.run(run(o))
    except BenchError as exc:
        print(f"bench soak: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench soak: interrupted", file=sys.stderr)
        return 130
    print(markdown(json.loads((o.out_dir / "soak.json").read_text())["rows"]))
    v = meta["verdict"]
    print(f"\nverdict ({time.monotonic() - started:.0f} s): {json.dumps(v, indent=1)}")
    print(f"results in {o.out_dir}", file=sys.stderr)
    return 0
