"""websocket_connections: every process's WebSocket connections, to count them per user

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04

Hand-reviewed. Contract §8 bounds a user's WebSocket connections across every broker
process. One row per authenticated connection, inserted when it is admitted (under a
transaction-scoped advisory lock per user, so concurrent upgrades cannot pass the limit
together) and deleted when it closes; the rows of a process that dies go with its
``broker_processes`` row (ON DELETE CASCADE), as its subscriptions do. The index on
``username`` serves the count.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "websocket_connections",
        sa.Column("connection_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("process_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("username", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["process_id"],
            ["broker_processes.id"],
            name=op.f("fk_websocket_connections_process_id_broker_processes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connection_id", name=op.f("pk_websocket_connections")),
    )
    op.create_index(
        op.f("ix_websocket_connections_username"),
        "websocket_connections",
        ["username"],
        unique=False,
    )
    op.create_index(
        op.f("ix_websocket_connections_process_id"),
        "websocket_connections",
        ["process_id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_table("websocket_connections")
