"""Exchanges, queues and bindings (stub: being written)."""

from __future__ import annotations

from app.storage.database import Database


class TopologyService:
    def __init__(self, db: Database) -> None:
        self.db = db
