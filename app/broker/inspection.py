"""Browse, read and delete stored messages; the overview (stub: being written)."""

from __future__ import annotations

from app.storage.database import Database


class MessageBrowser:
    def __init__(self, db: Database) -> None:
        self.db = db
