package migrations

import (
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/pgquote"
)

// InboxEventsFile is the rendering of InboxEventsTable("public"), checked in
// for services that run it with psql or their own migration tool (the Python
// example runs it): migrations/inbox_events.sql.
const InboxEventsFile = "inbox_events.sql"

// InboxEventsTable is the SQL of the inbox table that `outboxd inbox` delivers
// into, and of the functions a service in any language applies its events
// with, in schema (the consumer's database).
//
// One row per event: outboxd inbox inserts it with ON CONFLICT DO NOTHING on
// (consumer, event_id), so the event row is also the dedupe record, and a
// redelivered event is a no-op. seq is assigned at insert; outboxd inbox
// inserts an aggregate's events one transaction after another in the order
// the broker delivered them (the later one only once the earlier committed),
// so within an aggregate seq order is delivery order and a visible event
// implies its predecessors are visible.
//
// The service, in its own transaction:
//
//	SELECT * FROM inbox_claim('billing', 1);       -- the oldest unapplied event of an aggregate no one holds
//	... its effect ...
//	SELECT inbox_applied('billing', event_id);     -- in the same transaction
//	COMMIT;
//
// or, when the effect fails, rolls back to a savepoint and calls inbox_failed,
// which counts the attempt and parks the event (and, behind it, its aggregate)
// after max_attempts. inbox_release un-parks an aggregate, inbox_expire is the
// retention of applied rows (outboxd inbox runs it).
//
// Why inbox_claim is correct under concurrent workers: an event is returned
// only if its seq is the smallest of its aggregate's unapplied events
// (parked ones included) in the statement's snapshot, and it is locked FOR
// UPDATE (SKIP LOCKED: a head another worker holds is passed over, not waited
// for). While worker A holds the head, the event behind it is not claimable:
// in any snapshot taken before A commits the head is unapplied; after A
// commits it is applied and the next event is the head, free to claim. A
// worker whose snapshot predates A's commit but locks the head after it
// re-checks the locked row's newest version (READ COMMITTED's re-check) and
// drops it, now applied. So at most one event per aggregate is in flight, and
// each is applied only after its predecessor committed. The head check is a
// correlated min() rather than NOT EXISTS: it stays one index probe per
// candidate without statistics, where the anti-join planned for NOT EXISTS on
// a fresh table scanned every unapplied row per candidate.
//
// The statements are idempotent (IF NOT EXISTS, CREATE OR REPLACE) and run in
// one Exec.
func InboxEventsTable(schema string) (string, error) {
	if schema == "" {
		schema = "public"
	}
	if strings.ContainsAny(schema, "\x00") {
		return "", fmt.Errorf("inbox schema %q: contains a NUL byte", schema)
	}
	return fmt.Sprintf(inboxEventsSQL, pgquote.Ident(schema)), nil
}

const inboxEventsSQL = `-- The inbox table outboxd inbox delivers into, and the functions a service
-- applies its events with (see docs/inbox.md, "Any language: the inbox table").
CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.inbox_events (
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
CREATE INDEX IF NOT EXISTS inbox_events_unapplied ON %[1]s.inbox_events (consumer, aggregate, seq) WHERE applied_at IS NULL;
CREATE INDEX IF NOT EXISTS inbox_events_queue ON %[1]s.inbox_events (consumer, seq) WHERE applied_at IS NULL AND parked_at IS NULL;
-- What inbox_expire deletes.
CREATE INDEX IF NOT EXISTS inbox_events_applied ON %[1]s.inbox_events (consumer, applied_at) WHERE applied_at IS NOT NULL;

-- inbox_claim locks and returns up to n events, each the oldest unapplied
-- event of its aggregate, oldest first, skipping aggregates another
-- transaction holds and parked ones. Call it in the transaction that applies
-- the effect; the locks last until it ends.
CREATE OR REPLACE FUNCTION %[1]s.inbox_claim(p_consumer text, p_limit integer DEFAULT 1)
RETURNS SETOF %[1]s.inbox_events LANGUAGE sql VOLATILE AS $$
    SELECT e.* FROM %[1]s.inbox_events e
    WHERE e.consumer = p_consumer AND e.applied_at IS NULL AND e.parked_at IS NULL
      AND (e.retry_at IS NULL OR e.retry_at <= now())
      AND e.seq = (
          SELECT min(b.seq) FROM %[1]s.inbox_events b
          WHERE b.consumer = e.consumer AND b.aggregate = e.aggregate AND b.applied_at IS NULL)
    ORDER BY e.seq
    LIMIT p_limit
    FOR UPDATE OF e SKIP LOCKED
$$;

-- inbox_applied marks a claimed event applied; call it in the effect's
-- transaction. False if the event is not there unapplied (not claimed by
-- this transaction, or the consumer or id is wrong).
CREATE OR REPLACE FUNCTION %[1]s.inbox_applied(p_consumer text, p_event_id text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    WITH u AS (
        UPDATE %[1]s.inbox_events SET applied_at = now()
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
CREATE OR REPLACE FUNCTION %[1]s.inbox_failed(p_consumer text, p_event_id text, p_error text, p_max_attempts integer, p_backoff interval DEFAULT '1s')
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    UPDATE %[1]s.inbox_events
    SET attempts = attempts + 1, last_error = p_error,
        retry_at = now() + p_backoff * power(2, least(attempts, 10)),
        parked_at = CASE WHEN attempts + 1 >= p_max_attempts THEN now() END
    WHERE consumer = p_consumer AND event_id = p_event_id AND applied_at IS NULL
    RETURNING parked_at IS NOT NULL
$$;

-- inbox_release un-parks an aggregate after a fix: its parked event is
-- claimable again (attempts from 0), then the ones behind it, in order.
-- Returns the number of events released.
CREATE OR REPLACE FUNCTION %[1]s.inbox_release(p_consumer text, p_aggregate text)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    WITH r AS (
        UPDATE %[1]s.inbox_events SET parked_at = NULL, retry_at = NULL, attempts = 0
        WHERE consumer = p_consumer AND aggregate = p_aggregate AND parked_at IS NOT NULL
        RETURNING 1)
    SELECT count(*)::integer FROM r
$$;

-- inbox_expire deletes up to p_batch applied events applied more than p_keep
-- ago, oldest first, and returns how many. An applied row is the proof that
-- its effect happened: keep it longer than the broker keeps (or may
-- redeliver) the event, or a redelivery is applied again.
CREATE OR REPLACE FUNCTION %[1]s.inbox_expire(p_consumer text, p_keep interval, p_batch integer)
RETURNS integer LANGUAGE sql VOLATILE AS $$
    WITH d AS (
        DELETE FROM %[1]s.inbox_events WHERE ctid = ANY (ARRAY(
            SELECT ctid FROM %[1]s.inbox_events
            WHERE consumer = p_consumer AND applied_at < now() - p_keep
            ORDER BY applied_at LIMIT p_batch))
        RETURNING 1)
    SELECT count(*)::integer FROM d
$$;
`
