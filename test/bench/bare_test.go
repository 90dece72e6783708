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
	if len(r) != 1 || r[0] != want { // no CPU split: no CPU row
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
	// NATS's guarded bare publisher: a report-only row of its own, from
	// its fastest run; the target stays the unguarded one's.
	c.Bare[1].CPU = CPUSplit{}
	c.BareGuarded = []BareRun{{Elapsed: 1600 * time.Millisecond}, {Elapsed: 1500 * time.Millisecond}}
	r = bareRows(c, KindNATS)
	wantGuarded := row{"", "  ″ vs the bare publisher sending outboxd's ordering guard too (Nats-Expected-Last-Msg-Id naming the message before), fastest of 2",
		"7,692 ev/s (1.30 s)", "guarded bare publisher 6,667 ev/s (1.50 s)", "1.15×", "—", "—"}
	if len(r) != 2 || r[0][6] != "FAIL" || r[1] != wantGuarded {
		t.Fatalf("rows with a guarded bare publisher\n%q\nwant the target's row, then\n%q", r, wantGuarded)
	}
}

// TestBareCPURow: the CPU each run spent per event (outboxd's: outboxd,
// broker, walsender; the bare publisher's: the bench process and the
// broker), the drain each allows on the machine's cores, their ratio, and
// the ratio of a relay that added nothing to the publisher's CPU but had the
// walsender beside it, to the publisher's bound and to its drain (166,667
// ev/s here). No row without per-process CPU.
func TestBareCPURow(t *testing.T) {
	ms := time.Millisecond
	ob := CPUSplit{Known: true, Wall: time.Second, Outboxd: 700 * ms, Broker: 730 * ms, BrokerIs: "nats-server", Walsender: 260 * ms, Bench: 50 * ms}
	bare := CPUSplit{Known: true, Wall: 600 * ms, Bench: 450 * ms, Broker: 580 * ms, BrokerIs: "nats-server"}
	r, ok := bareCPURow(100_000, ob, bare, 600*ms, 2, "the bare publisher's")
	want := row{"", "  ″ CPU the machine spends per event, outboxd's fastest run vs the bare publisher's (2 cores bound a drain at cores ÷ it)",
		"outboxd 7.0 + nats-server 7.3 + walsender 2.6 = 16.9 µs/ev (≤ 118,343 ev/s)",
		"publisher 4.5 + nats-server 5.8 = 10.3 µs/ev (≤ 194,174 ev/s); a relay adding nothing to the publisher's CPU, with the walsender beside it: 12.9 µs/ev (≤ 155,038 ev/s), 0.80× the publisher's bound and 0.93× its drain",
		"0.61×", "—", "—"}
	if !ok || r != want {
		t.Fatalf("row\n%q\nwant\n%q", r, want)
	}
	c := RelayCase{Backlog: backlog{Events: 100_000}, Relays: []RelayRun{{Elapsed: time.Second, CPU: ob}}, Bare: []BareRun{{Elapsed: 600 * ms, CPU: bare}}}
	if rows := bareRows(c, KindNATS); len(rows) != 2 || rows[1] != want {
		t.Errorf("bareRows: %q", rows)
	}
	if _, ok := bareCPURow(100_000, ob, bare, 0, 2, "the bare publisher's"); ok {
		t.Error("a row for a bare run with no duration (no drain to set the bound against)")
	}
	ob.Known = false
	if _, ok := bareCPURow(100_000, ob, bare, 600*ms, 2, "the bare publisher's"); ok {
		t.Error("a row for external servers (no per-process CPU)")
	}
}
