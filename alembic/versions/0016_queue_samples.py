"""queue_samples: rate and depth history for the UI's charts

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05

Hand-reviewed. A small table of recent samples (about 15 minutes, swept by the process that
samples depth): rows of message activity per (sample time, queue, broker process) and of
depth by status per (sample time, queue holding copies), broker-wide rows with a NULL
queue_id. Nothing references it and it references nothing (a deleted queue's rows age out).
``depth_ms`` (on the broker-wide depth row) is how long the depth count took: the next one
waits 20 times that (at most 5 % of a core) when that is longer than the interval.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "queue_samples",
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queue_id", sa.BigInteger(), nullable=True),
        sa.Column("published", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("delivered", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("acked", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("ready", sa.BigInteger(), nullable=True),
        sa.Column("delayed", sa.BigInteger(), nullable=True),
        sa.Column("in_flight", sa.BigInteger(), nullable=True),
        sa.Column("dead", sa.BigInteger(), nullable=True),
        sa.Column("depth_ms", sa.Integer(), nullable=True),
    )
    op.create_index(
        "ix_queue_samples_queue_id_at", "queue_samples", ["queue_id", "at"], unique=False
    )
    op.create_index("ix_queue_samples_at", "queue_samples", ["at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_queue_samples_at", table_name="queue_samples")
    op.drop_index("ix_queue_samples_queue_id_at", table_name="queue_samples")
    op.drop_table("queue_samples")
