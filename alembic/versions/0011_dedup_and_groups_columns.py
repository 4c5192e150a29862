"""publish_dedup and messages.group_id: the storage that §15 and §16 share with §18

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04

Hand-reviewed. Laid down before the features that use them, so that the broker's publish
(app/storage) and the SQL publish of contract §18 (schema ``messagex``) write the same rows.

- ``publish_dedup``: one row per (queue, message_id) published into a queue declared with
  ``x-deduplication-window-seconds`` (contract §15), kept while the window lasts. A publish
  claims its row with ``INSERT ... ON CONFLICT (queue_id, message_id) DO UPDATE SET
  published_at = EXCLUDED.published_at WHERE publish_dedup.published_at <=
  EXCLUDED.published_at - window RETURNING queue_id``: a queue it returns gets the copy, any
  other is a duplicate. Two concurrent publishes of one message_id serialise on the primary
  key (the second waits for the first to commit or roll back), so exactly one is stored.
  Rows older than their queue's window are swept. Goes with its queue (ON DELETE CASCADE).
- ``messages.group_id``: ``properties.group_id`` of a copy (contract §16), NULL when absent;
  a plain column so that the group claim can index and compare it. Nullable without a
  default: adding it rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "publish_dedup",
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column(
            "published_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("statement_timestamp()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_publish_dedup_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("queue_id", "message_id", name=op.f("pk_publish_dedup")),
    )
    # The sweep: rows by age.
    op.create_index(op.f("ix_publish_dedup_published_at"), "publish_dedup", ["published_at"])
    op.add_column("messages", sa.Column("group_id", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("messages", "group_id")
    op.drop_index(op.f("ix_publish_dedup_published_at"), table_name="publish_dedup")
    op.drop_table("publish_dedup")
