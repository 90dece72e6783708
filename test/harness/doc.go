// Package harness starts and controls the real external dependencies of
// outboxd's integration tests: a throwaway PostgreSQL server with logical
// replication enabled, a restartable fake Kafka broker (test/cmd/kfaked),
// child processes with captured logs, and helpers to read what reached Kafka.
// With OUTBOXD_TEST_BACKEND=docker the server and broker run as containers
// instead (docker*.go, through testcontainers-go, on the host network).
package harness
