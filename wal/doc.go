// Package wal streams a PostgreSQL pgoutput logical replication slot and decodes
// it into transactions, rows and logical messages.
//
// It is the only package that speaks the replication protocol. It knows nothing
// of outboxes, Kafka or acknowledgements: callers pull decoded messages with
// Stream.Next and report how far they have durably handled the stream with
// Stream.SendStatus.
package wal
