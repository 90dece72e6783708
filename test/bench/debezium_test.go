package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestDebeziumTable renders made-up debezium results: every target is
// judged from the figures (a miss is returned, so `make bench` exits
// non-zero), and Debezium's configuration is printed.
func TestDebeziumTable(t *testing.T) {
	d := &DebeziumResults{
		Broker:    "Apache Kafka 4.4.0, one KRaft node on 127.0.0.1",
		JVM:       strings.Join(debeziumJVM, " "),
		Worker:    "offset.flush.interval.ms=60000",
		Connector: "transforms.outbox.type=io.debezium.transforms.outbox.EventRouter",
		Drains: []DebeziumDrain{{
			PerTxn:  10,
			Backlog: backlog{Events: 100_000, PerTxn: 10},
			Outboxd: RelayRun{KafkaAt: time.Second, ConfirmedAt: time.Second + 5*time.Millisecond, OutboxdCPU: time.Second, PeakRSS: 40 << 20},
			// 2.5× slower only: the drain target (≥ 3×) is missed.
			Default: DebeziumRun{Flush: defaultFlush, Startup: 9 * time.Second, KafkaAt: 2500 * time.Millisecond, ConfirmedAt: 50 * time.Second,
				CPU: 10 * time.Second, LifeCPU: 20 * time.Second, PeakRSS: 600 << 20},
		}},
		Latency: []DebeziumLatency{{Rate: 1000,
			Outboxd:  LatencyRun{Rate: 1000, Duration: 20 * time.Second, Sent: 20000, Achieved: 1000, P50: 2 * time.Millisecond, P99: 4 * time.Millisecond, Max: 9 * time.Millisecond, PeakRSS: 30 << 20},
			Debezium: LatencyRun{Rate: 1000, Duration: 20 * time.Second, Sent: 20000, Achieved: 1000, P50: 300 * time.Millisecond, P99: 510 * time.Millisecond, Max: 700 * time.Millisecond, PeakRSS: 500 << 20},
		}},
		Idle: &DebeziumIdle{WAL: 52 << 20, Wait: 90 * time.Second, Slots: []IdleSlot{
			{Reader: "outboxd", ReleasedAt: 3 * time.Second}, {Reader: "Debezium defaults", LagAtEnd: 54_000_000}}},
	}
	var out bytes.Buffer
	missed := d.Table(&out)
	if len(missed) != 1 || !strings.HasPrefix(missed[0], "drain 100,000 events, 10 ev/txn") {
		t.Errorf("missed = %q, want only the drain", missed)
	}
	for _, want := range []string{
		"| D1 | drain 100,000 events, 10 ev/txn: until all in Kafka", "2.50×", "≥ 3×", "FAIL", "| 1.00 s ", "0.02×",
		"| D2 | latency 1,000 ev/s × 20s", "p99 0.01×", // 4 ms / 510 ms
		"10.0 µs/ev (whole process life)", "100.0 µs/ev (slot active → all in Kafka; whole JVM life 200.0 µs/ev)", "0.10×",
		"≤ 10 ms (poll interval)", "47.5s", "0.00×", // confirmation: 10 ms floor / 47.5 s
		"40.0 MiB", "600.0 MiB (Connect JVM)", "0.07×",
		"released after 3.00 s", "not released: 54.0 MB behind at the end",
		"offset.flush.interval.ms=60000", "io.debezium.transforms.outbox.EventRouter", "-XX:+UseG1GC",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if (*DebeziumResults)(nil).Failed() || d.Failed() {
		t.Error("Failed() without errors")
	}
}
