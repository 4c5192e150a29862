"""initial schema: topology, messages, accounts, live-consumer bookkeeping

Revision ID: 0001
Revises:
Create Date: 2026-12-02

Hand-reviewed. Notes on ``messages``, the hot table:
- ``fillfactor = 70`` and aggressive autovacuum: every message is inserted, updated
  (claim) and deleted (ack), so dead tuples pile up fast; free room on each page lets
  claim/release updates stay on the page.
- Four partial/compound indexes, one per access path: the claim (ready rows by queue,
  available_at, id), the ack-timeout sweep (in-flight by lease expiry), the release on
  disconnect (in-flight by owning connection) and browse/cascade (queue, id).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "auth_failures",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column(
            "window_start",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("failures", sa.Integer(), server_default=sa.text("1"), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_auth_failures")),
    )
    op.create_table(
        "broker_processes",
        sa.Column("id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("connections", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_broker_processes")),
    )
    op.create_table(
        "broker_users",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("username", sa.Text(), nullable=False),
        sa.Column("password_hash", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), server_default=sa.text("'user'"), nullable=False),
        sa.Column("perm_configure", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("perm_write", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("perm_read", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column("loopback_only", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("role IN ('admin', 'user')", name=op.f("ck_broker_users_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_broker_users")),
        sa.UniqueConstraint("username", name=op.f("uq_broker_users_username")),
    )
    op.create_table(
        "exchanges",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("type", sa.Text(), nullable=False),
        sa.Column("durable", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("auto_delete", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "arguments",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "type IN ('direct', 'fanout', 'topic', 'headers')", name=op.f("ck_exchanges_type")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_exchanges")),
        sa.UniqueConstraint("name", name=op.f("uq_exchanges_name")),
    )
    op.create_table(
        "queues",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("durable", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("max_delivery_count", sa.Integer(), nullable=True),
        sa.Column("dead_letter_queue_id", sa.BigInteger(), nullable=True),
        sa.Column("ack_timeout_seconds", sa.Integer(), nullable=True),
        sa.Column(
            "arguments",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "ack_timeout_seconds IS NULL OR ack_timeout_seconds >= 1",
            name=op.f("ck_queues_ack_timeout_seconds"),
        ),
        sa.CheckConstraint(
            "dead_letter_queue_id IS DISTINCT FROM id", name=op.f("ck_queues_dead_letter_not_self")
        ),
        sa.CheckConstraint(
            "max_delivery_count IS NULL OR max_delivery_count >= 1",
            name=op.f("ck_queues_max_delivery_count"),
        ),
        sa.ForeignKeyConstraint(
            ["dead_letter_queue_id"],
            ["queues.id"],
            name=op.f("fk_queues_dead_letter_queue_id_queues"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queues")),
        sa.UniqueConstraint("name", name=op.f("uq_queues_name")),
    )
    op.create_index(
        op.f("ix_queues_dead_letter_queue_id"),
        "queues",
        ["dead_letter_queue_id"],
        unique=False,
        postgresql_where=sa.text("dead_letter_queue_id IS NOT NULL"),
    )
    op.create_table(
        "bindings",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("exchange_id", sa.BigInteger(), nullable=False),
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("routing_key", sa.Text(), server_default=sa.text("''"), nullable=False),
        sa.Column(
            "arguments",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["exchange_id"],
            ["exchanges.id"],
            name=op.f("fk_bindings_exchange_id_exchanges"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_bindings_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bindings")),
        sa.UniqueConstraint(
            "exchange_id",
            "queue_id",
            "routing_key",
            "arguments",
            name=op.f("uq_bindings_exchange_id_queue_id_routing_key_arguments"),
        ),
    )
    op.create_index(op.f("ix_bindings_queue_id"), "bindings", ["queue_id"], unique=False)
    op.create_table(
        "management_sessions",
        sa.Column("token_digest", sa.LargeBinary(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["broker_users.id"],
            name=op.f("fk_management_sessions_user_id_broker_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("token_digest", name=op.f("pk_management_sessions")),
    )
    op.create_index(
        op.f("ix_management_sessions_expires_at"),
        "management_sessions",
        ["expires_at"],
        unique=False,
    )
    op.create_index(
        op.f("ix_management_sessions_user_id"), "management_sessions", ["user_id"], unique=False
    )
    op.create_table(
        "messages",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.Text(), server_default=sa.text("'ready'"), nullable=False),
        sa.Column("message_id", sa.Text(), nullable=False),
        sa.Column("exchange", sa.Text(), nullable=False),
        sa.Column("routing_key", sa.Text(), nullable=False),
        sa.Column(
            "headers",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column(
            "properties",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.Column("binary", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("delivery_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "available_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivery_tag", sa.Text(), nullable=True),
        sa.Column("owner_process", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("owner_connection", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("owner_user", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "(status = 'in_flight') = (delivery_tag IS NOT NULL AND lease_expires_at IS NOT NULL)",
            name=op.f("ck_messages_in_flight_has_lease"),
        ),
        sa.CheckConstraint(
            "status IN ('ready', 'in_flight', 'dead')", name=op.f("ck_messages_status")
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_messages_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_messages")),
        postgresql_with={"fillfactor": 70},
    )
    op.create_index(
        "ix_messages_claim",
        "messages",
        ["queue_id", "available_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'ready'"),
    )
    op.create_index(
        "ix_messages_lease",
        "messages",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'in_flight'"),
    )
    op.create_index(
        "ix_messages_owner",
        "messages",
        ["owner_connection"],
        unique=False,
        postgresql_where=sa.text("status = 'in_flight'"),
    )
    op.create_index("ix_messages_queue", "messages", ["queue_id", "id"], unique=False)
    op.create_table(
        "subscriptions",
        sa.Column("connection_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("queue_id", sa.BigInteger(), nullable=False),
        sa.Column("process_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("prefetch", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["process_id"],
            ["broker_processes.id"],
            name=op.f("fk_subscriptions_process_id_broker_processes"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["queue_id"],
            ["queues.id"],
            name=op.f("fk_subscriptions_queue_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("connection_id", "queue_id", name=op.f("pk_subscriptions")),
    )
    op.create_index(
        op.f("ix_subscriptions_process_id"), "subscriptions", ["process_id"], unique=False
    )
    op.create_index(op.f("ix_subscriptions_queue_id"), "subscriptions", ["queue_id"], unique=False)
    op.execute(
        "ALTER TABLE messages SET (autovacuum_vacuum_scale_factor = 0.01, "
        "autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
        "autovacuum_vacuum_cost_delay = 0)"
    )
    op.execute(
        "INSERT INTO exchanges (name, type) VALUES "
        "('amq.direct', 'direct'), ('amq.fanout', 'fanout'), "
        "('amq.topic', 'topic'), ('amq.headers', 'headers')"
    )


def downgrade() -> None:
    for table in (
        "subscriptions",
        "messages",
        "management_sessions",
        "bindings",
        "queues",
        "exchanges",
        "broker_users",
        "broker_processes",
        "auth_failures",
    ):
        op.drop_table(table)
