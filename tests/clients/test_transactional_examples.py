"""examples/orders_service.py and examples/invoice_consumer.py (contract §18) against a real
broker and its database: orders published in their own transactions, invoices written and
acked in one transaction each; a rolled-back order publishes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import httpx
import messagex_client as mx

from app.storage.dsn import asyncpg_dsn
from tests.support import ADMIN_PASSWORD, ADMIN_USER, LiveServer, async_wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pydantic look their module up
    spec.loader.exec_module(module)
    return module


async def test_orders_service_and_invoice_consumer(broker: LiveServer) -> None:
    orders_service, invoice_consumer = _load("orders_service"), _load("invoice_consumer")
    url = asyncpg_dsn(broker.database_url)
    app = orders_service.create_app(url)
    async with (
        asyncpg.create_pool(url, min_size=1, max_size=2) as pool,
        mx.Client(broker.base_url, username=ADMIN_USER, password=ADMIN_PASSWORD) as mq,
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://orders"
        ) as orders,
    ):
        await invoice_consumer.setup(mq, pool)
        await invoice_consumer.setup(mq, pool)  # again: idempotent (one binding)
        consumer = asyncio.ensure_future(invoice_consumer.consume(mq, pool, prefetch=5))
        try:

            async def order(reference: str, total: int) -> httpx.Response:
                body = {"reference": reference, "customer": "ada", "total_cents": total}
                return await orders.post("/orders", json=body)

            for n in range(10):
                r = await order(f"A-{n}", 100 + n)
                assert r.status_code == 201, r.text
                assert r.json()["queues"] == ["invoices"]
                assert r.json()["message_id"] == f"order-A-{n}"
            # A reference taken already: the insert fails, the publish before it goes too.
            r = await order("A-3", 999)
            assert r.status_code == 409, r.text
            r = await order("A-last", 1)
            assert r.status_code == 201, r.text

            async def invoiced() -> list[Any]:
                async with pool.acquire() as conn:
                    rows: list[Any] = await conn.fetch(
                        "SELECT order_reference, amount_cents, message_id FROM invoices ORDER BY id"
                    )
                return rows if len(rows) >= 11 else []

            # one consumer, FIFO: had the rolled-back publish leaked, it would come before
            # A-last
            rows = await async_wait_for(invoiced, timeout=15, message="11 invoices")
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer
        assert [(r["order_reference"], r["amount_cents"]) for r in rows] == [
            *((f"A-{n}", 100 + n) for n in range(10)),
            ("A-last", 1),
        ]
        assert rows[0]["message_id"] == "order-A-0"
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT count(*) FROM orders") == 11
            amount = await conn.fetchval("SELECT total_cents FROM orders WHERE reference = 'A-3'")
            assert amount == 103
        bound = await mq.topology.bindings(exchange="amq.topic", queue="invoices")
        assert [b.routing_key for b in bound] == ["order.created"]

        # every invoice was acked by its SQL transaction: nothing left in the queue
        stats = (await mq.topology.declare_queue("invoices"))["stats"]
        assert (stats["ready"], stats["in_flight"]) == (0, 0)
