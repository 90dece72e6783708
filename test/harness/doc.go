// Package harness starts and controls the real external dependencies of
// outboxd's integration tests: a throwaway PostgreSQL server with logical
// replication enabled; Kafka of the kind OUTBOXD_TEST_KAFKA_KIND picks, behind
// one Kafka type (kfake in a child process, Apache Kafka in KRaft mode on one
// node or three from the Maven Central jars, or an external cluster); child
// processes with captured logs; and helpers to read what reached Kafka.
// With OUTBOXD_TEST_BACKEND=docker the server and broker run as containers
// instead (docker*.go, through testcontainers-go, on the host network).
//
// StartApacheKafka(ctx, nodes, opts...) is the entry point for suites that
// need a real cluster: per-node Kill/Stop/Start/Pause/Resume, the leader of a
// partition, the active controller and a transaction coordinator, all on
// 127.0.0.1, every JVM killed when the test process ends.
package harness
