package migrations

import (
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/pgquote"
)

// InboxTables is the SQL that creates the consumer side's tables of package
// inbox in schema (the consumer's database, not outboxd's):
//
//   - inbox: one row per applied event, keyed by (consumer, event_id), written
//     in the same transaction as the event's effect. consumer lets several
//     consumers (billing, shipping) share one table without sharing dedupe.
//     processed_at drives retention, hence the index on it.
//   - inbox_parked: events whose handler kept failing, with the error and the
//     whole record, so that an operator can see and replay them. With
//     OnPoison ParkKey the events of the same aggregate (key) that arrive
//     after a poison event are parked behind it, numbered by seq in their
//     order (seq is NULL for an event parked alone, OnPoison Park);
//     released_at is set by a release (inbox.Release, outboxd inbox
//     release) and tells the running consumer to replay the key's events.
//   - inbox_attempts: how often a consumer process started to apply an
//     event and did not finish (it crashed: a panic, OOM, a kill), so that
//     an event that crashes the process is parked after MaxAttempts instead
//     of crash-looping. Rows live only while an event is being retried.
//
// A deployment made by an older version is upgraded in place: the columns
// added since are added if missing, looked up first so that a consumer
// starting next to running ones takes no ACCESS EXCLUSIVE lock when there
// is nothing to do.
//
// event_id is text, not uuid: outboxd's id header is whatever the outbox's id
// column holds (a uuid in Debezium's layout, a number or a string elsewhere).
// The statements are idempotent (IF NOT EXISTS) and run in one Exec.
func InboxTables(schema string) (string, error) {
	if schema == "" {
		schema = "public"
	}
	if strings.ContainsAny(schema, "\x00") {
		return "", fmt.Errorf("inbox schema %q: contains a NUL byte", schema)
	}
	if strings.Contains(schema, "$inbox$") {
		return "", fmt.Errorf("inbox schema %q: contains $inbox$, which would end the DO block it is quoted in: pick another schema name", schema)
	}
	s := pgquote.Ident(schema)
	return fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %[1]s;
CREATE TABLE IF NOT EXISTS %[1]s.inbox (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX IF NOT EXISTS inbox_processed_at ON %[1]s.inbox (consumer, processed_at);
CREATE TABLE IF NOT EXISTS %[1]s.inbox_parked (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    "offset"     bigint      NOT NULL,
    key          bytea,
    value        bytea,
    headers      jsonb       NOT NULL DEFAULT '{}',
    attempts     integer     NOT NULL,
    error        text        NOT NULL,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    seq          bigint,
    released_at  timestamptz,
    PRIMARY KEY (consumer, event_id)
);
DO $inbox$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = %[2]s::regclass AND attname = 'released_at' AND NOT attisdropped) THEN
        ALTER TABLE %[1]s.inbox_parked ADD COLUMN IF NOT EXISTS seq bigint, ADD COLUMN IF NOT EXISTS released_at timestamptz;
    END IF;
END $inbox$;
CREATE INDEX IF NOT EXISTS inbox_parked_key ON %[1]s.inbox_parked (consumer, key, seq);
CREATE TABLE IF NOT EXISTS %[1]s.inbox_attempts (
    consumer     text        NOT NULL,
    event_id     text        NOT NULL,
    attempts     integer     NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
`, s, pgquote.Literal(s+".inbox_parked")), nil
}
