package bench

import (
	"testing"
	"time"
)

// TestBareRows: outboxd's fastest drain over the bare publisher's fastest,
// judged against 0.8× on NATS and RabbitMQ, not judged when either run was
// busy, and no row where no bare publisher ran (Kafka).
func TestBareRows(t *testing.T) {
	c := RelayCase{Backlog: backlog{Events: 10_000},
		Relays: []RelayRun{{Elapsed: 2 * time.Second}, {Elapsed: 1250 * time.Millisecond}},
		Bare:   []BareRun{{Elapsed: 1100 * time.Millisecond}, {Elapsed: time.Second}}}
	if r := bareRows(RelayCase{Relays: c.Relays}, KindNATS); r != nil {
		t.Fatalf("a row without a bare publisher run: %q", r)
	}
	r := bareRows(c, KindNATS)
	want := row{"", "  ″ vs a bare publisher of the same messages (nats.go, every PubAck awaited), fastest of 2",
		"8,000 ev/s (1.25 s)", "bare publisher 10,000 ev/s (1.00 s)", "0.80×", "≥ 0.80× bare publisher", "PASS"}
	if len(r) != 1 || r[0] != want {
		t.Fatalf("row\n%q\nwant\n%q", r, want)
	}
	c.Relays[1].Elapsed = 1300 * time.Millisecond
	if r := bareRows(c, KindRabbitMQ); r[0][6] != "FAIL" || r[0][1] != "  ″ vs a bare publisher of the same messages (amqp091, confirm mode, persistent, mandatory), fastest of 2" {
		t.Errorf("0.77× on RabbitMQ: %q", r[0])
	}
	c.Bare[1].CPU = CPUSplit{Known: true, Wall: time.Second, Busy: 400 * time.Millisecond}
	if r := bareRows(c, KindRabbitMQ); r[0][6] != "busy" {
		t.Errorf("a busy bare run: %q", r[0])
	}
}
