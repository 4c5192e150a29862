"""messagex._insert_trimming: a drop-head publish in one round trip

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05

Hand-reviewed. One function, in schema ``messagex`` (migration 0013), that the broker calls
for a publish group whose length-limited queues only delete their head (``x-max-length``,
``drop-head``, no dead-letter target; storage/limits.py ``insert_and_trim``): it locks the
queues' rows (``FOR NO KEY UPDATE``, in id order), then stores the group's copies and deletes
each queue's head beyond its limit (INSERT_TRIMMING), and returns how many copies it dropped.
Each statement of a VOLATILE PL/pgSQL function reads a snapshot of its own, so the trim counts
every copy committed before the lock was granted, in one call: one round trip, where the
transaction (BEGIN with the lock, the statement, COMMIT) took three.

The body is the text that ``app.storage.limits.trimming_function()`` generated when this was
written (INSERT_TRIMMING, compiled, with its parameters as the function's); the unit tests
check that it still generates it, so a change of that statement comes with a migration that
replaces the function. Like 0013's helpers: owned by the role that runs the migrations,
``EXECUTE`` revoked from PUBLIC, ``search_path`` pinned to ``pg_catalog``, the broker's schema
and ``pg_temp``.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FUNCTION = r"""CREATE FUNCTION messagex._insert_trimming(uuid, bigint[], bigint[], smallint[], text[], text[], text[], text[], text[], bytea[], boolean[], bigint[], bigint[], bigint[], bigint[], bigint[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET search_path = {path} AS $fn$
DECLARE
    due_by timestamptz;
    dropped bigint;
BEGIN
PERFORM FROM queues WHERE id = ANY($14) ORDER BY id FOR NO KEY UPDATE;
due_by := clock_timestamp();
WITH receipt AS (INSERT INTO publish_receipts (token) VALUES (CAST($1 AS uuid))), ttl AS (
    SELECT id, CAST(arguments ->> 'x-message-ttl' AS bigint) AS ms FROM queues
    WHERE id = ANY(CAST($2 AS bigint[])) AND arguments ? 'x-message-ttl'
),
stored AS (
INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers, properties,
                      body, "binary", available_at, expires_at, priority, group_id)
SELECT c.queue_id, m.message_id, m.exchange, m.routing_key, m.headers::jsonb,
       m.properties::jsonb, m.body, m.is_binary,
       now() + m.delay_ms * interval '1 millisecond', now() + m.delay_ms * interval '1 millisecond'
       + LEAST(t.ms, m.expiration_ms) * interval '1 millisecond', c.priority,
       CAST(m.properties AS jsonb) ->> 'group_id'
FROM unnest(CAST($3 AS bigint[]), CAST($2 AS bigint[]),
            CAST($4 AS smallint[]))
         WITH ORDINALITY AS c(msg, queue_id, priority, ord)

JOIN unnest(CAST($5 AS text[]), CAST($6 AS text[]),
            CAST($7 AS text[]), CAST($8 AS text[]),
            CAST($9 AS text[]), CAST($10 AS bytea[]),
            CAST($11 AS boolean[]), CAST($12 AS bigint[]),
            CAST($13 AS bigint[]))
         WITH ORDINALITY AS m(exchange, message_id, routing_key, headers, properties, body,
                              is_binary, delay_ms, expiration_ms, ord)
    ON m.ord = c.msg
LEFT JOIN ttl AS t ON t.id = c.queue_id
ORDER BY c.ord
),
over AS MATERIALIZED (
    SELECT l.queue_id, GREATEST(c.n + l.added - l.max_length, 0) AS n
    FROM unnest(CAST($14 AS bigint[]), CAST($15 AS bigint[]),
                CAST($16 AS bigint[])) AS l(queue_id, max_length, added)
    CROSS JOIN (SELECT set_config('plan_cache_mode', 'auto', true)) AS generic_checks
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM messages
        WHERE queue_id = l.queue_id AND status = 'ready'
          AND available_at <= due_by) AS c
)
DELETE FROM messages WHERE id = ANY(ARRAY(
    SELECT h.id FROM over AS o CROSS JOIN LATERAL (
    SELECT * FROM (
        SELECT id, priority, available_at FROM messages
        WHERE queue_id = o.queue_id AND status = 'ready' AND priority IS NOT NULL
          AND available_at <= due_by
          AND (expires_at IS NULL OR expires_at > due_by)
        ORDER BY priority DESC, available_at, id
        LIMIT o.n FOR UPDATE SKIP LOCKED
    ) AS by_priority
    UNION ALL
    SELECT * FROM (
        SELECT id, priority, available_at FROM messages
        WHERE queue_id = o.queue_id AND status = 'ready' AND priority IS NULL
          AND available_at <= due_by
          AND (expires_at IS NULL OR expires_at > due_by)
        ORDER BY available_at, id
        LIMIT o.n FOR UPDATE SKIP LOCKED
    ) AS plain
    LIMIT o.n) AS h));
GET DIAGNOSTICS dropped = ROW_COUNT;
RETURN dropped;
END
$fn$"""

SIGNATURE = "messagex._insert_trimming(uuid, bigint[], bigint[], smallint[], text[], text[], text[], text[], text[], bytea[], boolean[], bigint[], bigint[], bigint[], bigint[], bigint[])"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def upgrade() -> None:
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {_quote_ident(schema)}, pg_temp"
    op.execute(FUNCTION.replace("{path}", path))
    op.execute(f"REVOKE ALL ON FUNCTION {SIGNATURE} FROM PUBLIC")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
