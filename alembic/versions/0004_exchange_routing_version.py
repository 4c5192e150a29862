"""exchanges.routing_version: a publish reads an exchange's bindings only when they changed

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

Hand-reviewed. Every transaction that adds or removes bindings of an exchange (bind, unbind,
queue delete, which cascades into its bindings) increments the exchange's routing_version
in the same transaction. Each broker process keeps its exchanges' bindings compiled
(app/broker/routing_cache.py) with the (id, routing_version) they were read at; the
publish's one read returns the current versions and the bindings of only the exchanges
whose version differs. A constant default: adding the column rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "exchanges",
        sa.Column("routing_version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("exchanges", "routing_version")
