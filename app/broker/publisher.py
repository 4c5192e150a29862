"""Route + persist in one transaction (stub: being written)."""

from __future__ import annotations

from app.metrics import Metrics
from app.storage.database import Database


class Publisher:
    def __init__(self, db: Database, metrics: Metrics, *, max_message_bytes: int) -> None:
        self.db = db
        self.metrics = metrics
        self.max_message_bytes = max_message_bytes
