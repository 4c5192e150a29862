"""Celery on MessageX, on RabbitMQ (py-amqp) and on Kombu's SQLAlchemy transport over the
same PostgreSQL, side by side in one run: ``python -m bench.celery [--count 2000]``.

For each broker the harness starts one `celery worker` subprocess (solo pool, acks_late,
prefetch multiplier 10, no result backend: the task appends ``<enqueued> <started>`` to a
file) and measures, from this process as the producer:

* idle latency: ``--latency-count`` tasks sent one at a time, each waited for; enqueue →
  start (p50, p99) — the time a task waits on an idle system;
* throughput: ``--count`` tasks sent as fast as one producer can; tasks per second from the
  first enqueue to the last start, the producer's enqueue rate, and the burst's p50 latency.

MessageX runs as ``messagex serve`` on a fresh database of the PostgreSQL at
``--database-url``; Kombu's SQLAlchemy transport (``sqla+postgresql+psycopg://``) gets
another fresh database of the same server; it polls every second (its default: Kombu hands
every transport option to SQLAlchemy's ``create_engine``, so ``polling_interval`` cannot be
set for it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import messagex_client.kombu_transport  # noqa: F401 - registers messagex://
from celery import Celery
from kombu.connection import Connection

from bench.infra import (
    DEFAULT_DATABASE_URL,
    DEFAULT_RABBITMQ_URL,
    ROOT,
    BrokerProcess,
    Postgres,
    ensure_loopback,
    with_database,
)
from bench.stats import BenchError

TASK = "bench.celery_tasks.stamp"


def _lines(path: Path) -> list[tuple[float, float]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [(float(a), float(b)) for a, b in (line.split() for line in text.splitlines() if line)]


def _wait_lines(path: Path, n: int, deadline: float) -> list[tuple[float, float]]:
    while True:
        rows = _lines(path)
        if len(rows) >= n:
            return rows
        if time.monotonic() > deadline:
            raise BenchError(f"{len(rows)} of {n} tasks started before the deadline")
        time.sleep(0.001)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_one(
    name: str, url: str, count: int, latency_count: int, deadline_s: float
) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mx-bench-celery-"))
    out = work / "stamps"
    queue = f"bench-celery-{os.getpid()}"
    env = {
        **os.environ,
        "BENCH_CELERY_BROKER": url,
        "BENCH_CELERY_QUEUE": queue,
        "BENCH_CELERY_OUT": str(out),
        "PYTHONPATH": str(ROOT),
    }
    app = Celery("mxbench", broker=url, set_as_current=False)
    app.conf.update(task_ignore_result=True)
    with (work / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.celery_tasks", "worker",
             "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
             "--loglevel=WARNING", "-n", f"bench-{os.getpid()}@%h"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        send = app.send_task
        deadline = time.monotonic() + deadline_s
        send(TASK, args=(time.time(),), queue=queue)  # warm-up: declares, worker ready
        seen = len(_wait_lines(out, 1, deadline))
        idle = []
        for _ in range(latency_count):
            send(TASK, args=(time.time(),), queue=queue)
            seen += 1
            sent, started = _wait_lines(out, seen, deadline)[-1]
            idle.append(started - sent)
        first = time.time()
        for _ in range(count):
            send(TASK, args=(time.time(),), queue=queue)
        enqueued = time.time() - first
        rows = _wait_lines(out, seen + count, deadline)[seen:]
        last_start = max(started for _, started in rows)
        burst = [started - sent for sent, started in rows]
        return {
            "broker": name,
            "status": "ok",
            "tasks": count,
            "tasks_per_s": count / (last_start - first),
            "enqueue_per_s": count / enqueued,
            "idle_p50_ms": _percentile(idle, 0.5) * 1000,
            "idle_p99_ms": _percentile(idle, 0.99) * 1000,
            "burst_p50_ms": statistics.median(burst) * 1000,
        }
    except BenchError as exc:
        return {"broker": name, "status": f"failed: {exc}"}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        app.close()


async def _admin(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url, timeout=10)
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


def _drop_rabbit_queue(url: str, queue: str) -> None:
    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.default_channel.queue_delete(queue)
            conn.default_channel.exchange_delete(queue)
    except Exception as exc:
        print(f"could not delete RabbitMQ queue {queue}: {exc}", file=sys.stderr)


def table(results: list[dict[str, Any]]) -> str:
    head = "| broker | tasks/s | enqueue/s | idle p50 ms | idle p99 ms | burst p50 ms |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if r["status"] != "ok":
            lines.append(f"| {r['broker']} | {r['status']} | | | | |")
            continue
        lines.append(
            f"| {r['broker']} | {r['tasks_per_s']:.0f} | {r['enqueue_per_s']:.0f} "
            f"| {r['idle_p50_ms']:.1f} | {r['idle_p99_ms']:.1f} | {r['burst_p50_ms']:.0f} |"
        )
    ok = {r["broker"]: r for r in results if r["status"] == "ok"}
    mx = ok.get("messagex")
    for other in ("rabbitmq (py-amqp)", "kombu sqlalchemy"):
        if mx and other in ok:
            o = ok[other]
            lines.append(
                f"\nmessagex / {other}: tasks/s x{mx['tasks_per_s'] / o['tasks_per_s']:.2f}, "
                f"idle p50 x{mx['idle_p50_ms'] / o['idle_p50_ms']:.2f}"
            )
    return "\n".join(lines)


async def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every broker in turn, on one event loop (the broker subprocess belongs to it)."""
    pg = await Postgres.provide(args.database_url)
    mx_db, sqla_db = f"mx_bench_celery_{os.getpid()}", f"mx_bench_celery_sqla_{os.getpid()}"
    results: list[dict[str, Any]] = []
    broker: BrokerProcess | None = None
    try:
        await pg.create_database(mx_db)
        broker = BrokerProcess(pg.url)
        await broker.start()
        mx_url = f"messagex://{broker.user}:{broker.password}@127.0.0.1:{broker.port}/"
        runs = [("messagex", mx_url)]
        if not args.no_rabbitmq:
            runs.append(("rabbitmq (py-amqp)", args.rabbitmq_url))
        if not args.no_sqlalchemy:
            drop = f'DROP DATABASE IF EXISTS "{sqla_db}" WITH (FORCE)'
            await _admin(pg.admin_url, drop, f'CREATE DATABASE "{sqla_db}"')
            sqla = with_database(pg.admin_url, sqla_db)
            sqla = sqla.replace("postgresql://", "sqla+postgresql+psycopg://", 1)
            runs.append(("kombu sqlalchemy", sqla))
        for name, url in runs:
            print(f"celery on {name}: {args.count} tasks …", file=sys.stderr, flush=True)
            result = await asyncio.to_thread(
                run_one, name, url, args.count, args.latency_count, args.deadline
            )
            results.append(result)
            if name.startswith("rabbitmq"):
                await asyncio.to_thread(_drop_rabbit_queue, url, f"bench-celery-{os.getpid()}")
    finally:
        if broker is not None:
            await broker.stop()
            broker.cleanup()
        await pg.drop_database()
        await _admin(pg.admin_url, f'DROP DATABASE IF EXISTS "{sqla_db}" WITH (FORCE)')
        pg.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.celery", description=__doc__)
    p.add_argument("--count", type=int, default=2000, help="tasks in the throughput run (2000)")
    p.add_argument("--latency-count", type=int, default=30, help="idle-latency tasks (30)")
    p.add_argument("--database-url", default=DEFAULT_DATABASE_URL)
    p.add_argument("--rabbitmq-url", default=DEFAULT_RABBITMQ_URL)
    p.add_argument("--no-rabbitmq", action="store_true")
    p.add_argument("--no-sqlalchemy", action="store_true", help="skip Kombu's SQLAlchemy")
    p.add_argument("--deadline", type=float, default=180.0, help="per broker, s (180)")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args(argv)
    ensure_loopback(args.rabbitmq_url, "--rabbitmq-url")
    results = asyncio.run(run_all(args))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
