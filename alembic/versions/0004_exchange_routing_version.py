"""exchanges.routing_version: a publish reads an exchange's bindings only when they changed

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-04

Hand-reviewed. Every statement that inserts, updates or deletes bindings (bind, unbind, the
cascade of a queue or exchange delete, an operator's SQL) increments the routing_version
of their exchanges, by a statement-level trigger, in the same transaction. Each broker
process keeps its exchanges' bindings compiled (app/broker/routing_cache.py) with the
(id, routing_version) they were read at; the publish's one read returns the current
versions and the bindings of only the exchanges whose version differs. A trigger rather
than the application's statements, so that no path that changes bindings can forget it.
A constant default: adding the column rewrites nothing.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One function for the three triggers; each names only the transition tables it has (a
# PL/pgSQL statement is planned when it first runs, so the other branch is never planned).
_FUNCTION = """
CREATE FUNCTION bindings_routing_changed() RETURNS trigger LANGUAGE plpgsql AS $$
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

_TRIGGERS = {
    "bindings_inserted": "AFTER INSERT ON bindings REFERENCING NEW TABLE AS new_bindings",
    "bindings_deleted": "AFTER DELETE ON bindings REFERENCING OLD TABLE AS old_bindings",
    "bindings_updated": (
        "AFTER UPDATE ON bindings REFERENCING OLD TABLE AS old_bindings NEW TABLE AS new_bindings"
    ),
}


def upgrade() -> None:
    op.add_column(
        "exchanges",
        sa.Column("routing_version", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(_FUNCTION)
    for name, when in _TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER {name} {when} FOR EACH STATEMENT "
            "EXECUTE FUNCTION bindings_routing_changed()"
        )


def downgrade() -> None:
    for name in _TRIGGERS:
        op.execute(f"DROP TRIGGER {name} ON bindings")
    op.execute("DROP FUNCTION bindings_routing_changed()")
    op.drop_column("exchanges", "routing_version")
