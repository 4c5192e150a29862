"""Operator view of WebSocket connections (contract §20): list them on every process, close
one wherever it is (admin only)."""

from __future__ import annotations

import uuid

from app.auth.permissions import require_admin
from app.broker.delivery import DeliveryEngine
from app.domain.model import User
from app.errors import NotFound
from app.storage import connections as store
from app.storage.connections import ConnectionRow
from app.storage.database import Database

__all__ = ["ConnectionRow", "Connections"]


class Connections:
    def __init__(self, db: Database, delivery: DeliveryEngine) -> None:
        self.db = db
        self.delivery = delivery

    async def list(
        self, actor: User, *, limit: int, after: str | None, contains: str | None = None
    ) -> tuple[list[ConnectionRow], str | None]:
        """A page by connection id, and the cursor of the next (None on the last page)."""
        require_admin(actor)
        async with self.db.connect() as conn:
            rows = await store.list_connections(conn, limit=limit, after=after, contains=contains)
        return rows, rows[-1].connection_id if len(rows) == limit else None

    async def close(self, actor: User, connection_id: str) -> None:
        """Close it with 1008 "closed by an administrator"; NotFound when no live process
        holds it."""
        require_admin(actor)
        process = None
        if _is_uuid(connection_id):
            async with self.db.connect() as conn:
                process = await store.request_close(conn, connection_id)
        if process is None:
            raise NotFound(f"connection '{connection_id}' not found")
        self.delivery.close_connection(str(uuid.UUID(connection_id)))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True
