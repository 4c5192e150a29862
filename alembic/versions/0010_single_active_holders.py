"""single_active_holders: who a single-active-consumer queue delivers to (contract §13)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04

Hand-reviewed. One row per queue declared with ``x-single-active-consumer: true`` that has
had an active subscription: the connection its deliveries go to. The row outlives that
subscription (an UNSUBSCRIBE, a close, the death of its process) until the next oldest
subscription takes over, which it may do only once none of the holder's deliveries of the
queue are in flight any more: that is how order is kept across the hand-over. Changed only
under the queue's transaction-scoped advisory lock (app/storage/single_active.py). Goes
with its queue (ON DELETE CASCADE).
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "single_active_holders",
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("connection_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column(
            "since",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_single_active_holders_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue_id", name=op.f("pk_single_active_holders")),
    )


def downgrade() -> None:
    op.drop_table("single_active_holders")
