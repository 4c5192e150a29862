"""The exactly-once consumer (contract §18): effects and ``messagex.ack`` in one transaction.

Messages are published with ``publish_in_transaction`` (a batch per transaction; one batch is
rolled back). A consumer process (tx_consumer.py) writes each message's effect row and acks
it through SQL in one transaction, and is killed with SIGKILL at random points of its
progress, then restarted; a short ack timeout plus a few deliberately slow messages force
redeliveries whose SQL ack returns false. At the end:

- every published message's effect row exists exactly once (and the rolled-back batch's
  never): the ledger of effects in the database;
- the fault checker (checker.py) finds the delivery ledger clean: nothing lost, no
  redelivery after a committed ack, no two deliveries with one delivery count;
- the queue is empty.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import asyncpg
import messagex_client as mx
import pytest

from app.storage.dsn import asyncpg_dsn
from tests.faults.checker import Delivery, Ledger, QueueSpec, check
from tests.faults.harness import REPO, brokers, declare, pending_rows, remaining_rows, sql
from tests.faults.tx_consumer import EFFECTS_TABLE
from tests.support import ADMIN_PASSWORD, ADMIN_USER, wait_for

ACK_TIMEOUT_SECONDS = 2
BATCH = 500


async def _publish(url: str, ledger: Ledger, queue: str, count: int) -> None:
    """``count`` messages through ``messagex.publish_to_queue``, a batch per transaction (one
    statement each: the test is about the consumer), then a batch through the client's
    helper that is rolled back (recorded as failed: it must never be delivered)."""
    conn = await asyncpg.connect(url)
    try:
        for start in range(0, count, BATCH):
            end = min(count, start + BATCH)
            records = [ledger.invoked(f"eo-{n}", queue, "sql") for n in range(start, end)]
            async with conn.transaction():
                results = await conn.fetch(
                    "SELECT messagex.publish_to_queue($1, jsonb_build_object('n', n), '{}', "
                    "jsonb_build_object('message_id', 'eo-' || n))::text AS r "
                    "FROM generate_series($2::int, $3::int) AS n",
                    queue,
                    start,
                    end - 1,
                )
            assert all(json.loads(r["r"])["queues"] == [queue] for r in results)
            for record in records:
                ledger.published(record, "ok")
        records = [ledger.invoked(f"eo-rb-{n}", queue, "sql") for n in range(50)]
        tx = conn.transaction()
        await tx.start()
        for n in range(50):
            result = await mx.publish_to_queue_in_transaction(
                conn, queue, {"n": count + n}, message_id=f"eo-rb-{n}"
            )
            assert result.queues == [queue]
        await tx.rollback()
        for record in records:
            ledger.published(record, "failed")
    finally:
        await conn.close()


def _consumer(
    broker_url: str, url: str, queue: str, ledger: Path, name: str, slow: list[int], err: IO[bytes]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.faults.tx_consumer",
            broker_url,
            url,
            queue,
            str(ledger),
            name,
            "--slow",
            *map(str, slow),
            "--slow-seconds",
            str(ACK_TIMEOUT_SECONDS + 0.5),
            "--user",
            ADMIN_USER,
            "--password",
            ADMIN_PASSWORD,
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=err,
        stderr=err,
    )


def _effects(url: str) -> int:
    return int(sql(url, "SELECT count(*) AS n FROM eo_effects")[0]["n"])


def _read_ledger(path: Path, ledger: Ledger) -> None:
    by_tag: dict[str, Delivery] = {}
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # the last line of a killed process may be cut short
        if event["e"] == "d":
            delivery = Delivery(
                event["consumer"],
                event["connection"],
                event["queue"],
                event["message_id"],
                event["tag"],
                event["count"],
                event["redelivered"],
                event["at"],
            )
            by_tag[delivery.tag] = delivery
            ledger.delivered(delivery)
        elif event["tag"] in by_tag:
            ledger.settled(by_tag[event["tag"]], event["outcome"])


def run_exactly_once(database_url: str, logs: Path, count: int, kills: int, seconds: float) -> None:
    url = asyncpg_dsn(database_url)
    rng = random.Random()  # a fresh seed each run; printed for a replay
    seed = rng.randrange(2**32)
    rng.seed(seed)
    queue = "eo"
    with brokers(
        database_url,
        logs,
        1,
        ACK_TIMEOUT_SECONDS=ACK_TIMEOUT_SECONDS,
        ACK_TIMEOUT_CHECK_INTERVAL_MS=200,
    ) as (broker,):
        with broker.client() as api:
            declare(api, QueueSpec(queue))
        sql(url, EFFECTS_TABLE)
        ledger = Ledger()
        asyncio.run(_publish(url, ledger, queue, count))
        # slow messages among the last tenth: first delivered after the last kill (which comes
        # by three quarters of the run), so their first ack surely times out and returns false
        slow = sorted(rng.sample(range(count * 9 // 10, count), 2))
        ledger_file = logs / "eo-ledger.jsonl"
        logs.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + seconds
        killed = 0
        for run in range(kills + 1):
            err = (logs / f"eo-consumer-c{run}.log").open("wb")
            proc = _consumer(broker.base_url, url, queue, ledger_file, f"c{run}", slow, err)
            try:
                if run < kills:
                    # kill at a random point of the run's k-th slice of progress
                    slice_ = count // (kills + 1)
                    target = rng.randint(run * slice_ + 1, (run + 1) * slice_)
                    consumer = proc

                    def progressed(t: int = target, p: subprocess.Popen[bytes] = consumer) -> bool:
                        return _effects(url) >= t or p.poll() is not None

                    wait_for(
                        progressed,
                        timeout=max(1.0, deadline - time.monotonic()),
                        message=f"consumer c{run} to make progress",
                    )
                    assert proc.poll() is None, (logs / f"eo-consumer-c{run}.log").read_text()
                    proc.send_signal(signal.SIGKILL)
                    killed += 1
                else:
                    wait_for(
                        lambda: pending_rows(url, [queue]) == 0,
                        timeout=max(1.0, deadline - time.monotonic()),
                        interval=0.05,
                        message="the last consumer to finish the queue",
                    )
                    # a clean stop: it finishes what it holds (a slow message's ack, false)
                    proc.send_signal(signal.SIGTERM)
                    assert proc.wait(timeout=15) == 0, (
                        logs / f"eo-consumer-c{run}.log"
                    ).read_text()
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                err.close()

        _read_ledger(ledger_file, ledger)
        report = check(ledger, [QueueSpec(queue)], remaining_rows(url, [queue]))
        counts = sql(
            url,
            "SELECT count(*) AS rows, count(DISTINCT message_id) AS messages, "
            "count(*) FILTER (WHERE message_id LIKE 'eo-rb-%') AS rolled_back FROM eo_effects",
        )[0]
        twice = sql(
            url,
            "SELECT message_id, count(*) AS n FROM eo_effects GROUP BY message_id "
            "HAVING count(*) <> 1 LIMIT 10",
        )
        rejected = sum(1 for d in ledger.deliveries if d.outcome == "ack_rejected:false")
        print(
            f"\nexactly-once: seed {seed}, {count} messages, {killed} SIGKILLs, "
            f"{report.stats['deliveries']} deliveries ({report.stats['redeliveries']} "
            f"redelivered), {rejected} SQL acks false; {report.summary()}"
        )
        assert twice == [], f"effects not exactly once: {twice}"
        assert (counts["rows"], counts["messages"], counts["rolled_back"]) == (count, count, 0)
        assert report.clean, report.summary()
        assert killed == kills
        # the faults really happened: redeliveries, and timed-out deliveries whose ack failed
        assert report.stats["redeliveries"] > 0
        assert rejected >= 1
        assert pending_rows(url, [queue]) == 0
    # a stream of SQL acks (one NOTIFY each) must not exhaust the broker's pool: it once
    # crashed hundreds of reconcile tasks a run
    broker_logs = "".join(p.read_text(errors="replace") for p in logs.glob("broker-*.log"))
    assert "Traceback" not in broker_logs


@pytest.mark.timeout(90)  # the run itself is bounded by 50 s; the rest is set-up
def test_exactly_once_consumer_killed_and_timed_out(database_url: str, logs: Path) -> None:
    run_exactly_once(database_url, logs, count=2000, kills=3, seconds=50)


@pytest.mark.slow
def test_exactly_once_consumer_under_heavier_load(database_url: str, logs: Path) -> None:
    run_exactly_once(database_url, logs, count=10000, kills=10, seconds=600)
