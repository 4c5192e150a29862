"""publish_dedup: index the sweep by (queue_id, published_at)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05

Hand-reviewed. The sweep of contract §15's bookkeeping deletes, per queue, the rows older
than that queue's own window (app/storage/dedup.py). With 0011's index on ``published_at``
alone, a walk from the oldest row reaches a short-window queue's expired rows only after
every younger-than-its-window row of the long-window queues (a one-day window keeps a day
of rows in front of them), so an idle sweep was not cheap. ``(queue_id, published_at)``
makes each queue's expired rows one index range, and lets the sweep find the queues that
have rows by skipping through the index's first column: an idle sweep is one probe per
queue that has rows, none at all on an empty table. It replaces the ``published_at`` index
(nothing else reads it), so a claim still writes two index entries.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_publish_dedup_sweep", "publish_dedup", ["queue_id", "published_at"], unique=False
    )
    op.drop_index(op.f("ix_publish_dedup_published_at"), table_name="publish_dedup")


def downgrade() -> None:
    op.create_index(op.f("ix_publish_dedup_published_at"), "publish_dedup", ["published_at"])
    op.drop_index("ix_publish_dedup_sweep", table_name="publish_dedup")
