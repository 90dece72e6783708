-- The inbox table outboxd inbox delivers into, and the functions a service
-- applies its events with (see docs/inbox.md, "Any language: the inbox table").
CREATE SCHEMA IF NOT EXISTS "public";
CREATE TABLE IF NOT EXISTS "public".inbox_events (
    consumer     text        NOT NULL,  -- outboxd inbox --name: whose effects these are
    event_id     text        NOT NULL,  -- the outbox row's id (the "id" header)
    seq          bigint      GENERATED ALWAYS AS IDENTITY,  -- order of arrival
    aggregate    text        NOT NULL,  -- the message key: the aggregate id
    type         text        NOT NULL DEFAULT '',  -- the "type" header
    payload      bytea,                 -- verbatim
    headers      jsonb       NOT NULL DEFAULT '{}',
    source       text        NOT NULL,  -- Kafka topic, NATS subject or RabbitMQ queue
    published_at timestamptz,           -- the broker's timestamp
    received_at  timestamptz NOT NULL DEFAULT now(),
    attempts     integer     NOT NULL DEFAULT 0,  -- failed attempts (inbox_failed)
    last_error   text,
    retry_at     timestamptz,           -- not claimed before (inbox_failed's backoff)
    parked_at    timestamptz,           -- set: parked, and its aggregate waits behind it
    applied_at   timestamptz,           -- set in the effect's transaction
    PRIMARY KEY (consumer, event_id)
);
-- What inbox_claim reads: the unapplied events, by aggregate and in order.
CREATE INDEX IF NOT EXISTS inbox_events_unapplied ON "public".inbox_events (consumer, aggregate, seq) WHERE applied_at IS NULL;
CREATE INDEX IF NOT EXISTS inbox_events_queue ON "public".inbox_events (consumer, seq) WHERE applied_at IS NULL AND parked_at IS NULL;
-- What inbox_expire deletes.
CREATE INDEX IF NOT EXISTS inbox_events_applied ON "public".inbox_events (consumer, applied_at) WHERE applied_at IS NOT NULL;

-- inbox_claim locks and returns up to n events, each the oldest unapplied
-- event of its aggregate, oldest first, skipping aggregates another
-- transaction holds and parked ones. Call it in the transaction that applies
-- the effect; the locks last until it ends.
CREATE OR REPLACE FUNCTION "public".inbox_claim(p_consumer text, p_limit integer DEFAULT 1)
RETURNS SETOF "public".inbox_events LANGUAGE sql VOLATILE AS $$
    SELECT e.* FROM "public".inbox_events e
    WHERE e.consumer = p_consumer AND e.applied_at IS NULL AND e.parked_at IS NULL
      AND (e.retry_at IS NULL OR e.retry_at <= now())
      AND e.seq = (
          SELECT min(b.seq) FROM "public".inbox_events b
          WHERE b.consumer = e.consumer AND b.aggregate = e.aggregate AND b.applied_at IS NULL)
    ORDER BY e.seq
    LIMIT p_limit
    FOR UPDATE OF e SKIP LOCKED
$$;

-- inbox_applied marks a claimed event applied; call it in the effect's
-- transaction. False if the event is not there unapplied (not claimed by
-- this transaction, or the consumer or id is wrong).
CREATE OR REPLACE FUNCTION "public".inbox_applied(p_consumer text, p_event_id text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    WITH u AS (
        UPDATE "public".inbox_events SET applied_at = now()
        WHERE consumer = p_consumer AND event_id = p_event_id AND applied_at IS NULL
        RETURNING 1)
    SELECT count(*) = 1 FROM u
$$;

-- inbox_failed counts a failed attempt of a claimed event (after rolling the
-- effect back to a savepoint, in the claiming transaction): the event is
-- claimable again after p_backoff·2^(attempts-1) (capped at 1024·p_backoff),
-- and parked once p_max_attempts attempts failed (1: park at once, for an
-- error no retry fixes). Its aggregate waits meanwhile; other aggregates go
-- on. True if it is now parked: it stays so until inbox_release.
CREATE OR REPLACE FUNCTION "public".inbox_failed(p_consumer text, p_event_id text, p_error text, p_max_attempts integer, p_backoff interval DEFAULT '1s')
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    UPDATE "public".inbox_events
    SET attempts = attempts + 1, last_error = p_error,
        retry_at = now() + p_backoff * power(2, least(attempts, 10)),
        parked_at = CASE WHEN attempts + 1 >= p_max_attempts THEN now() END
    WHERE consumer = p_consumer AND event_id = p_event_id AND applied_at IS NULL
    RETURNING parked_at IS NOT NULL
$$;

-- inbox_release un-parks an aggregate after a fix: its parked event is
-- claimable again (attempts from 0), then the ones behind it, in order.
-- Returns the number of events released.
CREATE OR REPLACE FUNCTION "public".inbox_release(p_consumer text, p_aggregate text)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    WITH r AS (
        UPDATE "public".inbox_events SET parked_at = NULL, retry_at = NULL, attempts = 0
        WHERE consumer = p_consumer AND aggregate = p_aggregate AND parked_at IS NOT NULL
        RETURNING 1)
    SELECT count(*)::integer FROM r
$$;

-- inbox_expire deletes up to p_batch applied events applied more than p_keep
-- ago, oldest first, and returns how many. An applied row is the proof that
-- its effect happened: keep it longer than the broker keeps (or may
-- redeliver) the event, or a redelivery is applied again.
CREATE OR REPLACE FUNCTION "public".inbox_expire(p_consumer text, p_keep interval, p_batch integer)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    WITH d AS (
        DELETE FROM "public".inbox_events WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM "public".inbox_events
            WHERE consumer = p_consumer AND applied_at < now() - p_keep
            ORDER BY applied_at LIMIT p_batch))
        RETURNING 1)
    SELECT count(*)::integer FROM d
$$;
