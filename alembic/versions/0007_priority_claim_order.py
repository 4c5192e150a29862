"""messages.priority: the claim order of copies in queues with x-max-priority (contract §13)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-04

Hand-reviewed. ``priority`` is NULL in every queue without ``x-max-priority`` (a queue's
arguments never change, so a copy's kind follows its queue) and the effective priority
(``QueueArguments.priority_of``) in a queue with it. The partial index
``ix_messages_priority`` holds only the ready copies of priority queues, in claim order
(priority descending, available_at, id): plain queues' rows never enter it, so their inserts
and claims maintain nothing new, and ``ix_messages_claim`` keeps serving every queue's
``min(available_at)`` probes (the poll, the next-due timer, the hand-off's "waiting" test).
Adding a nullable column with no default is a catalog change only.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("priority", sa.SmallInteger(), nullable=True))
    op.create_index(
        "ix_messages_priority",
        "messages",
        ["queue_id", sa.text("priority DESC"), "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'ready' AND priority IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_messages_priority", table_name="messages")
    op.drop_column("messages", "priority")
