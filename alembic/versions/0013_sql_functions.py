"""messagex schema: publish and acknowledge from SQL, inside the caller's transaction (§18)

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-04

Hand-written. Installs, in schema ``messagex``, the functions of contract §18:

- ``messagex.publish(exchange, routing_key, body jsonb, headers, properties, delay_ms)``,
  ``messagex.publish_bytes(...)`` (``body bytea``, stored binary, delivered as
  ``body_base64``) and ``messagex.publish_to_queue(queue, body jsonb, headers, properties,
  delay_ms)``: what ``POST /exchanges/{name}/publish`` (and ``POST /queues/{name}/messages``)
  do — validation, routing of the four exchange types with §14's exchange-to-exchange
  bindings and alternate exchanges, TTL, priority, group_id, §13's length limits and §15's
  deduplication — returning the same result object, and a ``NOTIFY messagex_events`` that
  the commit delivers to every broker process (app/broker/cluster.py's wire form), so that
  subscribers are woken as by a REST publish;
- ``messagex.ack(delivery_tag)``: deletes the in-flight copy of exactly that tag (as a
  WebSocket or pull ACK does) and returns true, else changes nothing and returns false; its
  NOTIFY names the holding connection (``released_owners``) so that, after the commit, the
  process holding it reconciles that connection's credit and the prefetch slot is free.

Security: every function is owned by the role that runs the migrations (the broker's),
``EXECUTE`` is revoked from PUBLIC, and the four entry points are ``SECURITY DEFINER`` with
``search_path`` pinned to ``pg_catalog``, the schema the broker's tables were created in
(``current_schema()`` at migration time) and ``pg_temp`` last — so a caller's own tables,
functions or operators, earlier in its search_path or temporary, cannot stand in for ours.
The helpers (names starting with ``_``) are executable by the owner only and run under the
entry point's pinned path. An application role needs ``USAGE ON SCHEMA messagex`` and
``EXECUTE`` on the entry points, nothing on the broker's tables (docs/operations.md).

SQL cannot see the broker's settings: ``publish_settings`` (one row) holds the size limits
that the broker writes at start-up (MESSAGEX_MAX_MESSAGE_BYTES, MESSAGEX_MAX_HEADER_BYTES);
the defaults until then are the broker's defaults.

Length limits: a copy that a limited queue's drop-head or reject-publish-dlx would
dead-letter (the queue has a dead-letter target) cannot be routed on from SQL (dead-lettering
is the broker's: x-death, the cycle rule, the target's own limits). It leaves the ready set in
the publishing transaction — status ``dead`` in its queue, so no commit leaves the queue above
its limit — and the broker dead-letters it (reason ``maxlen``) within a second
(broker/settlement.py ``dead_letter_parked``); ``ix_messages_parked`` finds them. A queue
with a dead-letter target has no other ``dead`` copies: the delivery limit dead-letters them.
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0013"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: what the broker's settings default to (app/config.py); written again at every start
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024

_HELPERS = r"""
-- Topic matching (contract §4), exactly app/domain/routing.py's _TopicPattern: ``""`` has no
-- words, any other key splits on "." (empty words kept); "*" one word, "#" zero or more.
-- State s[i] (1-based): the first i-1 pattern words are matched.
CREATE FUNCTION messagex._topic_matches(pattern text, key text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    p text[] := '{}';
    w text;
    n int;
    i int;
    s boolean[];
    nxt boolean[];
    alive boolean;
BEGIN
    IF strpos(pattern, '*') = 0 AND strpos(pattern, '#') = 0 THEN
        RETURN pattern = key;
    END IF;
    FOREACH w IN ARRAY string_to_array(pattern, '.') LOOP
        IF w = '#' AND cardinality(p) > 0 AND p[cardinality(p)] = '#' THEN
            CONTINUE;  -- "#.#" matches what "#" does
        END IF;
        p := array_append(p, w);
    END LOOP;
    n := cardinality(p);
    s := array_fill(false, ARRAY[n + 1]);
    s[1] := true;
    FOR i IN 1..n LOOP
        IF s[i] AND p[i] = '#' THEN s[i + 1] := true; END IF;
    END LOOP;
    FOREACH w IN ARRAY coalesce(string_to_array(nullif(key, ''), '.'), '{}') LOOP
        nxt := array_fill(false, ARRAY[n + 1]);
        alive := false;
        FOR i IN 1..n LOOP
            IF s[i] THEN
                IF p[i] = '#' THEN
                    nxt[i] := true;  -- "#" consumes the word and stays
                    alive := true;
                ELSIF p[i] = '*' OR p[i] = w THEN
                    nxt[i + 1] := true;
                    alive := true;
                END IF;
            END IF;
        END LOOP;
        IF NOT alive THEN RETURN false; END IF;
        FOR i IN 1..n LOOP
            IF nxt[i] AND p[i] = '#' THEN nxt[i + 1] := true; END IF;
        END LOOP;
        s := nxt;
    END LOOP;
    RETURN s[n + 1];
END
$fn$;

-- Headers matching (contract §4), exactly routing.headers_match: equality of JSON value and
-- type (jsonb's =: 1 = 1.0, true <> 1, "1" <> 1); x-match all (default, and for any value
-- that is not one of the four), any, all-with-x, any-with-x.
CREATE FUNCTION messagex._headers_match(args jsonb, headers jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
DECLARE
    mode text := 'all';
    need_all boolean;
    with_x boolean;
    k text;
    v jsonb;
    matched boolean;
BEGIN
    IF jsonb_typeof(args -> 'x-match') = 'string'
       AND args ->> 'x-match' IN ('all', 'any', 'all-with-x', 'any-with-x') THEN
        mode := args ->> 'x-match';
    END IF;
    need_all := mode IN ('all', 'all-with-x');
    with_x := mode IN ('all-with-x', 'any-with-x');
    FOR k, v IN SELECT * FROM jsonb_each(args) LOOP
        CONTINUE WHEN k = 'x-match' OR (NOT with_x AND left(k, 2) = 'x-');
        matched := coalesce(headers -> k = v, false);
        IF matched <> need_all THEN
            RETURN matched;  -- "all" and this one differs, or "any" and this one is equal
        END IF;
    END LOOP;
    RETURN need_all;
END
$fn$;

-- One exchange as route_graph walks it: the queues its queue bindings match (distinct, in
-- order of their first matching binding, as route()), the exchanges its
-- exchange-to-exchange bindings match (likewise), and its alternate exchange's name.
-- ok is false when there is no such exchange. One static statement per exchange type, so
-- that each keeps its cached plan (a direct exchange's probes ix_bindings_exchange_key).
CREATE FUNCTION messagex._node(
    p_name text, p_key text, p_headers jsonb,
    OUT ok boolean, OUT queue_ids bigint[], OUT queue_names text[], OUT onward text[],
    OUT alternate text
) LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    x record;
    matched bigint[];
BEGIN
    SELECT e.id, e.type, e.arguments ->> 'alternate-exchange' AS alt INTO x
    FROM exchanges AS e WHERE e.name = p_name;
    ok := FOUND;
    queue_ids := '{}';
    queue_names := '{}';
    onward := '{}';
    IF NOT ok THEN RETURN; END IF;
    alternate := x.alt;
    IF x.type = 'direct' THEN
        matched := ARRAY(SELECT b.id FROM bindings AS b
                         WHERE b.exchange_id = x.id AND b.routing_key = p_key);
    ELSIF x.type = 'fanout' THEN
        matched := ARRAY(SELECT b.id FROM bindings AS b WHERE b.exchange_id = x.id);
    ELSIF x.type = 'topic' THEN
        matched := ARRAY(SELECT b.id FROM bindings AS b WHERE b.exchange_id = x.id
                         AND messagex._topic_matches(b.routing_key, p_key));
    ELSE
        matched := ARRAY(SELECT b.id FROM bindings AS b WHERE b.exchange_id = x.id
                         AND messagex._headers_match(b.arguments, p_headers));
    END IF;
    IF cardinality(matched) = 0 THEN RETURN; END IF;
    SELECT coalesce(array_agg(s.queue_id ORDER BY s.first)
                        FILTER (WHERE s.queue_id IS NOT NULL), '{}'),
           coalesce(array_agg(q.name ORDER BY s.first) FILTER (WHERE s.queue_id IS NOT NULL),
                    '{}'),
           coalesce(array_agg(d.name ORDER BY s.first) FILTER (WHERE s.dest IS NOT NULL), '{}')
    INTO queue_ids, queue_names, onward
    FROM (SELECT b.queue_id, b.destination_exchange_id AS dest, min(b.id) AS first
          FROM bindings AS b WHERE b.id = ANY(matched)
          GROUP BY b.queue_id, b.destination_exchange_id) AS s
    LEFT JOIN queues AS q ON q.id = s.queue_id
    LEFT JOIN exchanges AS d ON d.id = s.dest;
END
$fn$;

-- The queues a message published to p_exchange goes to (contract §4, §14): exactly
-- routing.route_graph — depth first, in binding order, each exchange visited at most once;
-- an exchange that reached no queue (through its exchange-to-exchange bindings either) goes
-- on through its alternate exchange. ok is false when p_exchange does not exist.
CREATE FUNCTION messagex._route(
    p_exchange text, p_key text, p_headers jsonb,
    OUT ok boolean, OUT queue_ids bigint[], OUT queue_names text[]
) LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    n record;
    names text[] := '{}';      -- the stack: exchange names,
    onwards jsonb[] := '{}';   -- their matched destinations (a JSON array of names),
    positions int[] := '{}';   -- how many of those were walked,
    tried boolean[] := '{}';   -- whether the alternate was tried,
    alternates text[] := '{}'; -- and their alternates
    reached jsonb := '{}';     -- visited exchange -> has it reached a queue (so far)
    top int;
    dest text;
    name text;
    i int;
BEGIN
    SELECT * INTO n FROM messagex._node(p_exchange, p_key, p_headers);
    ok := n.ok;
    queue_ids := coalesce(n.queue_ids, '{}');
    queue_names := coalesce(n.queue_names, '{}');
    IF NOT ok OR (cardinality(n.onward) = 0 AND n.alternate IS NULL) THEN
        RETURN;  -- a leaf exchange costs exactly its own match
    END IF;
    reached := jsonb_build_object(p_exchange, cardinality(n.queue_ids) > 0);
    names := ARRAY[p_exchange];
    onwards := ARRAY[to_jsonb(n.onward)];
    positions := ARRAY[0];
    tried := ARRAY[false];
    alternates := ARRAY[n.alternate];
    WHILE cardinality(names) > 0 LOOP
        top := cardinality(names);
        dest := NULL;
        IF positions[top] < jsonb_array_length(onwards[top]) THEN
            dest := onwards[top] ->> positions[top];
            positions[top] := positions[top] + 1;
        ELSIF NOT tried[top] AND NOT (reached ->> names[top])::boolean THEN
            tried[top] := true;
            dest := alternates[top];
        END IF;
        IF dest IS NOT NULL THEN
            IF NOT reached ? dest THEN
                SELECT * INTO n FROM messagex._node(dest, p_key, p_headers);
                IF n.ok THEN
                    FOR i IN 1..cardinality(n.queue_ids) LOOP
                        IF NOT n.queue_ids[i] = ANY(queue_ids) THEN
                            queue_ids := array_append(queue_ids, n.queue_ids[i]);
                            queue_names := array_append(queue_names, n.queue_names[i]);
                        END IF;
                    END LOOP;
                    reached := reached || jsonb_build_object(dest, cardinality(n.queue_ids) > 0);
                    names := array_append(names, dest);
                    onwards := array_append(onwards, to_jsonb(n.onward));
                    positions := array_append(positions, 0);
                    tried := array_append(tried, false);
                    alternates := array_append(alternates, n.alternate);
                    CONTINUE;
                END IF;
            END IF;
            IF coalesce((reached ->> dest)::boolean, false) THEN
                reached := reached || jsonb_build_object(names[top], true);
            END IF;
            CONTINUE;
        END IF;
        name := names[top];
        names := names[1:top - 1];
        onwards := onwards[1:top - 1];
        positions := positions[1:top - 1];
        tried := tried[1:top - 1];
        alternates := alternates[1:top - 1];
        IF top > 1 AND (reached ->> name)::boolean THEN
            reached := reached || jsonb_build_object(names[top - 1], true);
        END IF;
    END LOOP;
END
$fn$;

CREATE FUNCTION messagex._fail(code text, message text) RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RAISE EXCEPTION USING
        MESSAGE = code || ': ' || message,
        ERRCODE = CASE code WHEN 'not_found' THEN 'P0002'
                            WHEN 'message_too_large' THEN '54000'
                            ELSE '22023' END;
END
$fn$;

-- A queue argument that must be a non-negative JSON integer, else NULL (ignored).
CREATE FUNCTION messagex._int_arg(args jsonb, key text) RETURNS numeric
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE WHEN jsonb_typeof(args -> key) = 'number' AND (args ->> key) ~ '^[0-9]+$'
                THEN (args ->> key)::numeric END
$fn$;

-- The properties a publish stores, validated as the REST model validates them (unknown keys
-- refused, null meaning "not given"), with its message_id.
CREATE FUNCTION messagex._properties(p_properties jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    props jsonb := coalesce(p_properties, '{}');
    bad text;
    k text;
BEGIN
    IF jsonb_typeof(props) <> 'object' THEN
        PERFORM messagex._fail('validation_error', 'properties must be a JSON object');
    END IF;
    props := jsonb_strip_nulls(props);
    SELECT string_agg(key, ', ' ORDER BY key) INTO bad FROM jsonb_object_keys(props) AS key
    WHERE key NOT IN ('message_id', 'correlation_id', 'reply_to', 'content_type', 'priority',
                      'expiration', 'group_id');
    IF bad IS NOT NULL THEN
        PERFORM messagex._fail('validation_error', 'properties: unknown key(s) ' || bad);
    END IF;
    FOREACH k IN ARRAY ARRAY['message_id', 'correlation_id', 'reply_to', 'content_type',
                             'expiration', 'group_id'] LOOP
        IF props ? k AND jsonb_typeof(props -> k) <> 'string' THEN
            PERFORM messagex._fail('validation_error', 'properties.' || k || ' must be a string');
        END IF;
    END LOOP;
    bad := CASE WHEN NOT props ? 'priority' THEN NULL
                WHEN jsonb_typeof(props -> 'priority') <> 'number' THEN 'bad'
                WHEN (props ->> 'priority') !~ '^[0-9]{1,3}$' THEN 'bad'
                WHEN (props ->> 'priority')::int > 255 THEN 'bad' END;
    IF bad IS NOT NULL THEN
        PERFORM messagex._fail('validation_error',
                               'properties.priority must be an integer from 0 to 255');
    END IF;
    bad := CASE WHEN NOT props ? 'expiration' THEN NULL
                WHEN (props ->> 'expiration') !~ '^[0-9]+$' THEN 'bad'
                WHEN (props ->> 'expiration')::numeric > 4294967295 THEN 'bad' END;
    IF bad IS NOT NULL THEN
        PERFORM messagex._fail('validation_error',
            'properties.expiration must be a string of decimal digits: milliseconds from 0 to '
            || '4294967295');
    END IF;
    IF props ? 'group_id' AND char_length(props ->> 'group_id') NOT BETWEEN 1 AND 128 THEN
        PERFORM messagex._fail('validation_error',
                               'properties.group_id must be a string of 1 to 128 characters');
    END IF;
    IF props ? 'message_id' AND props ->> 'message_id' = '' THEN
        PERFORM messagex._fail('validation_error', 'properties.message_id must not be empty');
    END IF;
    IF NOT props ? 'message_id' THEN
        props := props || jsonb_build_object('message_id', gen_random_uuid()::text);
    END IF;
    RETURN props;
END
$fn$;

-- The length rule's reads of a limited queue (storage/limits.py READY_SIZES and HEAD): planned
-- for the table as it is at each call (plan_cache_mode, as the broker's own connections plan
-- them: a plan cached while the table was empty would read all of it once it is not).
CREATE FUNCTION messagex._ready_size(
    p_queue bigint, p_clock timestamptz, OUT n bigint, OUT bytes bigint
) LANGUAGE sql STABLE SET plan_cache_mode = force_custom_plan AS $fn$
    SELECT count(*), coalesce(sum(length(m.body)), 0)::bigint FROM messages AS m
    WHERE m.queue_id = p_queue AND m.status = 'ready' AND m.available_at <= p_clock
$fn$;

-- Drop-head: the oldest ready copies in claim order leave until the queue is within its
-- limits (p_over copies and p_over_bytes bytes too many) — deleted, or with a dead-letter
-- target parked (status 'dead') for the broker's maxlen dead-lettering. SKIP LOCKED: a row
-- another transaction holds is being claimed, so is leaving the ready set anyway.
CREATE FUNCTION messagex._trim(
    p_queue bigint, p_clock timestamptz, p_over bigint, p_over_bytes bigint,
    p_has_target boolean
) RETURNS void
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    h record;
    leaving bigint[] := '{}';
    over bigint := p_over;
    over_bytes bigint := p_over_bytes;
BEGIN
    FOR h IN SELECT m.id, length(m.body) AS size FROM messages AS m
             WHERE m.queue_id = p_queue AND m.status = 'ready' AND m.available_at <= p_clock
               AND (m.expires_at IS NULL OR m.expires_at > p_clock)
             ORDER BY m.priority DESC NULLS LAST, m.available_at, m.id
             LIMIT CASE WHEN p_over_bytes > 0 THEN NULL ELSE p_over END
             FOR UPDATE SKIP LOCKED LOOP
        EXIT WHEN over <= 0 AND over_bytes <= 0;
        leaving := array_append(leaving, h.id);
        over := over - 1;
        over_bytes := over_bytes - h.size;
    END LOOP;
    IF p_has_target THEN
        UPDATE messages SET status = 'dead' WHERE id = ANY(leaving);
    ELSE
        DELETE FROM messages WHERE id = ANY(leaving);
    END IF;
END
$fn$;

-- The one publish: p_queue set means straight into that queue (the default exchange).
CREATE FUNCTION messagex._publish(
    p_exchange text, p_queue text, p_key text, p_body bytea, p_binary boolean,
    p_headers jsonb, p_properties jsonb, p_delay_ms bigint
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    settings record;
    headers jsonb := coalesce(p_headers, '{}');
    props jsonb;
    mid text;
    size bigint;
    expiration bigint;
    priority int;
    routed record;
    ids bigint[];
    names text[];
    q record;
    info jsonb := '{}';        -- queue id -> {name, arguments, target}
    limited bigint[] := '{}';
    stored text[] := '{}';
    rejected text[] := '{}';
    duplicates text[] := '{}';
    woken bigint[] := '{}';
    i int;
    qid bigint;
    args jsonb;
    has_target boolean;
    ttl numeric;
    max_priority numeric;
    max_length numeric;
    max_bytes numeric;
    overflow text;
    window_s numeric;
    claimed boolean;
    ready bigint;
    ready_bytes bigint;
    over bigint;
    over_bytes bigint;
    clock timestamptz;
BEGIN
    -- validation: everything before anything is stored
    IF p_exchange IS NULL AND p_queue IS NULL THEN
        PERFORM messagex._fail('validation_error', 'the exchange (or queue) must not be NULL');
    END IF;
    IF p_key IS NULL THEN
        PERFORM messagex._fail('validation_error', 'routing_key must not be NULL');
    END IF;
    IF p_body IS NULL THEN
        PERFORM messagex._fail('validation_error',
                               'body must not be SQL NULL (the JSON null is ''null''::jsonb)');
    END IF;
    IF jsonb_typeof(headers) <> 'object' THEN
        PERFORM messagex._fail('validation_error', 'headers must be a JSON object');
    END IF;
    IF p_delay_ms IS NULL OR p_delay_ms NOT BETWEEN 0 AND 604800000 THEN
        PERFORM messagex._fail('validation_error',
                               'delay_ms must be an integer from 0 to 604800000');
    END IF;
    props := messagex._properties(p_properties);
    mid := props ->> 'message_id';
    SELECT s.max_message_bytes, s.max_header_bytes INTO settings
    FROM publish_settings AS s WHERE s.id = 1;
    size := octet_length(p_body);
    IF size > settings.max_message_bytes THEN
        PERFORM messagex._fail('message_too_large', format(
            'the body is %s bytes, over the limit of %s bytes; nothing was stored',
            size, settings.max_message_bytes));
    END IF;
    IF octet_length(headers::text) + octet_length(props::text) > settings.max_header_bytes THEN
        PERFORM messagex._fail('message_too_large', format(
            'its headers and properties are %s bytes as JSON, over the limit of %s bytes; '
            'nothing was stored',
            octet_length(headers::text) + octet_length(props::text), settings.max_header_bytes));
    END IF;
    expiration := (props ->> 'expiration')::bigint;
    priority := (props ->> 'priority')::int;

    -- routing
    IF p_queue IS NOT NULL OR p_exchange = '' THEN  -- the default exchange: by queue name
        p_queue := coalesce(p_queue, p_key);
        SELECT ARRAY[qq.id], ARRAY[qq.name] INTO ids, names FROM queues AS qq
        WHERE qq.name = p_queue;
        IF ids IS NULL THEN
            PERFORM messagex._fail('not_found', format('queue %L not found', p_queue));
        END IF;
    ELSE
        SELECT * INTO routed FROM messagex._route(p_exchange, p_key, headers);
        IF NOT routed.ok THEN
            PERFORM messagex._fail('not_found', format('exchange %L not found', p_exchange));
        END IF;
        ids := routed.queue_ids;
        names := routed.queue_names;
    END IF;

    IF cardinality(ids) > 0 THEN
        -- The target queues' arguments, and a KEY SHARE lock on each (as the insert's foreign
        -- key check takes): a queue deleted since routing is not there, as if deleted before
        -- this publish. Length-limited ones are then locked FOR NO KEY UPDATE in id order, as
        -- every transaction that adds ready copies to them does (storage/limits.py).
        FOR q IN SELECT qq.id, qq.arguments,
                        (qq.dead_letter_queue_id IS NOT NULL
                         OR qq.arguments ? 'x-dead-letter-exchange') AS has_target
                 FROM queues AS qq WHERE qq.id = ANY(ids) ORDER BY qq.id FOR KEY SHARE LOOP
            info := info || jsonb_build_object(q.id::text, jsonb_build_object(
                'a', q.arguments, 't', q.has_target));
            IF messagex._int_arg(q.arguments, 'x-max-length') IS NOT NULL
               OR messagex._int_arg(q.arguments, 'x-max-length-bytes') IS NOT NULL THEN
                limited := array_append(limited, q.id);
            END IF;
        END LOOP;
        IF cardinality(limited) > 0 THEN
            PERFORM 1 FROM queues AS qq WHERE qq.id = ANY(limited) ORDER BY qq.id
            FOR NO KEY UPDATE;
        END IF;
    END IF;

    FOR i IN 1..coalesce(cardinality(ids), 0) LOOP
        qid := ids[i];
        CONTINUE WHEN NOT info ? qid::text;  -- deleted meanwhile
        args := info -> qid::text -> 'a';
        has_target := (info -> qid::text ->> 't')::boolean;
        -- §15: one row per (queue, message_id) within the window (migration 0011)
        window_s := messagex._int_arg(args, 'x-deduplication-window-seconds');
        claimed := false;
        IF window_s IS NOT NULL AND window_s BETWEEN 1 AND 86400 THEN
            INSERT INTO publish_dedup AS d (queue_id, message_id) VALUES (qid, mid)
            ON CONFLICT (queue_id, message_id) DO UPDATE SET published_at = EXCLUDED.published_at
            WHERE d.published_at
                  <= EXCLUDED.published_at - window_s::float8 * interval '1 second'
            RETURNING true INTO claimed;
            IF claimed IS NULL THEN
                duplicates := array_append(duplicates, names[i]);
                CONTINUE;
            END IF;
        END IF;
        max_length := messagex._int_arg(args, 'x-max-length');
        max_bytes := messagex._int_arg(args, 'x-max-length-bytes');
        overflow := coalesce(args ->> 'x-overflow', 'drop-head');
        IF qid = ANY(limited) THEN
            clock := clock_timestamp();  -- after the lock: every earlier commit is counted
            SELECT r.n, r.bytes INTO ready, ready_bytes
            FROM messagex._ready_size(qid, clock) AS r;
        END IF;
        IF qid = ANY(limited) AND overflow IN ('reject-publish', 'reject-publish-dlx')
           AND p_delay_ms = 0
           AND ((max_length IS NOT NULL AND ready + 1 > max_length)
                OR (max_bytes IS NOT NULL AND ready_bytes + size > max_bytes)) THEN
            rejected := array_append(rejected, names[i]);
            IF claimed THEN  -- nothing was published into it: its message_id stays free
                DELETE FROM publish_dedup AS d WHERE d.queue_id = qid AND d.message_id = mid;
            END IF;
            IF overflow = 'reject-publish-dlx' AND has_target THEN
                -- parked for the broker's maxlen dead-lettering (see the migration's notes)
                INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers,
                                      properties, body, "binary", status, group_id)
                VALUES (qid, mid, coalesce(p_exchange, ''), p_key, headers, props, p_body,
                        p_binary, 'dead', props ->> 'group_id');
                woken := array_append(woken, qid);
            END IF;
            CONTINUE;
        END IF;
        ttl := messagex._int_arg(args, 'x-message-ttl');
        max_priority := messagex._int_arg(args, 'x-max-priority');
        INSERT INTO messages (queue_id, message_id, exchange, routing_key, headers, properties,
                              body, "binary", available_at, expires_at, priority, group_id)
        VALUES (qid, mid, coalesce(p_exchange, ''), p_key, headers, props, p_body, p_binary,
                now() + p_delay_ms * interval '1 millisecond',
                now() + p_delay_ms * interval '1 millisecond'
                    + LEAST(ttl, expiration)::float8 * interval '1 millisecond',
                CASE WHEN max_priority IS NOT NULL
                     THEN LEAST(coalesce(priority, 0), max_priority) END,
                props ->> 'group_id');
        stored := array_append(stored, names[i]);
        woken := array_append(woken, qid);
        IF qid = ANY(limited) AND overflow NOT IN ('reject-publish', 'reject-publish-dlx') THEN
            -- drop-head: the oldest ready copies in claim order leave until it is within
            IF p_delay_ms = 0 THEN
                ready := ready + 1;
                ready_bytes := ready_bytes + size;
            END IF;
            over := CASE WHEN max_length IS NOT NULL THEN GREATEST(ready - max_length, 0)
                         ELSE 0 END;
            over_bytes := CASE WHEN max_bytes IS NOT NULL
                               THEN GREATEST(ready_bytes - max_bytes, 0) ELSE 0 END;
            IF over > 0 OR over_bytes > 0 THEN
                PERFORM messagex._trim(qid, clock, over, over_bytes, has_target);
            END IF;
        END IF;
    END LOOP;

    IF cardinality(woken) > 0 THEN
        -- app/broker/cluster.py's wire form: sent at commit, to every broker process
        PERFORM pg_notify('messagex_events',
                          json_build_object('p', 'sql', 'q', woken)::text);
    END IF;
    RETURN jsonb_build_object(
        'routed', coalesce(cardinality(ids), 0) > 0,
        'queues', to_jsonb(stored),
        'message_id', mid,
        'rejected', to_jsonb(rejected),
        'duplicates', to_jsonb(duplicates));
END
$fn$;
"""

_ENTRY_POINTS = r"""
CREATE FUNCTION messagex.publish(
    exchange text, routing_key text, body jsonb, headers jsonb DEFAULT '{}',
    properties jsonb DEFAULT '{}', delay_ms bigint DEFAULT 0
) RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = {path} AS $fn$
    SELECT messagex._publish(exchange, NULL, routing_key, convert_to(body::text, 'UTF8'),
                             false, headers, properties, delay_ms)
$fn$;

CREATE FUNCTION messagex.publish_bytes(
    exchange text, routing_key text, body bytea, headers jsonb DEFAULT '{}',
    properties jsonb DEFAULT '{}', delay_ms bigint DEFAULT 0
) RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = {path} AS $fn$
    SELECT messagex._publish(exchange, NULL, routing_key, body, true, headers, properties,
                             delay_ms)
$fn$;

CREATE FUNCTION messagex.publish_to_queue(
    queue text, body jsonb, headers jsonb DEFAULT '{}', properties jsonb DEFAULT '{}',
    delay_ms bigint DEFAULT 0
) RETURNS jsonb
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = {path} AS $fn$
    SELECT messagex._publish(NULL, queue, queue, convert_to(body::text, 'UTF8'), false,
                             headers, properties, delay_ms)
$fn$;

-- Settle the in-flight copy of exactly this tag (a WebSocket or a pull delivery), as an ACK
-- does: deleted, by primary key (the tag begins with the row's id, storage/queries.py
-- NEW_TAG_SQL) and tag. A copy whose lease ran out is timed out (the broker's sweep is about
-- to release it): false. The NOTIFY names the holding connection (cluster.py
-- released_owners), whose process then reconciles its credit: the prefetch slot is free
-- after the commit; and the queue, when its next delivery may have waited on this one (a
-- single active consumer's hand-over, a message group).
CREATE FUNCTION messagex.ack(delivery_tag text) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = {path}
SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    tag text := delivery_tag;
    row_id bigint;
    gone record;
BEGIN
    IF tag IS NULL OR tag !~ '^[0-9]{1,18}\.' THEN
        RETURN false;
    END IF;
    row_id := split_part(tag, '.', 1)::bigint;
    DELETE FROM messages AS m
    WHERE m.id = row_id AND m.delivery_tag = tag AND m.status = 'in_flight'
      AND m.lease_expires_at > clock_timestamp()
    RETURNING m.owner_connection, m.queue_id, m.group_id INTO gone;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('messagex_events', json_build_object(
        'p', 'sql',
        'q', CASE WHEN gone.group_id IS NOT NULL OR EXISTS (
                      SELECT 1 FROM queues AS q WHERE q.id = gone.queue_id
                      AND (q.arguments ? 'x-single-active-consumer'
                           OR q.arguments ? 'x-message-groups'))
                  THEN json_build_array(gone.queue_id) ELSE '[]' END,
        'r', CASE WHEN gone.owner_connection IS NULL THEN '[]'
                  ELSE json_build_array(gone.owner_connection::text) END)::text);
    RETURN true;
END
$fn$;
"""

_FUNCTIONS = [
    "messagex._topic_matches(text, text)",
    "messagex._headers_match(jsonb, jsonb)",
    "messagex._node(text, text, jsonb)",
    "messagex._route(text, text, jsonb)",
    "messagex._fail(text, text)",
    "messagex._int_arg(jsonb, text)",
    "messagex._properties(jsonb)",
    "messagex._ready_size(bigint, timestamptz)",
    "messagex._trim(bigint, timestamptz, bigint, bigint, boolean)",
    "messagex._publish(text, text, text, bytea, boolean, jsonb, jsonb, bigint)",
    "messagex.publish(text, text, jsonb, jsonb, jsonb, bigint)",
    "messagex.publish_bytes(text, text, bytea, jsonb, jsonb, bigint)",
    "messagex.publish_to_queue(text, jsonb, jsonb, jsonb, bigint)",
    "messagex.ack(text)",
]


def _statements(sql: str) -> list[str]:
    """One CREATE FUNCTION each (the driver prepares what it runs: one statement at a time)."""
    parts = sql.split("$fn$;")
    return [part + "$fn$" for part in parts[:-1]]


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def upgrade() -> None:
    op.create_table(
        "publish_settings",
        sa.Column("id", sa.SmallInteger(), server_default=sa.text("1"), nullable=False),
        sa.Column("max_message_bytes", sa.BigInteger(), nullable=False),
        sa.Column("max_header_bytes", sa.BigInteger(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint("id = 1", name=op.f("ck_publish_settings_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_publish_settings")),
    )
    op.execute(
        "INSERT INTO publish_settings (id, max_message_bytes, max_header_bytes) "
        f"VALUES (1, {DEFAULT_MAX_MESSAGE_BYTES}, {DEFAULT_MAX_HEADER_BYTES})"
    )
    # A direct exchange's bindings by key: what the SQL publish probes (the broker's publish
    # keeps them compiled and never needs it).
    op.create_index("ix_bindings_exchange_key", "bindings", ["exchange_id", "routing_key"])
    # Copies that the SQL publish parked for the broker's maxlen dead-lettering (see above).
    op.create_index(
        "ix_messages_parked",
        "messages",
        ["queue_id"],
        postgresql_where=sa.text("status = 'dead'"),
    )
    schema = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    path = f"pg_catalog, {_quote_ident(schema)}, pg_temp"
    op.execute("CREATE SCHEMA messagex")
    op.execute("REVOKE ALL ON SCHEMA messagex FROM PUBLIC")
    # The helpers run under the entry points' pinned search_path.
    for statement in _statements(_HELPERS + _ENTRY_POINTS.replace("{path}", path)):
        op.execute(statement)
    for function in _FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")


def downgrade() -> None:
    op.execute("DROP SCHEMA messagex CASCADE")
    op.drop_index("ix_messages_parked", table_name="messages")
    op.drop_index("ix_bindings_exchange_key", table_name="bindings")
    op.drop_table("publish_settings")
