"""bindings.destination_exchange_id: exchange-to-exchange bindings (contract §14)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04

Hand-reviewed. A binding now leads from its exchange to either a queue (``queue_id``) or
another exchange (``destination_exchange_id``): exactly one of the two is set (a check).
Both go with the row they point at (ON DELETE CASCADE), and the routing_version trigger of
migration 0004 already bumps the *source* exchange's version on every change, so a cascade
from deleting a destination exchange is seen by the next publish on every process.

One partial unique index on (exchange_id, destination_exchange_id, routing_key, arguments)
for the exchange-to-exchange rows only: it makes identical e2e bindings one (as the existing
unique constraint does for queue bindings; its NULL queue_id keeps e2e rows out of it), and
it is what the publish's graph walk probes by exchange_id, reading no queue binding. A
partial index on destination_exchange_id serves the cascade and ``?destination_exchange=``.
Adding a nullable column and dropping a NOT NULL rewrite nothing.

``exchanges.onward`` counts how an exchange routes on: its e2e bindings, plus one when it
has an ``alternate-exchange``. The publish's plain route read returns it, so a publish to an
exchange with neither pays nothing for §14 (its read is the one of before, plus this
column). The declare sets it from the arguments; the routing_version trigger of 0004 now
adds, in the same UPDATE, the change in each exchange's e2e bindings that the statement made
(counted from the transition tables, so it is exact under concurrency: a waiting UPDATE
re-applies the delta to the row version it finally locks, as it does the version bump).
A constant default: adding it rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_E2E = sa.text("destination_exchange_id IS NOT NULL")

# 0004's function, which bumps the routing_version of the exchanges whose bindings changed;
# 0009's also keeps ``onward`` (one grouped pass over the statement's transition tables).
_FUNCTION_0004 = """
CREATE OR REPLACE FUNCTION bindings_routing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE exchanges SET routing_version = routing_version + 1
        WHERE id IN (SELECT exchange_id FROM new_bindings);
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE exchanges SET routing_version = routing_version + 1
        WHERE id IN (SELECT exchange_id FROM old_bindings);
    ELSE
        UPDATE exchanges SET routing_version = routing_version + 1
        WHERE id IN (SELECT exchange_id FROM old_bindings
                     UNION SELECT exchange_id FROM new_bindings);
    END IF;
    RETURN NULL;
END
$$
"""
_E2E_DELTA = "count(*) FILTER (WHERE destination_exchange_id IS NOT NULL)"
_FUNCTION = f"""
CREATE OR REPLACE FUNCTION bindings_routing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE exchanges AS e
        SET routing_version = e.routing_version + 1, onward = e.onward + d.delta
        FROM (SELECT exchange_id, {_E2E_DELTA} AS delta FROM new_bindings
              GROUP BY exchange_id) AS d
        WHERE e.id = d.exchange_id;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE exchanges AS e
        SET routing_version = e.routing_version + 1, onward = e.onward - d.delta
        FROM (SELECT exchange_id, {_E2E_DELTA} AS delta FROM old_bindings
              GROUP BY exchange_id) AS d
        WHERE e.id = d.exchange_id;
    ELSE
        UPDATE exchanges AS e
        SET routing_version = e.routing_version + 1, onward = e.onward + d.delta
        FROM (SELECT exchange_id, sum(delta) AS delta FROM (
                  SELECT exchange_id, {_E2E_DELTA} AS delta FROM new_bindings
                  GROUP BY exchange_id
                  UNION ALL
                  SELECT exchange_id, -{_E2E_DELTA} FROM old_bindings GROUP BY exchange_id
              ) AS c GROUP BY exchange_id) AS d
        WHERE e.id = d.exchange_id;
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.add_column(
        "exchanges",
        sa.Column("onward", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )
    op.execute("UPDATE exchanges SET onward = 1 WHERE arguments ? 'alternate-exchange'")
    op.execute(_FUNCTION)
    op.add_column("bindings", sa.Column("destination_exchange_id", sa.BigInteger(), nullable=True))
    op.create_foreign_key(
        "fk_bindings_destination_exchange_id_exchanges",
        "bindings",
        "exchanges",
        ["destination_exchange_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.alter_column("bindings", "queue_id", existing_type=sa.BigInteger(), nullable=True)
    op.create_check_constraint(
        "ck_bindings_one_destination",
        "bindings",
        "(queue_id IS NULL) <> (destination_exchange_id IS NULL)",
    )
    op.create_index(
        "uq_bindings_exchange_to_exchange",
        "bindings",
        ["exchange_id", "destination_exchange_id", "routing_key", "arguments"],
        unique=True,
        postgresql_where=_E2E,
    )
    op.create_index(
        "ix_bindings_destination_exchange_id",
        "bindings",
        ["destination_exchange_id"],
        postgresql_where=_E2E,
    )


def downgrade() -> None:
    op.execute("DELETE FROM bindings WHERE destination_exchange_id IS NOT NULL")
    op.execute(_FUNCTION_0004)
    op.drop_column("exchanges", "onward")
    op.drop_index("ix_bindings_destination_exchange_id", table_name="bindings")
    op.drop_index("uq_bindings_exchange_to_exchange", table_name="bindings")
    op.drop_constraint("ck_bindings_one_destination", "bindings", type_="check")
    op.alter_column("bindings", "queue_id", existing_type=sa.BigInteger(), nullable=False)
    op.drop_constraint(
        "fk_bindings_destination_exchange_id_exchanges", "bindings", type_="foreignkey"
    )
    op.drop_column("bindings", "destination_exchange_id")
