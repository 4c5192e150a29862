"""What the broker does for the SQL functions of contract §18 (schema ``messagex``, migration
0013): write the size limits they cannot see, and find the copies they parked for the
length rule's dead-lettering.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.storage.database import Database

# The one row the SQL publish reads its limits from (MESSAGEX_MAX_MESSAGE_BYTES and
# MESSAGEX_MAX_HEADER_BYTES). Every broker process writes it at start: with processes of
# different settings, the last one started wins.
WRITE_SETTINGS = text("""
INSERT INTO publish_settings (id, max_message_bytes, max_header_bytes, updated_at)
VALUES (1, :max_message_bytes, :max_header_bytes, now())
ON CONFLICT (id) DO UPDATE SET max_message_bytes = EXCLUDED.max_message_bytes,
    max_header_bytes = EXCLUDED.max_header_bytes, updated_at = EXCLUDED.updated_at
WHERE (publish_settings.max_message_bytes, publish_settings.max_header_bytes)
      IS DISTINCT FROM (EXCLUDED.max_message_bytes, EXCLUDED.max_header_bytes)
""")

# Copies a SQL publish parked (status 'dead' in a queue with a dead-letter target, which has
# no other dead copies: its delivery limit dead-letters them) for the maxlen dead-lettering:
# the queues with a target, then ix_messages_parked per queue; locked, SKIP LOCKED so that
# two processes share the work.
LOCK_PARKED = text("""
SELECT m.id FROM queues AS q
CROSS JOIN LATERAL (
    SELECT id FROM messages
    WHERE queue_id = q.id AND status = 'dead'
    ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED
) AS m
WHERE q.dead_letter_queue_id IS NOT NULL OR q.arguments ? 'x-dead-letter-exchange'
LIMIT :n
""")


async def write_settings(db: Database, *, max_message_bytes: int, max_header_bytes: int) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            WRITE_SETTINGS,
            {"max_message_bytes": max_message_bytes, "max_header_bytes": max_header_bytes},
        )


async def lock_parked(conn: AsyncConnection, n: int) -> list[int]:
    rows = (await conn.execute(LOCK_PARKED, {"n": n})).all()
    return [int(r[0]) for r in rows]
