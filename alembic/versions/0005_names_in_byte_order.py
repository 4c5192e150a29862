"""many resources: name-ordered list pages from the unique index

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04

Hand-reviewed. GET /queues and GET /exchanges page in byte order of names (COLLATE "C"),
which the unique constraints' indexes, in the database's collation, could not give in
order: a page sorted the whole table (36 ms at 100,000 queues; 1 ms in index order). The
names now have collation "C": equality is unchanged (every collation here is
deterministic), the code orders by ``COLLATE "C"`` explicitly everywhere, and the change
rewrites no table, only the two unique indexes.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("queues", "exchanges"):
        op.alter_column(
            table,
            "name",
            type_=sa.Text(collation="C"),
            existing_type=sa.Text(),
            existing_nullable=False,
        )


def downgrade() -> None:
    for table in ("queues", "exchanges"):
        op.alter_column(
            table,
            "name",
            type_=sa.Text(),
            existing_type=sa.Text(collation="C"),
            existing_nullable=False,
        )
