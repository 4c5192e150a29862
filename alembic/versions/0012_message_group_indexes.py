"""message groups: the two indexes of the group claim (contract §16)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04

Hand-reviewed. ``messages.group_id`` (migration 0011) holds ``properties.group_id`` in every
queue; a queue declared with ``x-message-groups: true`` claims with
``storage.queries.CLAIM_GROUPS``, which probes, per candidate copy of group g:

- ``ix_messages_group_head`` (queue_id, group_id, priority DESC, available_at, id), partial
  on ready rows with a group_id: g's head (its first ready copy in claim order; priority is
  NULL outside priority queues, so there the order is (available_at, id)), and, walked as a
  loose index scan, every group that has ready copies (one probe per group);
- ``ix_messages_group_busy`` (queue_id, group_id), partial on in-flight rows with a group_id:
  whether g has a copy in flight.

Copies without a group_id (every copy of a queue whose publishers never set one) enter
neither index, so such queues' inserts and claims maintain nothing new. Created in the
migration's transaction (as ix_messages_priority was): a deployment with a large backlog
of copies with a group_id may prefer to build them CONCURRENTLY by hand first, under these
names, before upgrading.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_messages_group_head",
        "messages",
        ["queue_id", "group_id", sa.text("priority DESC"), "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'ready' AND group_id IS NOT NULL"),
        if_not_exists=True,
    )
    op.create_index(
        "ix_messages_group_busy",
        "messages",
        ["queue_id", "group_id"],
        unique=False,
        postgresql_where=sa.text("status = 'in_flight' AND group_id IS NOT NULL"),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_index("ix_messages_group_busy", table_name="messages")
    op.drop_index("ix_messages_group_head", table_name="messages")
