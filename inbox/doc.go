// Package inbox is the consumer half of the transactional outbox: it reads
// outboxd's events from Kafka, NATS JetStream or RabbitMQ (Config.Broker, a
// URL as outboxd's --broker) and applies each one's effect exactly once, in
// order per aggregate, in the consumer's own PostgreSQL database.
//
// outboxd delivers every committed event at least once. A consumer that
// applies an effect per message therefore applies some effects twice unless it
// remembers, in the same transaction as the effect, which events it has
// applied. That is the inbox: for every event the Consumer opens one pgx
// transaction, runs
//
//	INSERT INTO inbox (consumer, event_id, ...) ON CONFLICT DO NOTHING
//
// and, only if the row is new, calls the Handler with that transaction. The
// effect and the dedupe row commit together or not at all, so a replay (after
// a crash, a rebalance, a redelivery, an outboxd resend) finds the row and
// skips the event.
//
// The broker is acknowledged only after the database commit: Kafka offsets
// are marked, then committed by franz-go's autocommit of marks (and
// synchronously when a partition is revoked or the consumer stops); JetStream
// messages and RabbitMQ deliveries are acked one by one. An acknowledgement
// is a hint for where to resume, never the proof that an effect was applied:
// that proof is the inbox row. A crash between the two replays a few events,
// which the inbox row turns into counted duplicates.
//
// Each lane (a Kafka partition, a JetStream stream, a RabbitMQ queue) has one
// goroutine that applies its events in order, so the per-aggregate order
// outboxd keeps (the key is the aggregate id) is the order effects are
// applied in. A source (source_*.go) feeds lanes; the apply, dedupe, retry
// and park logic (partition.go) is the same for every broker. On NATS and
// RabbitMQ one process at a time consumes a stream or queue (an advisory
// lock, an exclusive consumer) so that a redelivery can never overtake.
//
// A handler error rolls the transaction back and blocks only the event's key:
// the event is retried with backoff, the key's later events wait behind it,
// the other keys go on. After MaxAttempts, or at once for a Permanent error,
// the event is poison: with OnPoison ParkKey (the default) it is parked in
// inbox_parked with its inbox row, and so is every later event of its key,
// in order, until Release (or outboxd inbox release) has the running consumer
// replay them; Park parks the event alone, Hold stops the lane. An event is
// never skipped silently. Database errors (a lost connection, a restart, a
// serialization failure) are retried without counting as attempts, and an
// event that crashed MaxAttempts consumer processes is parked instead of
// crash-looping.
//
// See docs/inbox.md for the guarantee, each broker's acknowledgements, the
// retention window, tracing and the metrics.
package inbox
