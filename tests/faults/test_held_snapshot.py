"""A snapshot held on the broker's database under load (issue 23, item 2).

Another session — a forgotten ``psql`` inside a transaction, a long report — holds a
``REPEATABLE READ`` transaction with its snapshot taken while publishers and WebSocket
consumers run. VACUUM can then remove none of the rows ACKed meanwhile. Asserted: the
checker is clean (nothing lost, nothing delivered twice without a cause, claims correct), and
the broker logs a warning naming the holder (MESSAGEX_XMIN_WARN_SECONDS). Reported: how
publish→delivery latency, the messages table's size and its dead tuples change during the
hold and after it ends. The test runs ``VACUUM messages`` as autovacuum would (the test
server may run with autovacuum off): while the snapshot is held it must remove almost
nothing, right after it ends almost everything.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.faults.checker import Ledger, Report, check
from tests.faults.harness import (
    Worker,
    brokers,
    drain,
    join_all,
    queue_pair,
    remaining_rows,
    sql,
    steady_load,
)
from tests.support import wait_for

HOLDER_NAME = "faults-held-snapshot"


class SnapshotHolder(Worker):
    """Opens a REPEATABLE READ transaction, takes its snapshot (a SELECT) and keeps it until
    stopped."""

    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__("snapshot-holder", stop)
        self.url = url
        self.pid = 0
        self.holding = threading.Event()

    def work(self) -> None:
        asyncio.run(self._hold())

    async def _hold(self) -> None:
        conn = await asyncpg.connect(
            asyncpg_dsn(self.url), timeout=10, server_settings={"application_name": HOLDER_NAME}
        )
        try:
            self.pid = conn.get_server_pid()
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            await conn.fetchval("SELECT count(*) FROM messages")  # the snapshot is taken here
            self.holding.set()
            while not self.stop_event.is_set():
                await asyncio.sleep(0.1)
            await conn.execute("COMMIT")
        finally:
            await conn.close()


class TableSampler(Worker):
    """Every second: the messages table's total size, its dead tuples and how many times
    autovacuum has processed it."""

    def __init__(self, url: str, stop: threading.Event) -> None:
        super().__init__("table-sampler", stop)
        self.url = url
        #: (monotonic, bytes, dead tuples, autovacuum runs)
        self.samples: list[tuple[float, int, int, int]] = []

    def work(self) -> None:
        while not self.stop_event.is_set():
            row = sql(
                self.url,
                "SELECT pg_total_relation_size('messages') AS size, n_dead_tup AS dead, "
                "autovacuum_count AS vacuums FROM pg_stat_user_tables WHERE relname = 'messages'",
            )[0]
            self.samples.append(
                (time.monotonic(), int(row["size"]), int(row["dead"]), int(row["vacuums"]))
            )
            self.stop_event.wait(1.0)

    def between(self, start: float, end: float) -> list[tuple[float, int, int, int]]:
        return [s for s in self.samples if start <= s[0] < end]


def vacuum(url: str) -> dict[str, float]:
    """``VACUUM messages``: how long it took and the table's dead tuples before and after."""

    def dead() -> int:
        rows = sql(url, "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'messages'")
        return int(rows[0]["n_dead_tup"])

    before = dead()
    started = time.monotonic()
    sql(url, "VACUUM messages")
    seconds = round(time.monotonic() - started, 2)
    return {"dead_before": before, "seconds": seconds, "dead_after": dead()}


def _latencies(ledger: Ledger, start: float, end: float) -> list[float]:
    """publish→delivery seconds of the first deliveries of messages published in [start, end)."""
    with ledger.lock:
        invoked = {
            m: p.invoked_at for m, p in ledger.publishes.items() if start <= p.invoked_at < end
        }
        return [
            d.at - invoked[d.message_id]
            for d in ledger.deliveries
            if d.message_id in invoked and d.delivery_count == 1
        ]


def _describe(values: list[float]) -> str:
    if not values:
        return "none"
    values = sorted(values)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return f"n={len(values)} p50={statistics.median(values) * 1000:.0f} ms p99={p99 * 1000:.0f} ms"


def run_held_snapshot(
    database_url: str, logs: Path, hold_seconds: float, after_seconds: float, warn_seconds: float
) -> dict[str, Any]:
    with brokers(
        database_url,
        logs,
        1,
        ACK_TIMEOUT_SECONDS=5,
        ACK_TIMEOUT_CHECK_INTERVAL_MS=200,
        MESSAGEX_XMIN_WARN_SECONDS=warn_seconds,
    ) as (a,):
        with a.client() as api:
            specs = queue_pair(api, "held", max_delivery_count=10)
        names = [s.name for s in specs]
        ledger, stop, hold_stop = Ledger(), threading.Event(), threading.Event()
        total = 5 + hold_seconds + after_seconds + 30
        sampler = TableSampler(database_url, stop)
        holder = SnapshotHolder(database_url, hold_stop)
        sampler.start()
        consumers, pubs = steady_load(
            ledger,
            a,
            names,
            stop,
            prefetch=10,
            consumer_seconds=total,
            count=10**6,
            seconds=total,
            pace=0.01,
            body_bytes=1024,
        )
        started = time.monotonic()
        wait_for(lambda: sum(d.outcome == "acked" for d in ledger.deliveries) >= 50, 20)
        wait_for(lambda: time.monotonic() - started >= 5, 10)

        holder.start()
        assert holder.holding.wait(10), "the snapshot was not taken"
        held_at = time.monotonic()
        # the broker names the holder once it is older than the threshold
        warned = wait_for(
            lambda: f"pid {holder.pid}," in a.log_text() and HOLDER_NAME in a.log_text(),
            # the threshold, then the next check (every 30 s or half the threshold), + slack
            warn_seconds + min(30, warn_seconds / 2) + 10,
            message="the broker's warning about the held snapshot",
        )
        warned_after = time.monotonic() - held_at
        wait_for(lambda: time.monotonic() - held_at >= hold_seconds, hold_seconds + 5)
        # VACUUM while held removes nothing (what autovacuum would find)
        held_vacuum = vacuum(database_url)
        hold_stop.set()
        join_all([holder], 10)
        released_at = time.monotonic()
        # the cleanup autovacuum does once it gets to the table (the test server runs with
        # autovacuum off, so the test runs it): now it removes what the snapshot kept
        released_vacuum = vacuum(database_url)
        wait_for(lambda: time.monotonic() - released_at >= after_seconds, after_seconds + 5)
        stop.set()
        join_all([*pubs, *consumers, sampler], 60)
        drain(ledger, a.ws_url, database_url, specs, timeout=30)
        report = check(ledger, specs, remaining_rows(database_url, names))
        assert a.alive()
        warnings = [line for line in a.log_text().splitlines() if HOLDER_NAME in line]
        warning = warnings[0]
    # at most once per holder per threshold period (and one more for the check's timing)
    assert len(warnings) <= hold_seconds / warn_seconds + 1, warnings
    assert "WARNING" in warning
    assert f"pid {holder.pid}," in warning

    assert warned
    before = sampler.between(started, held_at)
    during = sampler.between(held_at, released_at)
    after = sampler.between(released_at, released_at + after_seconds + 1)
    mid = held_at + hold_seconds / 2
    peak_dead = max((s[2] for s in during + after), default=0)
    figures = {
        "vacuum_while_held": held_vacuum,
        "vacuum_after_release": released_vacuum,
        "warned_after": warned_after,
        "latency_before": _describe(_latencies(ledger, started, held_at)),
        "latency_first_half": _describe(_latencies(ledger, held_at, mid)),
        "latency_second_half": _describe(_latencies(ledger, mid, released_at)),
        "latency_after": _describe(_latencies(ledger, released_at, released_at + after_seconds)),
        "size_kb": [s[1] // 1024 for s in (before[-1:] + during[-1:] + after[-1:])],
        "dead": [s[2] for s in (before[-1:] + during[-1:] + after[-1:])],
        "dead_max_during": max((s[2] for s in during), default=0),
        "dead_min_after": min((s[2] for s in after), default=-1),
        # autovacuum's turn: when the dead tuples first fell below half their peak
        "dead_halved_after": next(
            (round(t - released_at, 1) for t, _size, dead, _v in after if dead < peak_dead / 2),
            None,
        ),
        "autovacuums_during": during[-1][3] - during[0][3] if during else 0,
        "first_autovacuum_after": next(
            (round(t - released_at, 1) for t, *_, v in after if during and v > during[-1][3]),
            None,
        ),
    }
    print(f"held snapshot {hold_seconds:.0f} s: {figures}; {report.summary()}\n  {warning}")
    _assert_clean(report)
    # the held snapshot was what kept the dead rows: the VACUUM after it removed most of them
    assert held_vacuum["dead_after"] > held_vacuum["dead_before"] / 2, held_vacuum
    assert released_vacuum["dead_after"] < held_vacuum["dead_after"] / 2, released_vacuum
    return figures


def _assert_clean(report: Report) -> None:
    assert report.clean, report.summary()
    assert report.stats["published_ok"] > 0


@pytest.mark.timeout(120)
def test_held_snapshot_under_load(module_db: str, logs: Path) -> None:
    run_held_snapshot(module_db, logs, hold_seconds=20, after_seconds=10, warn_seconds=4)


@pytest.mark.slow
def test_long_held_snapshot_under_load(module_db: str, logs: Path) -> None:
    run_held_snapshot(module_db, logs, hold_seconds=600, after_seconds=180, warn_seconds=60)
