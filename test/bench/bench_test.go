package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestDrainQuick runs one small drain case end to end (backlog, read-only
// ceiling, outboxd at-least-once and --exactly-once, polling publisher) so
// that `make test` keeps the bench working, and checks that its numbers are
// sane.
func TestDrainQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a broker and outboxd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := DefaultConfig(true)
	cfg.Cases = map[string]bool{"drain": true, "eos": true}
	cfg.TxnSizes = []int{10}
	kind, err := harness.KafkaKind() // OUTBOXD_TEST_KAFKA_KIND=apache runs it on Apache Kafka
	if err != nil {
		t.Fatal(err)
	}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.StartBroker(ctx, kind); err != nil {
		t.Fatal(err)
	}

	const events, perTxn = 5000, 10
	start := time.Now()
	c := e.RelayCase(ctx, "test_drain", events, perTxn, 200, 1, true, true)
	took := time.Since(start)
	if c.Err != nil {
		t.Fatal(c.Err)
	}
	t.Logf("case took %s: ceiling %s, outboxd %s (kafka %s, confirmed %s, CPU %s, RSS %.1f MiB), polling %s",
		took, c.Ceiling().Elapsed, c.Relay().Elapsed, c.Relay().KafkaAt, c.Relay().ConfirmedAt, c.RelayCPU(), mib(c.PeakRSS()), c.Polling.Elapsed)
	if took > 30*time.Second {
		t.Errorf("one quick drain case took %s, want < 30s", took)
	}
	b := c.Backlog
	if b.Events != events || b.Txns != events/perTxn || b.PayloadBytes < 150*events || b.PayloadBytes > 300*events {
		t.Errorf("backlog %+v: want %d events in %d transactions of ~200-byte payloads", b, events, events/perTxn)
	}
	if len(c.Ceilings) != 1 || len(c.Relays) != 1 || len(c.EOSRelays) != 1 {
		t.Fatalf("%d ceiling reads, %d outboxd runs and %d exactly-once runs, want 1 each", len(c.Ceilings), len(c.Relays), len(c.EOSRelays))
	}
	if ce := c.Ceiling(); ce.Inserts != events || ce.Commits != events/perTxn || ce.EndLSN == 0 || ce.Elapsed <= 0 {
		t.Errorf("ceiling %+v: want %d inserts in %d commits", ce, events, events/perTxn)
	}
	r := c.Relay()
	if r.Delivered != events || r.KafkaAt <= 0 || r.ConfirmedAt <= 0 || r.Elapsed < r.KafkaAt || r.Elapsed < r.ConfirmedAt {
		t.Errorf("outboxd run %+v: want all %d events delivered and confirmed", r, events)
	}
	if r.OutboxdCPU <= 0 || r.PeakRSS < 1<<20 || r.PeakRSS > 1<<30 {
		t.Errorf("outboxd CPU %s, peak RSS %d bytes: not plausible", r.OutboxdCPU, r.PeakRSS)
	}
	// Each event is allocated at least once on its way (its record), and
	// outboxd slept and was woken at least once during the drain.
	t.Logf("outboxd: %d allocations (%.1f per event), %d context switches (%.2f per event)",
		r.Allocs, float64(r.Allocs)/events, r.CtxSwitches, float64(r.CtxSwitches)/events)
	if r.Allocs < events || r.Allocs > 1000*events || r.CtxSwitches <= 0 {
		t.Errorf("outboxd %d allocations, %d context switches for %d events: not plausible", r.Allocs, r.CtxSwitches, events)
	}
	x := c.EOSRelay()
	t.Logf("exactly-once: %s (read_committed complete %s, confirmed %s, CPU %s)", x.Elapsed, x.KafkaAt, x.ConfirmedAt, x.OutboxdCPU)
	if !x.ExactlyOnce || x.Delivered != events || x.KafkaAt <= 0 || x.ConfirmedAt <= 0 || x.Elapsed < x.KafkaAt || x.OutboxdCPU <= 0 {
		t.Errorf("exactly-once run %+v: want all %d events visible to read_committed and confirmed", x, events)
	}
	if p := c.Polling; p == nil || p.Published != events || p.Elapsed <= 0 || p.Loops < events/100 {
		t.Errorf("polling run %+v: want %d events published in ≥ %d claims", p, events, events/100)
	}
	for name, d := range map[string]time.Duration{"ceiling": c.Ceiling().Elapsed, "outboxd": r.Elapsed, "exactly-once": x.Elapsed, "polling": c.Polling.Elapsed} {
		if rate := EventsPerSec(events, d); rate < 200 || rate > 10_000_000 {
			t.Errorf("%s: %.0f events/s is not plausible", name, rate)
		}
	}

	// The report renders the case (and a made-up exactly-once latency pair).
	lat := func(p50 time.Duration) LatencyRun {
		return LatencyRun{Rate: 1000, Duration: 5 * time.Second, Writers: 4, Sent: 5000, Received: 5000, Achieved: 1000,
			P50: p50, P95: 2 * p50, P99: 3 * p50, Max: 4 * p50}
	}
	res := &Results{Config: cfg, Started: start, Machine: e.Machine, Columns: []*Column{{Broker: kind, Desc: e.BrokerDesc, Drains: []RelayCase{c},
		EOSLatency: &EOSLatency{Rate: 1000, ALO: lat(2 * time.Millisecond), EOS: lat(50 * time.Millisecond)}}}}
	var out bytes.Buffer
	res.Table(&out)
	brokerCPU := map[string]string{harness.KindKfake: "kfaked ", harness.KindApache: "kafka JVM ", harness.KindApacheCluster: "3 kafka JVMs "}[kind]
	if brokerCPU != "" && !strings.Contains(r.CPU.String(), brokerCPU) {
		t.Errorf("CPU split %q lacks the broker (%q)", r.CPU.String(), brokerCPU)
	}
	// Not asserted: that the broker's share is above zero. A 5,000-event
	// drain takes well under 100 ms, and /proc counts CPU in 10 ms ticks.
	for _, want := range []string{"drain 5,000 events, 10 ev/txn", "read-only ceiling", "| " + kind + " ", "kafka:    " + kind, "polling (100/claim)", "nproc",
		"exactly-once drain 5,000 events, 10 ev/txn", "at-least-once ", "exactly-once latency 1,000 ev/s × 5s",
		"50.0ms / 100ms / 150ms / 200ms", "p99 25.00×", "+48.0ms / +96.0ms / +144ms / +192ms"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestHelpers(t *testing.T) {
	if got := seqFromID([]byte(latencyID(4321))); got != 4321 {
		t.Errorf("seqFromID(latencyID(4321)) = %d", got)
	}
	if got := seqFromID([]byte("not-a-uuid")); got != -1 {
		t.Errorf("seqFromID(junk) = %d", got)
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -5000: "-5,000"} {
		if got := commas(n); got != want {
			t.Errorf("commas(%d) = %q, want %q", n, got, want)
		}
	}
	// An Insert message: 'I', relation id, 'N', 2 columns: text id, null.
	id := latencyID(7)
	msg := []byte{'I', 0, 0, 0x40, 0x01, 'N', 0, 2, 't'}
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(id)))
	msg = append(append(msg, id...), 'n')
	if got := string(firstColumn(msg)); got != id {
		t.Errorf("firstColumn = %q, want %q", got, id)
	}
	if firstColumn(msg[:12]) != nil {
		t.Error("firstColumn of a truncated message is not nil")
	}
	if got := chunksFor(200); got != 2 {
		t.Errorf("chunksFor(200) = %d, want 2", got)
	}
}

// TestTableColumns checks the broker column: each measurement's rows of
// every broker side by side, brokers in run order, and targets per broker
// kind (a miss on Apache single node is reported, none on the cluster).
func TestTableColumns(t *testing.T) {
	drain := func(perTxn int, ceiling, relay time.Duration) RelayCase {
		return RelayCase{Name: "d", Events: 1000, PerTxn: perTxn, Backlog: backlog{Events: 1000, PerTxn: perTxn, Txns: 1000 / perTxn, PayloadBytes: 200_000},
			Ceilings: []CeilingRun{{Elapsed: ceiling}}, Relays: []RelayRun{{Elapsed: relay, OutboxdCPU: time.Millisecond}}}
	}
	cols := []*Column{
		{Broker: "kfake", Drains: []RelayCase{drain(10, time.Second, 900*time.Millisecond), drain(100, time.Second, 900*time.Millisecond)}},
		{Broker: "apache", Drains: []RelayCase{drain(10, time.Second, 2*time.Second), drain(100, time.Second, 900*time.Millisecond)}},
		{Broker: "apache-cluster", Drains: []RelayCase{drain(10, time.Second, 3*time.Second), drain(100, time.Second, 3*time.Second)}},
		{Broker: "external", Err: errors.New("no such broker")},
	}
	res := &Results{Config: Config{Cases: map[string]bool{"drain": true}, DrainEvents: 1000}, Columns: cols}
	var out bytes.Buffer
	missed := res.Table(&out)
	if want := []string{"apache: drain 1,000 events, 10 ev/txn (200 B payloads)"}; !slices.Equal(missed, want) {
		t.Errorf("missed = %q, want %q", missed, want)
	}
	if !res.Failed() {
		t.Error("a column whose broker did not start is not a failure")
	}
	var kafkaCol []string
	for _, line := range strings.Split(out.String(), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) == 10 && strings.HasPrefix(strings.TrimSpace(cells[2]), "drain") {
			kafkaCol = append(kafkaCol, strings.TrimSpace(cells[2])+" "+strings.TrimSpace(cells[3])+" "+strings.TrimSpace(cells[8]))
		}
	}
	want := []string{
		"drain 1,000 events, 10 ev/txn (200 B payloads) kfake PASS",
		"drain 1,000 events, 10 ev/txn (200 B payloads) apache FAIL",
		"drain 1,000 events, 10 ev/txn (200 B payloads) apache-cluster —",
		"drain 1,000 events, 100 ev/txn (200 B payloads) kfake PASS",
		"drain 1,000 events, 100 ev/txn (200 B payloads) apache PASS",
		"drain 1,000 events, 100 ev/txn (200 B payloads) apache-cluster —",
	}
	if !slices.Equal(kafkaCol, want) {
		t.Errorf("drain rows (measurement, kafka, result):\n%s\nwant:\n%s\ntable:\n%s", strings.Join(kafkaCol, "\n"), strings.Join(want, "\n"), out.String())
	}
	if !strings.Contains(out.String(), "| broker ") || !strings.Contains(out.String(), "ERROR: no such broker") {
		t.Errorf("the failed broker has no ERROR row:\n%s", out.String())
	}
}
