// Package inbox is the consumer half of the transactional outbox: it reads
// outboxd's events from Kafka and applies each one's effect exactly once in
// the consumer's own PostgreSQL database.
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
// a crash, a rebalance, an outboxd resend) finds the row and skips the event.
//
// Offsets are committed to Kafka only after the database commit (marked, then
// committed by franz-go's autocommit of marks, and synchronously when a
// partition is revoked or the consumer stops). The offset is a hint for where
// to resume, never the proof that an effect was applied: that proof is the
// inbox row. A crash between the two replays a few events, which the inbox
// row turns into counted duplicates.
//
// Each assigned partition has one goroutine that applies its events in order,
// so the per-aggregate order outboxd keeps (the key is the aggregate id) is
// the order effects are applied in. The goroutine is owned by the Consumer:
// started when the partition is assigned and stopped when it is revoked, after
// it finished its current batch and its offset was committed.
//
// A handler error rolls the transaction back and is retried with backoff;
// after MaxAttempts the event is parked (the inbox_parked table or a
// dead-letter topic) in one transaction with its inbox row and the partition
// continues, or, with OnPoison: Hold, the partition holds and keeps retrying.
// An event is never skipped silently. Database errors (a lost connection, a
// restart, a serialization failure) are retried without counting as attempts.
//
// See docs/inbox.md for the guarantee, the retention window and the metrics.
package inbox
