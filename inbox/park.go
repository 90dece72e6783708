package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxd/outboxd/pgquote"
)

// Permanent marks a handler error as one no retry can fix (a payload that
// does not parse, an account that does not exist): the event is parked at
// once instead of after MaxAttempts. errors.Is and errors.As see through it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// isPermanent reports whether err is, or wraps, a Permanent error.
func isPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// ParkedAggregate is one parked aggregate (the events of one key) of a
// consumer: the poison event and, with OnPoison ParkKey, the later events of
// the same key parked behind it.
type ParkedAggregate struct {
	Key      string    // the aggregate id ("" for events without a key)
	Events   int       // parked events of the key
	FirstID  string    // the first parked event's id (the poison one)
	Error    string    // its handler's error
	Attempts int       // how often its handler was tried
	ParkedAt time.Time // when it was parked
	// Released is true while a release is pending: a running consumer of
	// this Name replays the key's events, in order, and deletes them.
	Released bool
}

// ListParked returns consumer name's parked aggregates in schema (the inbox
// tables' schema, "" for public), oldest first.
func ListParked(ctx context.Context, db *pgxpool.Pool, schema, name string) ([]ParkedAggregate, error) {
	rows, err := db.Query(ctx, `SELECT coalesce(key, ''::bytea), count(*),
	(array_agg(event_id ORDER BY seq NULLS FIRST, parked_at, event_id))[1],
	(array_agg(error ORDER BY seq NULLS FIRST, parked_at, event_id))[1],
	(array_agg(attempts ORDER BY seq NULLS FIRST, parked_at, event_id))[1],
	min(parked_at), bool_or(released_at IS NOT NULL)
FROM `+parkedTable(schema)+` WHERE consumer = $1 GROUP BY 1 ORDER BY 6, 1`, name)
	if err != nil {
		return nil, fmt.Errorf("inbox: listing parked events: %w", err)
	}
	defer rows.Close()
	var out []ParkedAggregate
	for rows.Next() {
		var a ParkedAggregate
		var key []byte
		if err := rows.Scan(&key, &a.Events, &a.FirstID, &a.Error, &a.Attempts, &a.ParkedAt, &a.Released); err != nil {
			return nil, fmt.Errorf("inbox: listing parked events: %w", err)
		}
		a.Key = string(key)
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("inbox: listing parked events: %w", err)
	}
	return out, nil
}

// Release releases consumer name's parked aggregate key, after the cause of
// its poison event was fixed, and returns how many events it released (0:
// nothing parked under that key). It does not apply them itself, since only
// the consumer has the Handler: it marks them released, and a running
// Consumer of that Name replays them in their order through its Handler
// (within ReleaseInterval), each in one transaction that also deletes its
// parked row, then lets the key's new events through. An event that fails
// again parks the key again, with the new error.
func Release(ctx context.Context, db *pgxpool.Pool, schema, name, key string) (int, error) {
	tag, err := db.Exec(ctx, `UPDATE `+parkedTable(schema)+` SET released_at = now()
WHERE consumer = $1 AND coalesce(key, ''::bytea) = $2 AND released_at IS NULL`, name, []byte(key))
	if err != nil {
		return 0, fmt.Errorf("inbox: releasing %q: %w", key, err)
	}
	return int(tag.RowsAffected()), nil
}

func parkedTable(schema string) string {
	if schema == "" {
		schema = "public"
	}
	return pgquote.Ident(schema) + ".inbox_parked"
}
