"""Tables of the broker. alembic's ``target_metadata``; the migration test compares them.

Names of constraints and indexes follow ``NAMING_CONVENTION`` so that driver errors can be
mapped to domain errors by constraint name (see ``storage.driver_errors``).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

NOW = text("now()")
EMPTY_OBJECT = text("'{}'::jsonb")


def _ts(name: str, *, nullable: bool = False, default: bool = True) -> Column[object]:
    return Column(
        name,
        DateTime(timezone=True),
        nullable=nullable,
        server_default=NOW if default else None,
    )


def _process_id() -> Column[object]:
    """The broker process a row lives on: the row dies with the process's row."""
    return Column(
        "process_id",
        UUID(as_uuid=False),
        ForeignKey("broker_processes.id", ondelete="CASCADE"),
        nullable=False,
    )


exchanges = Table(
    "exchanges",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("name", Text(collation="C"), nullable=False),  # byte order, as queues.name
    Column("type", Text, nullable=False),
    Column("durable", Boolean, nullable=False, server_default=text("true")),
    Column("auto_delete", Boolean, nullable=False, server_default=text("false")),
    Column("arguments", JSONB, nullable=False, server_default=EMPTY_OBJECT),
    _ts("created_at"),
    # Incremented, by trigger (migration 0004), by every statement that adds or removes
    # bindings of the exchange, so that broker processes can keep its bindings compiled
    # (broker/routing_cache.py).
    Column("routing_version", BigInteger, nullable=False, server_default=text("0")),
    # How it routes on (§14): its exchange-to-exchange bindings, plus 1 with an alternate
    # exchange. Set at declare, kept by the same trigger (migration 0009); the plain route
    # read returns it (storage.queries.LOAD_ROUTES).
    Column("onward", Integer, nullable=False, server_default=text("0")),
    UniqueConstraint("name"),
    CheckConstraint("type IN ('direct', 'fanout', 'topic', 'headers')", name="type"),
)

queues = Table(
    "queues",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    # Byte order (collation "C", whatever the database's), so that the unique index gives
    # GET /queues its pages in order: a page sorted every queue (36 ms at 100,000 queues).
    Column("name", Text(collation="C"), nullable=False),
    Column("durable", Boolean, nullable=False, server_default=text("true")),
    Column("max_delivery_count", Integer, nullable=True),
    # ON DELETE RESTRICT: a queue named as another's dead-letter queue cannot go (409).
    Column(
        "dead_letter_queue_id",
        BigInteger,
        ForeignKey("queues.id", ondelete="RESTRICT"),
        nullable=True,
    ),
    Column("ack_timeout_seconds", Integer, nullable=True),
    Column("arguments", JSONB, nullable=False, server_default=EMPTY_OBJECT),
    _ts("created_at"),
    # When a queue with x-expires is deleted unless used before (contract §13); NULL for
    # every other queue. Pushed forward by declare, get, subscribe and unsubscribe.
    _ts("idle_expires_at", nullable=True, default=False),
    # When its last subscription ended (diagnosis, contract §19: no subscriber for 30 s);
    # NULL: none ever ended (migration 0015).
    _ts("unsubscribed_at", nullable=True, default=False),
    UniqueConstraint("name"),
    CheckConstraint(
        "max_delivery_count IS NULL OR max_delivery_count >= 1", name="max_delivery_count"
    ),
    CheckConstraint(
        "ack_timeout_seconds IS NULL OR ack_timeout_seconds >= 1", name="ack_timeout_seconds"
    ),
    CheckConstraint("dead_letter_queue_id IS DISTINCT FROM id", name="dead_letter_not_self"),
)
Index(
    None, queues.c.dead_letter_queue_id, postgresql_where=queues.c.dead_letter_queue_id.isnot(None)
)
# The queue-expiry sweep: queues with x-expires by deadline.
Index(None, queues.c.idle_expires_at, postgresql_where=queues.c.idle_expires_at.isnot(None))
# Which queues name an exchange as their dead-letter exchange (deleting it is 409).
Index(
    "ix_queues_dead_letter_exchange",
    queues.c.arguments.op("->>")(text("'x-dead-letter-exchange'")),
    postgresql_where=text("arguments ? 'x-dead-letter-exchange'"),
)

bindings = Table(
    "bindings",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column(
        "exchange_id", BigInteger, ForeignKey("exchanges.id", ondelete="CASCADE"), nullable=False
    ),
    # A binding leads to a queue or (contract §14) to another exchange: exactly one is set.
    Column("queue_id", BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), nullable=True),
    Column("routing_key", Text, nullable=False, server_default=text("''")),
    Column("arguments", JSONB, nullable=False, server_default=EMPTY_OBJECT),
    _ts("created_at"),
    Column(
        "destination_exchange_id",
        BigInteger,
        ForeignKey("exchanges.id", ondelete="CASCADE"),
        nullable=True,
    ),
    # Bindings that differ only in arguments are distinct (contract §6).
    UniqueConstraint("exchange_id", "queue_id", "routing_key", "arguments"),
    CheckConstraint(
        "(queue_id IS NULL) <> (destination_exchange_id IS NULL)", name="one_destination"
    ),
)
Index(None, bindings.c.queue_id)
# A direct exchange's bindings by key, for the SQL publish of contract §18 (migration 0013).
Index("ix_bindings_exchange_key", bindings.c.exchange_id, bindings.c.routing_key)
_E2E = text("destination_exchange_id IS NOT NULL")
# Exchange-to-exchange bindings (migration 0009): identical ones are one; the publish's graph
# walk probes it by exchange_id without reading queue bindings.
Index(
    "uq_bindings_exchange_to_exchange",
    bindings.c.exchange_id,
    bindings.c.destination_exchange_id,
    bindings.c.routing_key,
    bindings.c.arguments,
    unique=True,
    postgresql_where=_E2E,
)
Index(None, bindings.c.destination_exchange_id, postgresql_where=_E2E)

messages = Table(
    "messages",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("queue_id", BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), nullable=False),
    Column("status", Text, nullable=False, server_default=text("'ready'")),
    Column("message_id", Text, nullable=False),
    Column("exchange", Text, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=EMPTY_OBJECT),
    Column("properties", JSONB, nullable=False, server_default=EMPTY_OBJECT),
    # JSON-serialized body, or the raw bytes of a body_base64 publish (binary = true).
    Column("body", LargeBinary, nullable=False),
    Column("binary", Boolean, nullable=False, server_default=text("false")),
    Column("delivery_count", Integer, nullable=False, server_default=text("0")),
    _ts("created_at"),
    _ts("available_at"),
    # Set by a claim; cleared when the message returns to ready.
    _ts("delivered_at", nullable=True, default=False),
    _ts("lease_expires_at", nullable=True, default=False),
    # available_at + the copy's TTL in its queue (contract §13); NULL: it never expires.
    _ts("expires_at", nullable=True, default=False),
    Column("delivery_tag", Text, nullable=True),
    Column("owner_process", UUID(as_uuid=False), nullable=True),
    Column("owner_connection", UUID(as_uuid=False), nullable=True),
    Column("owner_user", Text, nullable=True),
    # Claim priority in a queue with x-max-priority (QueueArguments.priority_of); NULL in
    # every other queue, whose rows so never enter ix_messages_priority (migration 0007).
    Column("priority", SmallInteger, nullable=True),
    # properties.group_id (contract §16), NULL when absent (migration 0011).
    Column("group_id", Text, nullable=True),
    CheckConstraint("status IN ('ready', 'in_flight', 'dead')", name="status"),
    # In flight exactly when a tag is set, and exactly when a lease is: settling by (id, tag)
    # needs no status test (storage/deliveries.py, ACK_MANY; migration 0003).
    CheckConstraint(
        "(status = 'in_flight') = (delivery_tag IS NOT NULL) "
        "AND (status = 'in_flight') = (lease_expires_at IS NOT NULL)",
        name="in_flight_has_tag_and_lease",
    ),
    # Fill pages to 70 % so that claim/release updates can stay on the page (HOT-friendly).
    postgresql_with={"fillfactor": 70},
)
# The claim: first ready message of a queue in (available_at, id) order.
Index(
    "ix_messages_claim",
    messages.c.queue_id,
    messages.c.available_at,
    messages.c.id,
    postgresql_where=text("status = 'ready'"),
)
# The claim of a priority queue: (priority descending, available_at, id); only priority
# queues' ready rows (the claim's second branch, storage/queries.py CLAIM).
Index(
    "ix_messages_priority",
    messages.c.queue_id,
    messages.c.priority.desc(),
    messages.c.available_at,
    messages.c.id,
    postgresql_where=text("status = 'ready' AND priority IS NOT NULL"),
)
# The group claim (contract §16, storage/queries.py CLAIM_GROUPS): a group's head, and the
# loose index scan over a queue's groups; only ready rows with a group_id (migration 0012).
Index(
    "ix_messages_group_head",
    messages.c.queue_id,
    messages.c.group_id,
    messages.c.priority.desc(),
    messages.c.available_at,
    messages.c.id,
    postgresql_where=text("status = 'ready' AND group_id IS NOT NULL"),
)
# The group claim: whether a group has a copy in flight.
Index(
    "ix_messages_group_busy",
    messages.c.queue_id,
    messages.c.group_id,
    postgresql_where=text("status = 'in_flight' AND group_id IS NOT NULL"),
)
# The ack-timeout sweep: in-flight deliveries by lease expiry.
Index(
    "ix_messages_lease",
    messages.c.lease_expires_at,
    postgresql_where=text("status = 'in_flight'"),
)
# The expiry sweep: ready copies that can expire, by expiry.
Index(
    "ix_messages_expiry",
    messages.c.expires_at,
    postgresql_where=text("status = 'ready' AND expires_at IS NOT NULL"),
)
# Release on disconnect: in-flight deliveries by owning connection.
Index(
    "ix_messages_owner",
    messages.c.owner_connection,
    postgresql_where=text("status = 'in_flight'"),
)
# Browse, stats, purge and the ON DELETE CASCADE from queues.
Index("ix_messages_queue", messages.c.queue_id, messages.c.id)
# Copies the SQL publish (contract §18, migration 0013) parked for the broker's maxlen
# dead-lettering: status 'dead' in a queue with a dead-letter target (where nothing else is).
Index("ix_messages_parked", messages.c.queue_id, postgresql_where=text("status = 'dead'"))

broker_users = Table(
    "broker_users",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("username", Text, nullable=False),
    Column("password_hash", Text, nullable=False),
    Column("role", Text, nullable=False, server_default=text("'user'")),
    Column("perm_configure", Text, nullable=False, server_default=text("''")),
    Column("perm_write", Text, nullable=False, server_default=text("''")),
    Column("perm_read", Text, nullable=False, server_default=text("''")),
    # The bootstrap guest may authenticate only from a loopback address.
    Column("loopback_only", Boolean, nullable=False, server_default=text("false")),
    _ts("created_at"),
    _ts("updated_at"),
    UniqueConstraint("username"),
    CheckConstraint("role IN ('admin', 'user')", name="role"),
)

management_sessions = Table(
    "management_sessions",
    metadata,
    # SHA-256 of the bearer token; the token itself is never stored.
    Column("token_digest", LargeBinary, primary_key=True),
    Column(
        "user_id", BigInteger, ForeignKey("broker_users.id", ondelete="CASCADE"), nullable=False
    ),
    _ts("created_at"),
    _ts("expires_at", default=False),
)
Index(None, management_sessions.c.user_id)
Index(None, management_sessions.c.expires_at)

auth_failures = Table(
    "auth_failures",
    metadata,
    # "user:<name>" or "addr:<ip>"; shared by every broker process.
    Column("key", Text, primary_key=True),
    _ts("window_start"),
    Column("failures", Integer, nullable=False, server_default=text("1")),
)

broker_processes = Table(
    "broker_processes",
    metadata,
    # One row per running broker process; a row whose heartbeat is stale belongs to a dead
    # process, whose subscriptions and deliveries the survivors clean up.
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("hostname", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("connections", Integer, nullable=False, server_default=text("0")),
    _ts("started_at"),
    _ts("heartbeat_at"),
    # Reported with each heartbeat (migration 0015, diagnosis §19): the backend pid of its
    # LISTEN connection (NULL while down) and its connection pool's use.
    Column("listen_pid", Integer, nullable=True),
    Column("pool_in_use", Integer, nullable=True),
    Column("pool_size", Integer, nullable=True),
)

subscriptions = Table(
    "subscriptions",
    metadata,
    # Live WebSocket subscriptions, so that every process can count consumers.
    Column("connection_id", UUID(as_uuid=False), primary_key=True),
    Column("queue_id", BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True),
    _process_id(),
    Column("prefetch", Integer, nullable=False),
    _ts("created_at"),
    # The last settlement by it, written with its process's heartbeat (migration 0015).
    _ts("last_ack_at", nullable=True, default=False),
)
Index(None, subscriptions.c.queue_id)
Index(None, subscriptions.c.process_id)

single_active_holders = Table(
    "single_active_holders",
    metadata,
    # Queues with x-single-active-consumer: the connection whose subscription is (or last
    # was) active. It stays after that subscription ends, until the next oldest takes over
    # once none of the holder's deliveries of the queue is in flight (storage/single_active.py).
    Column("queue_id", BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True),
    Column("connection_id", UUID(as_uuid=False), nullable=False),
    _ts("since"),
)

publish_dedup = Table(
    "publish_dedup",
    metadata,
    # Queues with x-deduplication-window-seconds (contract §15): the message_ids published
    # into each within its window; a publish claims its row with INSERT ... ON CONFLICT
    # (migration 0011 says how), rows older than the window are swept (storage/dedup.py),
    # per queue over ix_publish_dedup_sweep (migration 0013).
    Column("queue_id", BigInteger, ForeignKey("queues.id", ondelete="CASCADE"), primary_key=True),
    Column("message_id", Text, primary_key=True),
    Column(
        "published_at",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("statement_timestamp()"),
    ),
    Index("ix_publish_dedup_sweep", "queue_id", "published_at"),
)

websocket_connections = Table(
    "websocket_connections",
    metadata,
    # Live authenticated WebSocket connections, so that every process can count a user's
    # (contract §8: MESSAGEX_MAX_CONNECTIONS_PER_USER across all processes).
    Column("connection_id", UUID(as_uuid=False), primary_key=True),
    _process_id(),
    Column("username", Text, nullable=False),
    _ts("created_at"),
    # Where it came from (contract §20; migration 0015).
    Column("client_address", Text, nullable=True),
    # An administrator asked to close it (§20): its process's heartbeat closes it.
    _ts("close_requested_at", nullable=True, default=False),
)
Index(None, websocket_connections.c.username)
Index(None, websocket_connections.c.process_id)

publish_receipts = Table(
    "publish_receipts",
    metadata,
    # One row per publish group write, inserted by the same statement as its messages: when
    # the connection breaks while that statement commits, the broker looks for the receipt
    # (inserting it itself, which fences off a commit still in progress) to learn whether
    # the publish was stored. Rows older than a few minutes serve no one and are swept.
    Column("token", UUID(as_uuid=False), primary_key=True),
    _ts("created_at"),
)
Index(None, publish_receipts.c.created_at)

publish_settings = Table(
    "publish_settings",
    metadata,
    # The broker's size limits, written at every start (app/storage/sqlapi.py), for the SQL
    # publish of contract §18 (schema messagex, migration 0013), which cannot see them.
    Column("id", SmallInteger, primary_key=True, server_default=text("1")),
    Column("max_message_bytes", BigInteger, nullable=False),
    Column("max_header_bytes", BigInteger, nullable=False),
    _ts("updated_at"),
    CheckConstraint("id = 1", name="one_row"),
)
queue_samples = Table(
    "queue_samples",
    metadata,
    # The charts' history (docs/decisions.md "Rate and depth history"): every few seconds
    # each broker process with activity inserts one row per queue it saw activity on (its
    # published copies, deliveries and acks since its last sample) and one broker-wide row
    # (queue_id NULL); one process (the first to take the sample's advisory lock) inserts
    # the depth by status of every queue holding copies, and the broker-wide depth (rows
    # with ``ready`` not NULL). Readers sum per (queue, at). No foreign key: a deleted
    # queue's rows are never read again and age out with the rest (about 15 minutes).
    Column("at", DateTime(timezone=True), nullable=False),
    Column("queue_id", BigInteger, nullable=True),
    Column("published", BigInteger, nullable=False, server_default=text("0")),
    Column("delivered", BigInteger, nullable=False, server_default=text("0")),
    Column("acked", BigInteger, nullable=False, server_default=text("0")),
    Column("ready", BigInteger, nullable=True),
    Column("delayed", BigInteger, nullable=True),
    Column("in_flight", BigInteger, nullable=True),
    Column("dead", BigInteger, nullable=True),
    # on the broker-wide depth row: how long the depth count took (it paces the next one)
    Column("depth_ms", Integer, nullable=True),
)
Index(None, queue_samples.c.queue_id, queue_samples.c.at)
Index(None, queue_samples.c.at)
