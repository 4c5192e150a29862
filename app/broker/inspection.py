"""Browse, read and delete stored messages without consuming them (contract §5, §12)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from app.auth.permissions import Access, require
from app.domain.model import BrowseStatus, StoredMessage, User
from app.storage import messages as store
from app.storage.database import Database
from app.storage.messages import DeletedMessage

log = logging.getLogger("messagex.inspection")

__all__ = ["DeletedListener", "DeletedMessage", "MessageBrowser"]

#: Called after a commit that deleted an in-flight message (its consumer's prefetch slot
#: is free again; a later ACK of its tag is ``unknown_delivery_tag``).
DeletedListener = Callable[[DeletedMessage], None]


class MessageBrowser:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._deleted_listeners: list[DeletedListener] = []

    def add_deleted_listener(self, callback: DeletedListener) -> None:
        """Call ``callback(deleted)`` after each commit that deleted an in-flight message.

        A plain sync function on the event loop; its exceptions are logged, never raised.
        """
        self._deleted_listeners.append(callback)

    async def browse(
        self,
        actor: User,
        queue: str,
        *,
        status: BrowseStatus | None = None,
        limit: int = 100,
        after: int | None = None,
    ) -> tuple[list[StoredMessage], int | None]:
        """A page of ``queue``'s messages by id and the cursor of the next page.

        Needs read on the queue. The cursor is the last id when the page is full (the next
        page may then be empty), else None.
        """
        require(actor, Access.READ, queue, "queue")
        async with self.db.connect() as conn:  # one statement: no transaction block needed
            items = await store.browse(conn, queue, status=status, limit=limit, after=after or 0)
        next_after = items[-1].id if len(items) == limit else None
        return items, next_after

    async def get(self, actor: User, queue: str, message_id: int) -> StoredMessage:
        """One message by its numeric id, body included: needs read on the queue (as browse
        does; write alone must not reveal what others published)."""
        require(actor, Access.READ, queue, "queue")
        async with self.db.connect() as conn:
            return await store.get_message(conn, queue, message_id)

    async def delete(self, actor: User, queue: str, message_id: int) -> None:
        """Delete one message whatever its status; needs configure on the queue."""
        require(actor, Access.CONFIGURE, queue, "queue")
        async with self.db.connect() as conn:  # one statement, atomic on its own
            deleted = await store.delete_message(conn, queue, message_id)
        if deleted.status == "in_flight":
            for listener in self._deleted_listeners:
                try:
                    listener(deleted)
                except Exception:
                    log.exception("a deleted-message listener failed")
