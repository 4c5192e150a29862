"""a delivery tag only on in-flight rows, so settling by tag never needs the status

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03

Hand-reviewed. 0001 said "in flight <=> a tag AND a lease"; this says "in flight <=> a tag"
and "in flight <=> a lease", which every writer already keeps (a claim sets both, every way
back to ready or dead clears both). With it, the statements that settle a delivery by
(id, tag) need not name ``status = 'in_flight'``: naming it lets the planner walk the
partial in-flight index ``ix_messages_owner`` instead of the primary key, and that walk
grows with the number of deliveries in flight (storage/deliveries.py, ACK_MANY).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD = "(status = 'in_flight') = (delivery_tag IS NOT NULL AND lease_expires_at IS NOT NULL)"
_NEW = (
    "(status = 'in_flight') = (delivery_tag IS NOT NULL) "
    "AND (status = 'in_flight') = (lease_expires_at IS NOT NULL)"
)


def upgrade() -> None:
    op.drop_constraint(op.f("ck_messages_in_flight_has_lease"), "messages", type_="check")
    op.create_check_constraint(op.f("ck_messages_in_flight_has_tag_and_lease"), "messages", _NEW)


def downgrade() -> None:
    op.drop_constraint(op.f("ck_messages_in_flight_has_tag_and_lease"), "messages", type_="check")
    op.create_check_constraint(op.f("ck_messages_in_flight_has_lease"), "messages", _OLD)
