"""Authentication, sessions and user management (stub: being written)."""

from __future__ import annotations

from app.metrics import Metrics
from app.config import Settings
from app.domain.model import Permissions, Role, User
from app.storage.database import Database


class AuthService:
    def __init__(self, db: Database, settings: Settings, metrics: Metrics) -> None:
        self.db = db
        self.settings = settings
        self.metrics = metrics

    async def bootstrap(self) -> None:
        return None

    async def authenticate(self, authorization: str | None, client_host: str | None) -> User:
        return User("admin", Role.ADMIN, Permissions(".*", ".*", ".*"))
