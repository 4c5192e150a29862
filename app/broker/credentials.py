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
from app.broker.consumers import ConsumerRegistry, Outlet, Subscription
from app.domain.model import User
from app.storage import liveness
from app.storage.database import Database

#: how often live sockets' sessions and users are re-checked (contract: within 5 s)
LIVENESS_SECONDS = 2.0


class CredentialChecks:
    """The periodic round costs what changed, not what is connected: one statement for the
    connected users' rows, and only the connections of a user whose row changed since the
    last round (or that no round has seen yet) are walked. A connection checked against a
    row stays valid for as long as that row does, since nothing else changes what it holds."""

    def __init__(
        self,
        db: Database,
        registry: ConsumerRegistry,
        end_subscription: Callable[[Subscription], Awaitable[None]],
    ) -> None:
        self.db = db
        self.registry = registry
        self.end_subscription = end_subscription
        #: each connected user's row (and password hash) as the last check saw it
        self.seen: dict[str, tuple[User, str] | None] = {}

    async def check(self) -> None:
        """The periodic round: every live session, then every connected user."""
        digests = set(self.registry.token_digests.values())
        if digests:
            live = await liveness.live_sessions(self.db.hot, list(digests))
            self.close_sessions(digests - live)
        for gone in set(self.seen) - self.registry.by_user.keys():
            del self.seen[gone]
        if self.registry.by_user:
            await self.recheck_users(sorted(self.registry.by_user), changed_only=True)

    def close_sessions(self, digests: set[bytes]) -> None:
        if not digests:
            return
        for conn_id, digest in list(self.registry.token_digests.items()):
            outlet = self.registry.outlets.get(conn_id)
            if digest in digests and outlet is not None:
                outlet.close(4401, "session expired or revoked")

    async def recheck_users(self, names: Sequence[str], *, changed_only: bool = False) -> None:
        """Check the connections of ``names`` against their rows now: all of them, or with
        ``changed_only`` only those of a user whose row differs from the last one seen, and
        those that no check has seen yet."""
        # Only connections made before the statement can be judged by it.
        wanted = set(names)
        outlets = self.registry.outlets
        unchecked = {
            i
            for i in self.registry.unchecked
            if i in outlets and outlets[i].user.username in wanted
        }
        current = await liveness.users(self.db.hot, names)
        self.registry.unchecked -= unchecked
        for name in names:
            found = current.get(name)
            mine = self.registry.by_user.get(name, {})
            if changed_only and name in self.seen and self.seen[name] == found:
                walk = [mine[i] for i in unchecked.intersection(mine)]
            else:
                walk = list(mine.values())
            self.seen[name] = found
            for outlet in walk:
                await self._recheck(outlet, found)

    async def _recheck(self, outlet: Outlet, found: tuple[User, str] | None) -> None:
        if found is None:
            outlet.close(4401, "user deleted")
            return
        user, password_hash = found
        if outlet.password_hash is not None and outlet.password_hash != password_hash:
            # (also after a rehash to new Argon2 parameters: the client reconnects with
            # the same password; docs/reliability.md)
            outlet.close(4401, "password changed")
            return
        outlet.user = user
        for sub in self.registry.of_connection(outlet.id):
            if not allows(user, Access.READ, sub.queue_name):
                await self.end_subscription(sub)
                outlet.cancel(sub.queue_name, "forbidden")
