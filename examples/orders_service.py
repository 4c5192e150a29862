"""An orders service (FastAPI + SQLAlchemy) that publishes without an outbox (contract §18).

``POST /orders`` inserts the order row and publishes ``order.created`` to ``amq.topic`` in
one transaction of the service's own database — the one MessageX keeps its messages in. The
message exists if and only if the order commits: no outbox table, no relay, no dual write.
An order whose ``reference`` was taken already fails its insert, and its publish is rolled
back with it (409, nothing published).

    make run                                          # the broker, in another terminal
    export DATABASE_URL="$(.venv/bin/messagex database-url)"
    .venv/bin/uvicorn --app-dir examples --factory orders_service:app_from_env --port 8001
    curl -s localhost:8001/orders -H 'content-type: application/json' \\
        -d '{"reference": "A-1001", "customer": "ada", "total_cents": 4200}'

``DATABASE_URL`` is the broker's database (``messagex database-url`` prints it: the
embedded server's under ``make run``, else the broker's own ``DATABASE_URL``). The role it
names needs ``USAGE`` on schema ``messagex`` and ``EXECUTE`` on its functions (see
docs/operations.md); the embedded server's ``postgres`` has them. The service keeps its own
table, ``orders``, in the same database (created at start-up).
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from messagex_client import BrokerError, publish_in_transaction
from pydantic import BaseModel, Field
from sqlalchemy import DateTime, String, func
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

EXCHANGE = "amq.topic"
ROUTING_KEY = "order.created"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    reference: Mapped[str] = mapped_column(String(64), unique=True)
    customer: Mapped[str] = mapped_column(String(200))
    total_cents: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class NewOrder(BaseModel):
    reference: str = Field(min_length=1, max_length=64)
    customer: str = Field(min_length=1, max_length=200)
    total_cents: int = Field(ge=0)


class Created(BaseModel):
    id: int
    reference: str
    message_id: str
    queues: list[str]


def sqlalchemy_url(database_url: str) -> str:
    """``postgresql://...`` (what ``messagex database-url`` prints) → SQLAlchemy with asyncpg."""
    scheme, _, rest = database_url.partition("://")
    if scheme not in ("postgres", "postgresql") and not scheme.startswith("postgresql+"):
        raise ValueError("DATABASE_URL must be a postgresql:// URL")
    return f"postgresql+asyncpg://{rest}"


def create_app(database_url: str) -> FastAPI:
    engine: AsyncEngine = create_async_engine(sqlalchemy_url(database_url), pool_size=5)
    sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        yield
        await engine.dispose()

    app = FastAPI(title="orders (MessageX §18 example)", lifespan=lifespan)

    # (no ``from __future__ import annotations`` in this module: FastAPI reads the annotation
    # below at run time, and it names this local function)
    async def session() -> AsyncIterator[AsyncSession]:
        async with sessions() as s:
            yield s

    @app.post("/orders", status_code=201)
    async def create_order(
        order: NewOrder, db: Annotated[AsyncSession, Depends(session)]
    ) -> Created:
        event: dict[str, Any] = order.model_dump()
        try:
            async with db.begin():  # one transaction: commits both or neither
                # Publish first, insert second, to show that a failing insert takes the
                # publish with it; the order does not matter to the outcome.
                published = await publish_in_transaction(
                    db,
                    EXCHANGE,
                    ROUTING_KEY,
                    event,
                    message_id=f"order-{order.reference}",
                    content_type="application/json",
                )
                row = Order(**event)
                db.add(row)
                await db.flush()  # the insert (and its unique check) happens here
        except IntegrityError:
            raise HTTPException(
                409, f"order {order.reference!r} exists; nothing published"
            ) from None
        except BrokerError as exc:  # e.g. not_found: the exchange is missing
            raise HTTPException(503, f"could not publish: {exc.code}") from None
        return Created(
            id=row.id,
            reference=row.reference,
            message_id=published.message_id,
            queues=published.queues,
        )

    return app


def app_from_env() -> FastAPI:
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("set DATABASE_URL (it is what `messagex database-url` prints)")
    return create_app(url)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app_from_env(), host="127.0.0.1", port=int(os.environ.get("PORT", "8001")))
