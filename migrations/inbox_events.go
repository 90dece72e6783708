package migrations

import (
	_ "embed"
	"fmt"
	"strings"

	"github.com/outboxd/outboxd/pgquote"
)

// InboxEventsFile is InboxEventsTable("public"), checked in for services
// that run it with psql or their own migration tool (the Python example runs
// it): migrations/inbox_events.sql.
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
	return strings.ReplaceAll(inboxEventsSQL, `"public"`, pgquote.Ident(schema)), nil
}

// inboxEventsSQL is the file, for schema public: the one source of the SQL,
// which services without outboxd run as it is. Every "public" in it is the
// schema (TestInboxEventsTableSchema checks).
//
//go:embed inbox_events.sql
var inboxEventsSQL string
