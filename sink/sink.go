// Package sink defines what outboxd needs from a message broker: asynchronous,
// ordered-per-key publication with a durable acknowledgement per record. Each
// broker lives in its own subpackage behind the Sink interface (sink/kafka).
package sink

import (
	"context"

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
