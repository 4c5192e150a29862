"""The hot path's statements, by name: every statement ``fastpath.HotPath`` runs, in one place,
each with its reasoning about locks and plans (as procrastinate keeps its queries in one file).

Constant SQL, compiled once at import to asyncpg's ``$n`` form (``fastpath.Statement``), so
asyncpg's prepared-statement cache hits on every call. The functions that bind their
parameters and read their rows stay with their subject; the plan tests
(tests/integration/test_query_plans.py) run these by name.

==========================  ==================================================================
publish                     LOAD_ROUTES, LOAD_ROUTE_GRAPH, FIND_QUEUES, INSERT_COPIES,
                            INSERT_COPIES_HANDING_OFF (storage.messages)
publish in doubt            SETTLE_RECEIPT, SWEEP_RECEIPTS (storage.messages)
claim                       CLAIM, CLAIM_DUE, CLAIM_GROUPS, LOCK_GROUP_CLAIM, NEXT_DUE
                            (storage.deliveries)
poll                        READY_QUEUES, READY_QUEUES_OF (storage.deliveries)
acknowledge                 ACK_MANY, ACK_PULL_MANY (storage.deliveries)
authenticate                LOOKUP_PASSWORD_USER, LOOKUP_SESSION (storage.accounts)
==========================  ==================================================================

Everything else (topology, accounts, browse, the retry path's row locks) runs on the
SQLAlchemy engine, next to the function that uses it.
"""

from __future__ import annotations

from sqlalchemy import text

from app.storage.fastpath import Statement

#: A new delivery tag, from the row's id (SQL over a column ``id``); the claim and the
#: publisher's direct hand-off (storage.messages) both make their tags with it.
NEW_TAG_SQL = "{id}::text || '.' || replace(gen_random_uuid()::text, '-', '')"


# -- publish ------------------------------------------------------------------------------

# The named exchanges' ids, types and routing versions, and the bindings (with the bound
# queue's id and name) of those whose
# (id, routing_version) differs from what the caller passed (its compiled copy, NULL when it
# has none), in ONE round trip. When nothing changed, that is one row per exchange with NULL
# binding columns: a publish to an exchange of 100,000 bindings reads a few bytes. The
# differs-test references only the outer row, so PostgreSQL makes it a one-time filter of
# the LATERAL subquery, which is not run at all when the copy is current; OFFSET 0 keeps the
# subquery from being flattened into a join (PostgreSQL then hashed every binding of the
# table before applying the test). No row for a name means no such exchange.
# Every statement that adds or removes bindings of an exchange (exchange-to-exchange ones
# included: they are bindings of their source) increments its routing_version in the same
# transaction (a trigger, migration 0004: cascades and an operator's SQL too), so in one
# snapshot an unchanged version means the very binding set the caller compiled; a deleted and
# re-declared exchange has a new id (and its arguments, so its alternate, can change only so).
# Plain snapshot read, no row locks: a publish must never serialize on the exchange row
# (KEY SHARE locks from concurrent publishers would pile up multixacts). A binding or queue
# created concurrently is simply not seen (the publish is ordered before it); a queue
# deleted between this read and the insert makes the insert's foreign key check fail, and
# the publisher retries with a fresh read (see messages.QueueDeleted; the delete's cascade
# bumped the version of every exchange bound to it). Bindings come in id order, so that routing, and
# so the "queues" list, is deterministic.
# The publisher uses this form while every exchange it names was compiled without
# exchange-to-exchange bindings and alternate (the common case): the read of before §14, plus
# the exchange's ``onward`` count (migration 0009: its e2e bindings, +1 with an alternate). A
# changed exchange whose ``onward`` is above 0 is read again with LOAD_ROUTE_GRAPH; the inner join
# leaves its e2e bindings out here.
LOAD_ROUTES = Statement(
    text("""
SELECT e.name, e.id, e.type, e.routing_version, e.onward, r.queue_id, r.queue_name,
       r.routing_key, r.arguments
FROM unnest(CAST(:names AS text[]), CAST(:known_ids AS bigint[]),
            CAST(:known_versions AS bigint[])) AS k(name, id, version)
JOIN exchanges AS e ON e.name = k.name
LEFT JOIN LATERAL (
    SELECT b.id, q.id AS queue_id, q.name AS queue_name, b.routing_key, b.arguments
    FROM bindings AS b JOIN queues AS q ON q.id = b.queue_id
    WHERE b.exchange_id = e.id
      AND (k.id IS DISTINCT FROM e.id OR k.version IS DISTINCT FROM e.routing_version)
    OFFSET 0
) AS r ON true
ORDER BY e.name, r.id
""")
)
# The same, with each exchange's alternate and its bindings to exchanges (the destination's
# name), for every exchange reachable from :roots through exchange-to-exchange bindings
# and alternate exchanges (contract §14), still in ONE round trip and one snapshot: the
# recursive step probes only the partial index of e2e bindings (uq_bindings_exchange_to_
# exchange), never a queue binding, and UNION stops at exchanges already reached (cycles).
# :names/:known_* give the caller's compiled versions for the exchanges it reached before.
LOAD_ROUTE_GRAPH = Statement(
    text("""
WITH RECURSIVE reach(id) AS (
    SELECT e.id FROM exchanges AS e WHERE e.name = ANY(CAST(:roots AS text[]))
  UNION
    SELECT n.id
    FROM reach JOIN exchanges AS e ON e.id = reach.id
    CROSS JOIN LATERAL (
        SELECT b.destination_exchange_id AS id FROM bindings AS b
        WHERE b.exchange_id = e.id AND b.destination_exchange_id IS NOT NULL
        UNION ALL
        SELECT a.id FROM exchanges AS a WHERE a.name = e.arguments ->> 'alternate-exchange'
    ) AS n
)
SELECT e.name, e.id, e.type, e.routing_version, e.arguments ->> 'alternate-exchange',
       r.queue_id, r.queue_name, r.destination, r.routing_key, r.arguments
FROM reach JOIN exchanges AS e ON e.id = reach.id
LEFT JOIN unnest(CAST(:names AS text[]), CAST(:known_ids AS bigint[]),
                 CAST(:known_versions AS bigint[])) AS k(name, id, version)
       ON k.name = e.name
LEFT JOIN LATERAL (
    SELECT b.id, q.id AS queue_id, q.name AS queue_name, d.name AS destination,
           b.routing_key, b.arguments
    FROM bindings AS b
    LEFT JOIN queues AS q ON q.id = b.queue_id
    LEFT JOIN exchanges AS d ON d.id = b.destination_exchange_id
    WHERE b.exchange_id = e.id
      AND (k.id IS DISTINCT FROM e.id OR k.version IS DISTINCT FROM e.routing_version)
    OFFSET 0
) AS r ON true
ORDER BY e.name, r.id
""")
)

# Direct-to-queue publishes: the queues' ids, for those that exist. Same reasoning.
FIND_QUEUES = Statement(
    text("SELECT name, id FROM queues WHERE name = ANY(CAST(:names AS text[]))")
)

# The parts both publish statements share: the receipt (see messages.settle_in_doubt), and
_RECEIPT = "receipt AS (INSERT INTO publish_receipts (token) VALUES (CAST(:receipt AS uuid)))"
# each message's columns, once per message (1-based ordinal ``m.ord``), joined to copies ``c``
_MESSAGES_OF_COPIES = """
JOIN unnest(CAST(:exchange AS text[]), CAST(:message_id AS text[]),
            CAST(:routing_key AS text[]), CAST(:headers AS text[]),
            CAST(:properties AS text[]), CAST(:body AS bytea[]),
            CAST(:is_binary AS boolean[]), CAST(:delay_ms AS bigint[]),
            CAST(:expiration_ms AS bigint[]))
         WITH ORDINALITY AS m(exchange, message_id, routing_key, headers, properties, body,
                              is_binary, delay_ms, expiration_ms, ord)
    ON m.ord = c.msg"""

# TTL (contract §13): the x-message-ttl of the group's target queues that have one, one probe
# of the queues' primary key per distinct queue (the array's duplicates are removed by the
# index scan); a copy's expires_at is its available_at plus the smaller of that and its
# message's expiration (LEAST ignores NULLs; NULL when neither is set: it never expires).
_TTL = """ttl AS (
    SELECT id, CAST(arguments ->> 'x-message-ttl' AS bigint) AS ms FROM queues
    WHERE id = ANY(CAST(:copy_queue AS bigint[])) AND arguments ? 'x-message-ttl'
)"""
_EXPIRES_AT = """now() + m.delay_ms * interval '1 millisecond'
       + LEAST(t.ms, m.expiration_ms) * interval '1 millisecond'"""

# properties.group_id (contract §16) as messages.group_id, in every queue (a group queue's claim
# reads the column; elsewhere it is stored and ignored). No parameter of its own: read from the
# properties text that the statement stores anyway.
_GROUP_ID = "CAST(m.properties AS jsonb) ->> 'group_id'"

# Every copy of every message of a publish group in ONE statement (one commit, so one WAL
# flush for all the requests that arrived together). Each message's columns travel once
# (arrays indexed by message), and :copy_msg/:copy_queue list the copies as (1-based
# message index, queue id) pairs; the join fans them out. A large body routed to many
# queues is sent once, not once per queue. ORDER BY the copy's ordinal makes ids follow
# publish order within each queue (ids come from the sequence as rows are inserted, above
# the sorted subquery), so consumers see a batch in publish order. available_at uses the
# database clock; :copy_priority is each copy's claim priority (NULL outside priority
# queues, migration 0007). One statement is atomic on its own: no transaction block around it. The
# foreign key check takes KEY SHARE on each target queue row, so a concurrent queue delete
# either waits for this commit (and then deletes the copies with the queue) or has already
# won (FK violation: QueueDeleted, nothing stored). The same statement inserts the group's
# publish receipt (a writable CTE runs exactly once), so the receipt commits exactly when the
# copies do: see messages.settle_in_doubt.
INSERT_COPY_ROWS = f"""
INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers, properties,
                      body, "binary", available_at, expires_at, priority, group_id)
SELECT c.queue_id, m.message_id, m.exchange, m.routing_key, m.headers::jsonb,
       m.properties::jsonb, m.body, m.is_binary,
       now() + m.delay_ms * interval '1 millisecond', {_EXPIRES_AT}, c.priority,
       {_GROUP_ID}
FROM unnest(CAST(:copy_msg AS bigint[]), CAST(:copy_queue AS bigint[]),
            CAST(:copy_priority AS smallint[]))
         WITH ORDINALITY AS c(msg, queue_id, priority, ord)
{_MESSAGES_OF_COPIES}
LEFT JOIN ttl AS t ON t.id = c.queue_id
ORDER BY c.ord
"""
#: the receipt and TTL CTEs that INSERT_COPY_ROWS needs (a statement that adds its own CTEs
#: after them: the length-limited publish, storage/limits.py)
INSERT_COPIES_WITH = f"WITH {_RECEIPT}, {_TTL}"
_INSERT_COPIES = f"{INSERT_COPIES_WITH}\n{INSERT_COPY_ROWS}"
INSERT_COPIES = Statement(text(_INSERT_COPIES))
# The same, returning what the maxlen dead-lettering of the copies needs (reject-publish-dlx:
# broker/limits.py stores the rejected copies, then dead-letters them in its transaction).
INSERT_COPIES_RETURNING = Statement(
    text(_INSERT_COPIES + "RETURNING id, headers::text, exchange, routing_key, now()")
)

# The same, when idle local subscribers have prefetch room (the direct hand-off): copy i may
# go straight to :copy_owner[i] (NULL: it cannot), stored in flight to that connection as a
# claim would leave it (status, tag, lease, delivery_count 1), which saves the claim's
# UPDATE of every row and a round trip. Only a queue with no due ready message may hand off,
# so nothing overtakes a message already waiting (contract §10: claims in (available_at, id)
# order); the test reads the statement's snapshot, so a message committed concurrently is
# one the publish was concurrent with. The test is one probe of ix_messages_claim per queue,
# in the index's order: written as EXISTS (or with LIMIT 1 alone), PostgreSQL planned a
# sequential scan that it expected to stop at the first row, and that read every ready row
# of every other queue: 70-95 ms per publish with 300,000 waiting in another queue.
# Ids are drawn in copy order above the sorted subquery, as the default would draw them.
# Returns the rows stored in flight, by id.
INSERT_COPIES_HANDING_OFF = Statement(
    text(f"""
WITH {_RECEIPT}, {_TTL},
copies AS (
    SELECT * FROM unnest(CAST(:copy_msg AS bigint[]), CAST(:copy_queue AS bigint[]),
                         CAST(:copy_owner AS uuid[]), CAST(:copy_lease AS float8[]),
                         CAST(:copy_priority AS smallint[]))
         WITH ORDINALITY AS c(msg, queue_id, owner, lease, priority, ord)
),
waiting AS (
    SELECT q.queue_id FROM (SELECT DISTINCT queue_id FROM copies WHERE owner IS NOT NULL) AS q
    CROSS JOIN LATERAL (SELECT 1 FROM messages AS r
                        WHERE r.queue_id = q.queue_id AND r.status = 'ready'
                          AND r.available_at <= now()
                          AND (r.expires_at IS NULL OR r.expires_at > now())
                        ORDER BY r.available_at LIMIT 1) AS due
),
numbered AS (
    SELECT nextval('messages_id_seq') AS id, s.*
    FROM (
        SELECT c.queue_id, m.message_id, m.exchange, m.routing_key, m.headers, m.properties,
               m.body, m.is_binary, m.delay_ms, {_EXPIRES_AT} AS expires_at, c.lease,
               c.priority, {_GROUP_ID} AS group_id,
               CASE WHEN c.queue_id IN (SELECT queue_id FROM waiting) THEN NULL
                    ELSE c.owner END AS owner
        FROM copies AS c
        {_MESSAGES_OF_COPIES}
        LEFT JOIN ttl AS t ON t.id = c.queue_id
        ORDER BY c.ord
    ) AS s
),
stored AS (
    INSERT INTO messages (id, queue_id, message_id, exchange, routing_key, headers,
                          properties, body, "binary", available_at, expires_at, status,
                          delivery_count,
                          delivered_at, lease_expires_at, delivery_tag, owner_process,
                          owner_connection, priority, group_id)
    SELECT id, queue_id, message_id, exchange, routing_key, headers::jsonb, properties::jsonb,
           body, is_binary, now() + delay_ms * interval '1 millisecond', expires_at,
           CASE WHEN owner IS NULL THEN 'ready' ELSE 'in_flight' END,
           CASE WHEN owner IS NULL THEN 0 ELSE 1 END,
           CASE WHEN owner IS NOT NULL THEN now() END,
           CASE WHEN owner IS NOT NULL THEN now() + make_interval(secs => lease) END,
           CASE WHEN owner IS NOT NULL THEN {NEW_TAG_SQL.format(id="id")} END,
           CASE WHEN owner IS NOT NULL THEN CAST(:process_id AS uuid) END,
           owner, priority, group_id
    FROM numbered
    ORDER BY id
    RETURNING id, queue_id, delivery_tag, created_at
)
SELECT id, queue_id, delivery_tag, created_at FROM stored
WHERE delivery_tag IS NOT NULL
ORDER BY id
""")
)

# The fence of an in-doubt publish: insert its receipt ourselves. A row back means the
# publish's statement did not commit, and since its own receipt insert would now conflict,
# it never will; no row (ON CONFLICT) means it committed. A commit still in progress holds
# the key: this waits for it, then sees which way it went.
SETTLE_RECEIPT = Statement(
    text("""
INSERT INTO publish_receipts (token) VALUES (CAST(:receipt AS uuid))
ON CONFLICT (token) DO NOTHING
RETURNING true
""")
)

# Receipts only matter for the seconds after a connection broke mid-publish.
SWEEP_RECEIPTS = Statement(
    text("""
DELETE FROM publish_receipts
WHERE created_at < now() - CAST(:older_than_seconds AS bigint) * interval '1 second'
""")
)


# -- claim --------------------------------------------------------------------------------


# The claims' common end: the rows of CTE ``picked`` (id, rn) go in flight, row rn to owner
# :owners[rn] (NULL for a pull: the row belongs to :owner_user), with a new tag and lease.
_TAKE_PICKED_AS = """UPDATE messages AS m SET
    status = 'in_flight',
    delivery_count = m.delivery_count + 1,
    delivered_at = now(),
    lease_expires_at = now() + make_interval(secs => {lease}),
    delivery_tag = {tag},
    owner_process = CAST(:process_id AS uuid),
    owner_connection = (CAST(:owners AS uuid[]))[p.rn],
    owner_user = {owner_user}
FROM {picked}
WHERE m.id = p.id"""
_TAKE_PICKED = _TAKE_PICKED_AS.format(
    picked="picked AS p",
    lease=":lease_seconds",
    tag=NEW_TAG_SQL.format(id="m.id"),
    owner_user="CAST(:owner_user AS text)",
)
#: what a claim returns (deliveries.claimed_rows)
_CLAIMED = (
    "RETURNING p.rn, m.id, m.queue_id, m.message_id, m.exchange, m.routing_key, m.headers::text,"
    "\n          m.properties::text, m.body, m.binary, m.delivery_count, m.created_at,"
    " m.delivery_tag\n"
)


def ready_in_claim_order(columns: str, limit: str, lock: str = "", queue: str = ":queue_id") -> str:
    """The due ready rows of queue ``queue`` (SQL: a parameter or a column) in claim order
    (contract §10, §13), at most ``limit``: a UNION ALL of two index walks, one home for the
    order that claims and drop-head (broker/limits.py) both follow. A priority queue's rows
    all carry a priority (``ix_messages_priority``: priority descending, available_at, id),
    every other queue's none (``ix_messages_claim``: available_at, id), so one branch is
    empty for any queue: a plain queue's claim pays one probe of an index that holds none of
    its rows, and a priority queue's never reaches the second branch while the first fills
    the limit (the Append stops). ``lock``: a locking clause applied in both branches. The
    rows come out in claim order; callers that number them use CLAIM_ORDER. "Due" is by the
    statement's own clock (``statement_timestamp()``, which is ``now()`` for a statement
    alone): inside a transaction that waited for a queue's lock (storage/limits.py),
    ``now()`` would be the time it began, before the copies committed while it waited."""
    return f"""
    SELECT * FROM (
        SELECT {columns} FROM messages
        WHERE queue_id = {queue} AND status = 'ready' AND priority IS NOT NULL
          AND available_at <= statement_timestamp()
          AND (expires_at IS NULL OR expires_at > statement_timestamp())
        ORDER BY priority DESC, available_at, id
        LIMIT {limit} {lock}
    ) AS by_priority
    UNION ALL
    SELECT * FROM (
        SELECT {columns} FROM messages
        WHERE queue_id = {queue} AND status = 'ready' AND priority IS NULL
          AND available_at <= statement_timestamp()
          AND (expires_at IS NULL OR expires_at > statement_timestamp())
        ORDER BY available_at, id
        LIMIT {limit} {lock}
    ) AS plain
    LIMIT {limit}"""


#: claim order over rows of one queue (priority is NULL exactly in plain queues)
CLAIM_ORDER = "priority DESC NULLS LAST, available_at, id"

# Claim up to :n ready rows of one queue in claim order ((available_at, id), or
# (priority descending, available_at, id) in a queue with x-max-priority), in ONE statement.
# An expired copy is never delivered (contract §13): the expiry sweep removes it within a
# second, until then the claim steps over it (in a plain queue expires_at is NULL: one test).
# Headers and properties come back as JSON text, which the frame splices as it is: decoding
# them into Python only to encode them again cost 3.5 µs per row (docs/performance.md).
# FOR UPDATE SKIP LOCKED: concurrent claimers (other subscribers, other processes) each lock
# distinct rows and never wait on each other, so no message is ever in flight twice. The
# inner query walks ix_messages_priority, then ix_messages_claim (both partial on ready rows;
# see ready_in_claim_order). Row i of the claim goes to
# owner :owners[i] — the dispatcher passes its round-robin sequence of subscribers with
# credit, so one round trip serves every local subscriber of the queue. Pull claims pass
# NULL owners (the row then belongs to :owner_user).
CLAIM = Statement(
    text(f"""
WITH picked AS (
    SELECT s.id, row_number() OVER (ORDER BY {CLAIM_ORDER}) AS rn
    FROM ({ready_in_claim_order("id, priority, available_at", ":n", "FOR UPDATE SKIP LOCKED")}
    ) AS s
)
{_TAKE_PICKED}
{_CLAIMED}""")
)

# The claims of several plain queues and the next due time of each, in ONE statement: the
# queues whose delayed copies the dispatcher's timer found due together (Dispatcher._claim_due).
# Per queue of the unnest, CLAIM's own walk (ready_in_claim_order, FOR UPDATE SKIP LOCKED, at
# most that queue's :ns) in its own claim order; row r of queue i goes to owner
# :owners[bases[i] + r] (the owners of every queue in one array). Then, per queue, the first
# ready copy due after this statement (one probe of ix_messages_claim): where the claim left
# no copy due, when to claim next. A copy due now but not taken (locked by another claimer,
# or expired) is not waited for: its claimer hands it out or releases it, which wakes the
# queue, and the poll covers the rest. Rows: (queue id, seconds until its next due copy or
# NULL, then CLAIM's columns), one per claimed copy, and one with NULL claim columns for a
# queue that got none.
# At 167 copies a second falling due over 1,000 queues this is one statement per timer turn
# instead of a claim and a next-due look-up per copy (docs/performance.md, "Scale").
_PICKED_MANY = f"""picked AS (
    SELECT s.id, w.lease,
           w.base + row_number() OVER (PARTITION BY w.queue_id ORDER BY {CLAIM_ORDER}) AS rn
    FROM unnest(CAST(:queue_ids AS bigint[]), CAST(:ns AS int[]),
                CAST(:leases AS float8[]), CAST(:bases AS int[])) AS w(queue_id, n, lease, base)
    CROSS JOIN LATERAL ({
    ready_in_claim_order(
        "id, priority, available_at", "w.n", "FOR UPDATE SKIP LOCKED", queue="w.queue_id"
    )
}
    ) AS s
),
taken AS (SELECT array_agg(id) AS ids, array_agg(rn) AS rns, array_agg(lease) AS leases
          FROM picked)"""
_TAKE_MANY = _TAKE_PICKED_AS.format(
    picked="taken AS t CROSS JOIN unnest(t.ids, t.rns, t.leases) AS p(id, rn, lease)",
    lease="p.lease",
    tag=NEW_TAG_SQL.format(id="m.id"),
    owner_user="NULL",
)
CLAIM_DUE = Statement(
    text(f"""
WITH {_PICKED_MANY},
claimed AS (
{_TAKE_MANY}
{_CLAIMED})
SELECT w.queue_id, EXTRACT(EPOCH FROM (d.available_at - now()))::float8, c.*
FROM unnest(CAST(:queue_ids AS bigint[])) AS w(queue_id)
LEFT JOIN claimed AS c ON c.queue_id = w.queue_id
LEFT JOIN LATERAL (SELECT available_at FROM messages
                   WHERE queue_id = w.queue_id AND status = 'ready'
                     AND available_at > statement_timestamp()
                   ORDER BY available_at LIMIT 1) AS d ON true""")
)

# -- claim in a queue with x-message-groups (contract §16) -----------------------------------
#
# A copy of group g is claimable when no copy of g is in flight in the queue and it is g's
# head: the first of g's ready copies in claim order (due or not, so a delayed copy holds back
# the copies that fall due after it). Two probes per candidate, both of migration 0012's
# indexes, partial on rows with a group_id: ix_messages_group_head (queue, group, priority
# descending, available_at, id; ready rows) and ix_messages_group_busy (queue, group;
# in-flight rows). Copies without a group_id pass at once.
_GROUP_FREE = """(c.group_id IS NULL OR (
        NOT EXISTS (SELECT 1 FROM messages AS f
                    WHERE f.queue_id = :queue_id AND f.group_id IS NOT NULL
                      AND f.group_id = c.group_id AND f.status = 'in_flight')
        AND c.id = (SELECT h.id FROM messages AS h
                    WHERE h.queue_id = :queue_id AND h.group_id = c.group_id
                      AND h.status = 'ready'
                    ORDER BY h.priority DESC, h.available_at, h.id LIMIT 1)))"""

# The claim of a group queue, in ONE statement, run after the queue's transaction-scoped
# advisory lock (deliveries.claim_grouped; a single-active queue's own lock serves as well),
# so that group claims of one queue serialise across processes and each one's snapshot holds
# every earlier one's commit: "no copy of g in flight" is then never read stale, and two
# claimers can never both take a copy of one group. A copy committed late by a concurrent
# publish at worst waits behind the copy already in flight.
# Candidates, in claim order:
# - ``walk``: the first :scan due ready rows in claim order (ready_in_claim_order, the plain
#   claim's index walk) that are claimable, at most :n. With many groups the first rows are
#   mostly heads of free groups, so this costs about what the plain claim does;
# - ``heads``: only when the walk found fewer than :n (a one-time filter: otherwise never
#   run), the head of every group with ready copies, by a loose index scan of
#   ix_messages_group_head (one probe per group) — what finds the free groups when few
#   groups hold a deep backlog and the window is all blocked copies (10 groups, 1,000,000
#   copies: 10 probes, not a walk of the backlog).
# Copies without a group_id beyond the window wait until the window moves (docs/delivery.md).
# No row locks in the candidate scan: every claimer of the queue holds its lock; the UPDATE
# re-checks ``status = 'ready'`` against a concurrent sweep or settlement (a skipped row
# leaves its owner slot unused).
CLAIM_GROUPS = Statement(
    text(f"""
WITH RECURSIVE walk AS (
    SELECT c.id, c.priority, c.available_at
    FROM ({ready_in_claim_order("id, priority, available_at, group_id", ":scan")}
    ) AS c
    WHERE {_GROUP_FREE}
    LIMIT :n
),
short AS (SELECT count(*) < :n AS yes FROM walk),
grp(group_id) AS (
    (SELECT group_id FROM messages
     WHERE queue_id = :queue_id AND status = 'ready' AND group_id IS NOT NULL
       AND (SELECT yes FROM short)
     ORDER BY group_id LIMIT 1)
  UNION ALL
    SELECT n.group_id FROM grp
    CROSS JOIN LATERAL (SELECT group_id FROM messages
                        WHERE queue_id = :queue_id AND status = 'ready'
                          AND group_id IS NOT NULL AND group_id > grp.group_id
                        ORDER BY group_id LIMIT 1) AS n
),
heads AS (
    SELECT h.id, h.priority, h.available_at FROM grp
    CROSS JOIN LATERAL (SELECT id, priority, available_at, expires_at FROM messages
                        WHERE queue_id = :queue_id AND group_id = grp.group_id
                          AND status = 'ready'
                        ORDER BY priority DESC, available_at, id LIMIT 1) AS h
    WHERE h.available_at <= statement_timestamp()
      AND (h.expires_at IS NULL OR h.expires_at > statement_timestamp())
      AND NOT EXISTS (SELECT 1 FROM messages AS f
                      WHERE f.queue_id = :queue_id AND f.group_id IS NOT NULL
                        AND f.group_id = grp.group_id AND f.status = 'in_flight')
),
picked AS (
    SELECT s.id, row_number() OVER (ORDER BY {CLAIM_ORDER}) AS rn
    FROM (SELECT id, priority, available_at FROM walk
          UNION
          SELECT id, priority, available_at FROM heads
          ORDER BY {CLAIM_ORDER} LIMIT :n) AS s
)
{_TAKE_PICKED} AND m.status = 'ready'
{_CLAIMED}""")
)

# The queue's group-claim lock (see CLAIM_GROUPS), a statement of its own so that the claim's
# snapshot is taken after it is granted.
LOCK_GROUP_CLAIM = Statement(
    text("""
SELECT pg_advisory_xact_lock(hashtextextended('messagex.groups:' || CAST(:queue_id AS bigint), 0))
""")
)

# Seconds from the database's now() to the queue's next due ready message: <= 0 when one is
# due, NULL when the queue has no ready rows. min() over ix_messages_claim is an index probe.
# Expired copies (not yet swept) do not count: the dispatcher would claim again at once.
NEXT_DUE = Statement(
    text("""
SELECT EXTRACT(EPOCH FROM (min(available_at) - now()))::float8
FROM messages WHERE queue_id = :queue_id AND status = 'ready'
  AND (expires_at IS NULL OR expires_at > now())
""")
)


# The dispatcher's poll (once a second per process, whatever the number of subscriptions):
# every queue that has ready rows, with the seconds from now() to its first one (<= 0: due).
# A loose index scan of ix_messages_claim: one probe per queue that has ready rows, however
# many rows wait in it, and one probe in all when nothing waits anywhere — so an idle
# broker's poll costs nothing per subscription. The caller keeps the queues it subscribes.
# :after (0: from the first queue) is a parameter so that the plan is made for the table as
# it is at each call (app/storage/planner.py): PostgreSQL keeps the first plan of a prepared
# statement without parameters, and one made while the table looked empty scans it.
READY_QUEUES = Statement(
    text("""
WITH RECURSIVE ready(queue_id, available_at) AS (
    (SELECT queue_id, available_at FROM messages
     WHERE status = 'ready' AND queue_id > CAST(:after AS bigint)
     ORDER BY queue_id, available_at LIMIT 1)
    UNION ALL
    SELECT n.queue_id, n.available_at
    FROM ready AS r
    CROSS JOIN LATERAL (SELECT queue_id, available_at FROM messages
                        WHERE status = 'ready' AND queue_id > r.queue_id
                        ORDER BY queue_id, available_at LIMIT 1) AS n
)
SELECT queue_id, EXTRACT(EPOCH FROM (available_at - now()))::float8 FROM ready
""")
)

# The same for the given queues only: one probe of ix_messages_claim per queue. Cheaper than
# READY_QUEUES when a process subscribes to few queues and many others hold messages.
READY_QUEUES_OF = Statement(
    text("""
SELECT q.id, EXTRACT(EPOCH FROM (d.available_at - now()))::float8
FROM unnest(CAST(:queue_ids AS bigint[])) AS q(id)
CROSS JOIN LATERAL (SELECT available_at FROM messages
                    WHERE queue_id = q.id AND status = 'ready'
                    ORDER BY available_at LIMIT 1) AS d
""")
)

# Which of these queues still exist: a process that polls instead of LISTENing (broker/cluster.py)
# is not told of a queue deleted elsewhere. One probe of the primary key per queue.
EXISTING_QUEUES = Statement(
    text("SELECT id FROM queues WHERE id = ANY(CAST(:queue_ids AS bigint[]))")
)


# -- acknowledge ----------------------------------------------------------------------------

# Acks that arrive together settle in one statement: the row must still be in flight with
# exactly this tag and owned by this connection, so a double ack, another connection's tag or
# a tag that timed out (and was re-claimed with a new tag, or requeued with none) deletes
# nothing. Row locks make a concurrent sweep or release and this delete serialise: whichever
# commits first wins, the other sees the changed row and skips it.
# A set tag means in flight (ck_messages_in_flight_has_tag_and_lease), so these statements do
# not name the status: with `status = 'in_flight'` the planner may walk the partial in-flight
# index (ix_messages_owner) instead of the primary key, and that walk grows with the number of
# deliveries in flight (tests/integration/test_query_plans.py).
ACK_MANY = Statement(
    text("""
DELETE FROM messages AS m
USING unnest(CAST(:ids AS bigint[]), CAST(:tags AS text[]), CAST(:owners AS uuid[]))
      AS a(id, tag, owner)
WHERE m.id = a.id AND m.delivery_tag = a.tag AND m.owner_connection = a.owner
RETURNING m.delivery_tag, m.owner_connection::text, m.queue_id
""")
)

# Pulled deliveries of one user (POST /deliveries/{tag}/ack and POST /deliveries/ack): a pull
# delivery belongs to the user that got it and to no connection; rows by primary key.
ACK_PULL_MANY = Statement(
    text("""
DELETE FROM messages AS m
USING unnest(CAST(:ids AS bigint[]), CAST(:tags AS text[])) AS a(id, tag)
WHERE m.id = a.id AND m.delivery_tag = a.tag
  AND m.owner_connection IS NULL AND m.owner_user = :owner_user
RETURNING m.delivery_tag, m.queue_id
""")
)


# -- authenticate ---------------------------------------------------------------------------

# The rate-limit state of the request's keys (the longest time left among those that reached
# their limit, and which) joined with the user or the live session, in ONE constant statement
# on the hot path: it runs on every authenticated request that the Basic cache does not
# answer. A key is locked while its fixed window (from its first counted failure) is open and
# its failure count has reached the key's limit. The aggregate always yields exactly one row,
# so a missing user or session still brings the rate-limit answer.
_LIMITED = """
WITH limited AS (
    SELECT max(ceil(extract(epoch FROM f.window_start + make_interval(secs => :window)
                                       - now())))::int AS retry_after,
           array_agg(f.key) AS locked
    FROM auth_failures AS f
    JOIN unnest(CAST(:keys AS text[]), CAST(:limits AS int[])) AS k(key, lim) ON k.key = f.key
    WHERE f.failures >= k.lim AND f.window_start + make_interval(secs => :window) > now()
)
"""
_USER_SQL = """u.id, u.username, u.password_hash, u.role, u.perm_configure, u.perm_write,
       u.perm_read, u.loopback_only"""

LOOKUP_PASSWORD_USER = Statement(
    text(
        _LIMITED
        + f"""
SELECT l.retry_after, l.locked, {_USER_SQL}
FROM limited AS l LEFT JOIN broker_users AS u ON u.username = CAST(:username AS text)
"""
    )
)

LOOKUP_SESSION = Statement(
    text(
        _LIMITED
        + f"""
SELECT l.retry_after, l.locked, s.token_digest, {_USER_SQL}
FROM limited AS l
LEFT JOIN (management_sessions AS s JOIN broker_users AS u ON u.id = s.user_id)
       ON s.token_digest = :digest AND s.expires_at > now()
"""
    )
)
