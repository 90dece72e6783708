// Package sink defines what outboxd needs from a message broker: asynchronous,
// ordered-per-key publication with a durable acknowledgement per record. Each
// broker lives in its own subpackage behind the Sink interface (sink/kafka).
package sink

import (
	"context"
	"errors"

	"github.com/outboxd/outboxd/router"
)

// Sink publishes routed records.
//
// Produce must not block for long: the caller bounds what is in flight and
// applies back-pressure itself. done is called exactly once per record, from
// any goroutine, with nil only when the broker durably holds the record
// (for Kafka: acks=all). Records with the same key must be delivered in
// Produce order, including across retries.
type Sink interface {
	Produce(ctx context.Context, rec *router.Record, done func(error))
	// Ping checks that the broker is reachable.
	Ping(ctx context.Context) error
	// Close releases the client; records not yet acked fail.
	Close()
}

// Kind says how the relay must handle an error from a sink, the way pgconn's
// SafeToRetry does for PostgreSQL errors: the relay acts on the kind and
// never inspects a broker's own error types.
type Kind int

const (
	// Transient errors end the session; a new one starts, with backoff, from
	// the last confirmed position. Network errors, timeouts, a broker that is
	// down or electing a leader, an expired transaction.
	Transient Kind = iota
	// Rejected means the broker refuses this one record (too large, not
	// authorised, a partition that does not exist): retrying the same bytes
	// cannot succeed until someone changes the topic or the row, so the
	// invalid-event policy (--on-invalid) applies to it.
	Rejected
	// Fenced means another instance took over the producer identity: this
	// one must stop, or the two would fence each other in turn.
	Fenced
	// Denied means the broker refuses this principal something the relay
	// needs as a whole (a transactional id, the checkpoint topic): waiting
	// cannot fix it, an ACL can; the relay stops with the error.
	Denied
)

func (k Kind) String() string {
	switch k {
	case Rejected:
		return "rejected"
	case Fenced:
		return "fenced"
	case Denied:
		return "denied"
	}
	return "transient"
}

// Error is an error a sink has classified.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// KindOf returns the kind of a sink error; errors the sink did not classify
// are Transient.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Transient
}

// ErrRecordsFailed means records of an open transaction failed, so the
// transaction was aborted rather than committed: a transactional producer
// would commit the others, and its checkpoint would pass the failed ones.
// Each failed record's own error went to its Produce callback.
var ErrRecordsFailed = errors.New("records of the transaction failed; aborted it instead of committing")
