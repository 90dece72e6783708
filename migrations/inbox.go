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
//     whole record, so that an operator can see and replay them.
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
    PRIMARY KEY (consumer, event_id)
);
`, s), nil
}
