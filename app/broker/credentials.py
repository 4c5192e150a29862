"""Re-checks of the credentials live WebSockets ride on: a socket whose session was revoked or
expired, whose user was deleted, or that authenticated with a password that has changed since
(contract §3), closes with 4401; one whose user lost read permission on
a queue gets SUBSCRIPTION_CANCELLED ``forbidden`` (contract: within 5 s). Each runs at once
on an event (this process's, or another's through cluster events) and every
``LIVENESS_SECONDS`` against the database, which covers an event that was lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from app.auth.permissions import Access, allows
from app.broker.consumers import ConsumerRegistry, Subscription
from app.storage import liveness
from app.storage.database import Database

#: how often live sockets' sessions and users are re-checked (contract: within 5 s)
LIVENESS_SECONDS = 2.0


class CredentialChecks:
    def __init__(
        self,
        db: Database,
        registry: ConsumerRegistry,
        end_subscription: Callable[[Subscription], Awaitable[None]],
    ) -> None:
        self.db = db
        self.registry = registry
        self.end_subscription = end_subscription

    async def check(self) -> None:
        """The periodic round: every live session, then every connected user."""
        digests = set(self.registry.token_digests.values())
        if digests:
            async with self.db.transaction() as conn:
                live = await liveness.live_sessions(conn, list(digests))
            self.close_sessions(digests - live)
        names = {o.user.username for o in self.registry.outlets.values()}
        if names:
            await self.recheck_users(sorted(names))

    def close_sessions(self, digests: set[bytes]) -> None:
        if not digests:
            return
        for conn_id, digest in list(self.registry.token_digests.items()):
            outlet = self.registry.outlets.get(conn_id)
            if digest in digests and outlet is not None:
                outlet.close(4401, "session expired or revoked")

    async def recheck_users(self, names: Sequence[str]) -> None:
        async with self.db.transaction() as conn:
            current = await liveness.users(conn, names)
        for outlet in list(self.registry.outlets.values()):
            if outlet.user.username not in names:
                continue
            found = current.get(outlet.user.username)
            if found is None:
                outlet.close(4401, "user deleted")
                continue
            user, password_hash = found
            if outlet.password_hash is not None and outlet.password_hash != password_hash:
                # (also after a rehash to new Argon2 parameters: the client reconnects with
                # the same password; docs/reliability.md)
                outlet.close(4401, "password changed")
                continue
            outlet.user = user
            for sub in self.registry.of_connection(outlet.id):
                if not allows(user, Access.READ, sub.queue_name):
                    await self.end_subscription(sub)
                    outlet.cancel(sub.queue_name, "forbidden")
