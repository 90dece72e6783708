// Package parity runs Debezium (Kafka Connect standalone, the PostgreSQL
// connector and its Outbox Event Router) and outboxd side by side on the same
// WAL and compares what each puts into Kafka, byte for byte: one corpus of
// outbox rows is written once, each system reads it through its own slot
// into its own single-node Apache Kafka cluster (so topic names are
// identical), and a comparator matches records by their id header.
//
// Every difference it finds must be listed in docs/debezium.md's difference
// table (between the parity markers), and every row of
// that table must be found: the suite fails when they disagree. The cutover
// test hands Debezium's slot to outboxd and counts what is sent twice.
//
// `go test ./test/parity/` runs a short corpus (make test); `make parity`
// runs it in full (-full).
package parity
