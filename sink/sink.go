// Package sink defines every contract outboxd has with a message broker:
// asynchronous, ordered-per-key publication with a durable acknowledgement
// per record ([Sink]), the transactional contract of exactly-once mode
// ([Transactional]) and the progress record that outlives the slot
// ([ProgressStore]). Each broker lives in its own subpackage behind them
// (sink/kafka), checked with var _ sink.Sink = (*Sink)(nil).
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
	// Check says, before producing, whether the broker would refuse rec
	// (an Error of kind Rejected): a record larger than the broker takes,
	// a destination that does not exist.
	Check(ctx context.Context, rec *router.Record) error
	// Probe produces rec and waits for the outcome; in exactly-once mode
	// without making it visible to read_committed consumers. The relay
	// probes a held event to learn when the broker takes it again.
	Probe(ctx context.Context, rec *router.Record) error
	// Close releases the client; records not yet acked fail.
	Close()
}

// Namer is implemented by a sink that names its broker, in lower case
// ("kafka", "nats", "rabbitmq"): the engine's messages and the
// outboxd_reconnects_total{target} label say it instead of a broker it is
// not.
type Namer interface {
	Name() string
}

// Transactional is the part of a transactional sink exactly-once mode uses:
// a broker transaction commits its records together with the checkpoint.
type Transactional interface {
	Begin() error
	// Commit waits for the transaction's records and commits them with the
	// checkpoint at; it aborts instead if any record failed.
	Commit(ctx context.Context, at Checkpoint) error
	Abort(ctx context.Context)
	// Reset replaces the producer (same transactional id) after a failure.
	Reset(ctx context.Context) error
	LoadCheckpoint(ctx context.Context) (Checkpoint, error)
}

// ProgressStore keeps the progress record: how far outboxd has published a
// slot, on which server, in a place that outlives the slot (Kafka: a
// compacted topic). The relay's gap check reads it.
type ProgressStore interface {
	// EnsureProgressTopic creates the record's home if it is missing.
	EnsureProgressTopic(ctx context.Context) error
	// LoadProgress returns the record (nil: none yet).
	LoadProgress(ctx context.Context) ([]byte, error)
	WriteProgress(ctx context.Context, value []byte) error
	// String names the record, for logs and errors.
	String() string
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
