"""messages.expires_at and queues.idle_expires_at: TTL and queue expiry (contract §13)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04

Hand-reviewed. ``messages.expires_at`` is when a copy expires (``available_at`` plus the
smaller of its queue's ``x-message-ttl`` and its ``expiration``; NULL: never), set where a
copy is stored. The expiry sweep walks ``ix_messages_expiry``, partial on the ready rows that
can expire, so it never reads rows that cannot. ``queues.idle_expires_at`` is when a queue
with ``x-expires`` is deleted unless it is used before (NULL for every other queue), walked
through its own partial index. The expression index on ``x-dead-letter-exchange`` answers
"which queues name this exchange" when an exchange is deleted (409).
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_messages_expiry",
        "messages",
        ["expires_at"],
        postgresql_where=sa.text("status = 'ready' AND expires_at IS NOT NULL"),
    )
    op.add_column("queues", sa.Column("idle_expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_queues_idle_expires_at",
        "queues",
        ["idle_expires_at"],
        postgresql_where=sa.text("idle_expires_at IS NOT NULL"),
    )
    op.create_index(
        "ix_queues_dead_letter_exchange",
        "queues",
        [sa.text("(arguments ->> 'x-dead-letter-exchange')")],
        postgresql_where=sa.text("arguments ? 'x-dead-letter-exchange'"),
    )
    # Queues declared with x-expires before it took effect start their idle time now.
    op.execute(
        "UPDATE queues SET idle_expires_at = now() + "
        "CAST(arguments ->> 'x-expires' AS bigint) * interval '1 millisecond' "
        "WHERE jsonb_typeof(arguments -> 'x-expires') = 'number'"
    )


def downgrade() -> None:
    op.drop_index("ix_queues_dead_letter_exchange", table_name="queues")
    op.drop_index("ix_queues_idle_expires_at", table_name="queues")
    op.drop_column("queues", "idle_expires_at")
    op.drop_index("ix_messages_expiry", table_name="messages")
    op.drop_column("messages", "expires_at")
