package brokers

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// Routing: the destination is the routed topic, the key the aggregateid,
// headers id and type, the payload the column's bytes verbatim; order per
// aggregate is commit order, and each event arrives once.
func TestRouting(t *testing.T) { forEachBroker(t, false, testRouting) }

func testRouting(t *testing.T, f *fixture) {
	f.startRelay()
	var evs []event
	for i := 1; i <= 30; i++ {
		evs = append(evs, event{i, fmt.Sprintf("order-%d", i%3), fmt.Sprintf("Type%d", i%2), fmt.Sprintf(`{"n": %d, "s": "é ☃ \"q\" \\ %d"}`, i, i)})
	}
	f.commit(evs[:10]...)
	f.commit(evs[10:11]...)
	end := f.commit(evs[11:]...)
	f.waitConfirmed(end, 30*time.Second)
	msgs := f.read(f.topic(), len(evs))
	if len(msgs) != len(evs) {
		t.Fatalf("%d messages, want %d", len(msgs), len(evs))
	}
	perKey := map[string][]int{}
	byID := map[string]event{}
	for _, e := range evs {
		byID[eventID(e.n)] = e
	}
	for _, m := range msgs {
		e, ok := byID[m.headers["id"]]
		if !ok {
			t.Fatalf("message with unknown id %q (headers %v)", m.headers["id"], m.headers)
		}
		if m.dest != f.topic() || m.key != e.key || m.headers["type"] != e.typ || !bytes.Equal(m.payload, []byte(e.payload)) {
			t.Fatalf("event %d arrived as dest %q key %q type %q payload %q; want %q %q %q %q", e.n, m.dest, m.key, m.headers["type"], m.payload, f.topic(), e.key, e.typ, e.payload)
		}
		perKey[m.key] = append(perKey[m.key], e.n)
	}
	for k, ns := range perKey {
		for i := 1; i < len(ns); i++ {
			if ns[i] < ns[i-1] {
				t.Fatalf("aggregate %s out of order: %v", k, ns)
			}
		}
		if len(ns) != 10 {
			t.Fatalf("aggregate %s: %d events, want 10", k, len(ns))
		}
	}
}

// The ack gate: with the broker down, the slot is not confirmed past the
// first event it has not acked; once it is back, everything arrives.
func TestAckGate(t *testing.T) {
	forEachBroker(t, true, func(t *testing.T, f *fixture) {
		f.startRelay()
		f.waitConfirmed(f.commit(ev(1, "k1")), 30*time.Second)
		if err := f.b.stop(f.ctx); err != nil {
			t.Fatal(err)
		}
		// Keepalives may confirm WAL up to the first transaction the
		// broker has not acked, never past it.
		held := f.commitHeld(ev(2, "k2"))
		var end uint64
		for i := 3; i <= 20; i++ {
			end = f.commit(ev(i, fmt.Sprintf("k%d", i%5)))
		}
		f.slotHolds(held, 2*time.Second, "with the broker down") // many confirm (20ms) and status (1s) intervals
		if err := f.b.start(f.ctx); err != nil {
			t.Fatal(err)
		}
		f.waitConfirmed(end, 60*time.Second)
		f.checkDelivered(f.read(f.topic(), 20), 20)
	})
}

// SIGKILL of outboxd mid-stream and a restart: nothing lost, order per
// aggregate kept; the duplicates that reach a consumer are counted (none
// where the broker deduplicates).
func TestRelayKillLosesNothing(t *testing.T) {
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		r := f.startRelay()
		const total = 2000
		done := f.writeInBackground(total)
		if _, err := f.b.read(f.ctx, f.topic(), 200); err != nil { // kill once events flow
			t.Fatal(err)
		}
		if err := r.Kill(); err != nil {
			t.Fatal(err)
		}
		end := <-done
		f.waitSlotInactive(10 * time.Second)
		f.startRelay()
		f.waitConfirmed(end, 60*time.Second)
		dups := f.checkDelivered(f.read(f.topic(), total), total)
		t.Logf("%d events, %d duplicates reached the consumer after SIGKILL of outboxd", total, dups)
	})
}

// An idle outbox does not pin WAL: while another table writes, the slot
// keeps up with the server, and the one event arrives once.
func TestIdleSlot(t *testing.T) {
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		f.startRelay()
		f.commit(ev(1, "k1"))
		f.exec(`CREATE TABLE busy (id bigserial PRIMARY KEY, filler text)`)
		start := f.walLSN()
		for range 2 {
			f.exec(`INSERT INTO busy (filler) SELECT repeat('x', 1000) FROM generate_series(1, 4000)`)
		}
		end := f.walLSN()
		if end-start < 8<<20 {
			t.Fatalf("wrote only %d bytes of WAL", end-start)
		}
		f.waitConfirmed(end, 30*time.Second)
		f.checkDelivered(f.read(f.topic(), 1), 1)
	})
}

var bigPayload = fmt.Sprintf(`{"s": "%s"}`, strings.Repeat("x", 3000))

// An invalid row (larger than --max-message-bytes) under --on-invalid
// dead-letter goes to the dead-letter destination, and the events around
// it to their topic.
func TestInvalidRowDeadLettered(t *testing.T) {
	big := bigPayload
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		dlq := "dlq." + f.agg
		f.startRelay("--max-message-bytes", "2048", "--on-invalid", "dead-letter", "--dead-letter-topic", dlq)
		f.commit(ev(1, "k1"))
		f.commit(event{2, "k2", "E", big})
		end := f.commit(ev(3, "k3"))
		f.waitConfirmed(end, 30*time.Second)
		msgs := f.read(f.topic(), 2)
		if len(msgs) != 2 || msgs[0].headers["id"] != eventID(1) || msgs[1].headers["id"] != eventID(3) {
			t.Fatalf("topic holds %d messages (%v), want events 1 and 3", len(msgs), ids(msgs))
		}
		dead := f.read(dlq, 1)
		if len(dead) != 1 || dead[0].headers["id"] != eventID(2) {
			t.Fatalf("dead-letter destination holds %v, want event 2", ids(dead))
		}
	})
}

// Under --on-invalid fail, the slot holds before the invalid row and
// nothing after it is published.
func TestInvalidRowHolds(t *testing.T) {
	big := bigPayload
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		f.startRelay("--max-message-bytes", "2048", "--on-invalid", "fail")
		f.waitConfirmed(f.commit(ev(1, "k1")), 30*time.Second)
		held := f.commitHeld(event{2, "k2", "E", big})
		f.commit(ev(3, "k3"))
		f.slotHolds(held, 2*time.Second, "past the invalid event")
		if msgs := f.read(f.topic(), 1); len(msgs) != 1 {
			t.Fatalf("topic holds %v, want event 1 only", ids(msgs))
		}
	})
}

func ids(msgs []message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.headers["id"])
	}
	return out
}

// SIGKILL of the broker under load, events committed while it is down,
// and a restart: nothing acked is lost, order per aggregate kept, and
// (where the broker deduplicates) each event arrives once.
func TestBrokerKill(t *testing.T) {
	forEachBroker(t, true, func(t *testing.T, f *fixture) {
		f.startRelay()
		const total, down = 3000, 100
		done := f.writeInBackground(total)
		if _, err := f.b.read(f.ctx, f.topic(), 100); err != nil { // events flow
			t.Fatal(err)
		}
		if err := f.b.kill(); err != nil {
			t.Fatal(err)
		}
		if <-done == 0 {
			t.FailNow()
		}
		for i := total + 1; i <= total+down; i += 10 { // after the background writer: commit order is id order
			var evs []event
			for j := i; j < i+10; j++ {
				evs = append(evs, ev(j, fmt.Sprintf("k%d", j%5)))
			}
			f.commit(evs...)
		}
		end := f.walLSN()
		if err := f.b.start(f.ctx); err != nil {
			t.Fatal(err)
		}
		f.waitConfirmed(end, 90*time.Second)
		dups := f.checkDelivered(f.read(f.topic(), total+down), total+down)
		t.Logf("%d events, %d duplicates reached the consumer after SIGKILL of the broker", total+down, dups)
	})
}

// A PostgreSQL restart: outboxd reconnects and resumes from the slot.
func TestPostgresRestart(t *testing.T) {
	if sharedPG.External() {
		t.Skip("restarts the server: needs the throwaway cluster")
	}
	forEachBroker(t, false, func(t *testing.T, f *fixture) {
		f.startRelay()
		f.commit(ev(1, "k1"))
		f.conn = harness.RestartPostgres(f.ctx, t, sharedPG, "fast", f.db, f.conn)
		f.commit(ev(2, "k2"))
		end := f.commit(ev(3, "k3"), ev(4, "k4"))
		f.waitConfirmed(end, 60*time.Second)
		f.checkDelivered(f.read(f.topic(), 4), 4)
	})
}
