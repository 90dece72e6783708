package bench

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMsgBrokerColumns runs the NATS and RabbitMQ columns' cases small, on
// one PostgreSQL cluster, so that `make test` keeps them working: a drain
// case of two rounds over one backlog (the second outboxd run must find its
// destination emptied and deliver exactly the backlog again: JetStream's
// duplicate window would otherwise drop it) and one latency run, each
// event received exactly once, with the broker's process in the CPU split.
func TestMsgBrokerColumns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, nats-server, a RabbitMQ node and outboxd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := DefaultConfig(true)
	cfg.Cases = map[string]bool{"drain": true, "latency": true}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, kind := range OtherBrokers {
		t.Run(kind, func(t *testing.T) {
			if err := e.StartBroker(ctx, kind); err != nil {
				t.Fatal(err)
			}
			defer e.StopBroker()
			if len(e.brokerPIDs) != 1 {
				t.Fatalf("broker pids %v, want the one server process", e.brokerPIDs)
			}
			const events, perTxn = 3000, 10
			c := e.RelayCase(ctx, "mq_"+kind, events, perTxn, 200, 2, false, false)
			if c.Err != nil {
				t.Fatal(c.Err)
			}
			if len(c.Relays) != 2 || len(c.Ceilings) != 2 {
				t.Fatalf("%d outboxd runs and %d ceiling reads, want 2 each", len(c.Relays), len(c.Ceilings))
			}
			for i, r := range c.Relays {
				if r.Delivered != events || r.ConfirmedAt <= 0 || r.KafkaAt <= 0 {
					t.Errorf("run %d: delivered %d, want exactly %d, delivered and confirmed (%+v)", i, r.Delivered, events, r)
				}
				if r.CPU.Broker <= 0 || r.CPU.BrokerIs != map[string]string{KindNATS: "nats-server", KindRabbitMQ: "beam.smp"}[kind] || r.OutboxdCPU <= 0 {
					t.Errorf("run %d: CPU split %s: want the broker's process and outboxd in it", i, r.CPU)
				}
			}
			// The bare publisher ran in each round over the same backlog,
			// its destination emptied first, and left exactly the backlog.
			if len(c.Bare) != 2 {
				t.Fatalf("%d bare publisher runs, want 2", len(c.Bare))
			}
			// On NATS it ran with outboxd's ordering guard too: JetStream
			// refuses a message whose guard names another predecessor, so
			// exactly the backlog means every guard held.
			guarded := map[string]int{KindNATS: 2, KindRabbitMQ: 0}[kind]
			if len(c.BareGuarded) != guarded {
				t.Fatalf("%d guarded bare publisher runs, want %d", len(c.BareGuarded), guarded)
			}
			for i, b := range append(slices.Clone(c.Bare), c.BareGuarded...) {
				if b.Published != events || b.Elapsed <= 0 || b.CPU.Broker <= 0 {
					t.Errorf("bare run %d: %d messages in the broker, want exactly %d (%+v)", i, b.Published, events, b)
				}
			}
			// The ratio, and the CPU per event behind it where both runs
			// took measurable CPU (/proc counts in clock ticks: a bare run
			// of 3,000 events may read as none).
			// One ratio row per bare publisher, each with its CPU row where
			// both runs took measurable CPU.
			vs := 0
			for _, r := range bareRows(c, kind) {
				if strings.HasPrefix(r[1], "  ″ vs ") {
					vs++
				} else if !strings.HasPrefix(r[1], "  ″ CPU the machine spends per event") {
					t.Errorf("bare row %q", r)
				}
			}
			if vs != 1+guarded/2 {
				t.Errorf("%d bare publisher ratio rows, want %d", vs, 1+guarded/2)
			}
			t.Logf("%s drain: ceiling %s, outboxd %s, bare publisher %s, CPU %s", kind, c.Ceiling().Elapsed, c.Relay().Elapsed, c.Bare[0].Elapsed, c.Relay().CPU)
			l, err := e.latency(ctx, "outboxd", 500, time.Second, 0)
			if err != nil {
				t.Fatal(err)
			}
			if l.Received != l.Sent || l.Sent != 500 || l.Dups != 0 || l.P50 <= 0 || l.P99 < l.P50 || l.CPU.Broker <= 0 {
				t.Errorf("latency run: received %d of %d (%d duplicates), p50 %s p99 %s, CPU %s", l.Received, l.Sent, l.Dups, l.P50, l.P99, l.CPU)
			}
			t.Logf("%s latency at 500 ev/s: p50 %s p99 %s max %s", kind, l.P50, l.P99, l.Max)
		})
	}
}
