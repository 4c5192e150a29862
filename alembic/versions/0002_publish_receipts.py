"""publish receipts: how a publish whose commit was in doubt learns whether it was stored

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02

Hand-reviewed. One small row per publish group write (not per message), inserted by the
same statement as the group's messages, so it commits exactly when they do. After a
connection error during that statement the broker inserts the same token itself: a
conflict means the publish committed; a successful insert means it did not and now never
will (a commit still in progress waits on the primary key, then fails). The index on
``created_at`` serves the periodic sweep of old receipts.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "publish_receipts",
        sa.Column("token", sa.UUID(as_uuid=False), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("token", name=op.f("pk_publish_receipts")),
    )
    op.create_index(
        op.f("ix_publish_receipts_created_at"), "publish_receipts", ["created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_table("publish_receipts")
