"""Diagnosis (contract §19) and the connections view (§20): what each process reports

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05

Hand-reviewed. Every column is nullable without a default (or a constant default): adding
them rewrites no table.

- ``subscriptions.last_ack_at``: the last settlement (ACK, NACK, REJECT) of the
  subscription, written by its process with its heartbeat (every 2 s) for the subscriptions
  that settled since the previous one — never on the ACK path itself.
- ``queues.unsubscribed_at``: when the queue's last subscription ended (set by every
  UNSUBSCRIBE, close and reaping of a dead process), so that ``no_consumers`` can say "no
  subscriber for 30 s".
- ``broker_processes.listen_pid``: the backend pid of the process's LISTEN connection (NULL
  while it is down), ``pool_in_use``/``pool_size``: its connection pool's use; all written
  with the heartbeat.
- ``websocket_connections.client_address``: where the connection came from (§20);
  ``close_requested_at``: an administrator asked to close it (§20). Its process closes it
  when the cluster event reaches it, and at the latest with its next heartbeat, whose
  statement returns the connections to close.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("subscriptions", sa.Column("last_ack_at", sa.DateTime(timezone=True)))
    op.add_column("queues", sa.Column("unsubscribed_at", sa.DateTime(timezone=True)))
    op.add_column("broker_processes", sa.Column("listen_pid", sa.Integer()))
    op.add_column("broker_processes", sa.Column("pool_in_use", sa.Integer()))
    op.add_column("broker_processes", sa.Column("pool_size", sa.Integer()))
    op.add_column("websocket_connections", sa.Column("client_address", sa.Text()))
    op.add_column(
        "websocket_connections", sa.Column("close_requested_at", sa.DateTime(timezone=True))
    )


def downgrade() -> None:
    op.drop_column("websocket_connections", "close_requested_at")
    op.drop_column("websocket_connections", "client_address")
    op.drop_column("broker_processes", "pool_size")
    op.drop_column("broker_processes", "pool_in_use")
    op.drop_column("broker_processes", "listen_pid")
    op.drop_column("queues", "unsubscribed_at")
    op.drop_column("subscriptions", "last_ack_at")
