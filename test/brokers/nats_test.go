package brokers

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

func init() { registerKind(brokerKind{name: "nats", start: startNATS}) }

// natsBroker is a real nats-server (JetStream, file storage); outboxd
// creates the streams (--nats-create-streams, the default).
type natsBroker struct{ srv *harness.NATS }

// startNATS starts a server per test: it takes ~0.1 s, so none is shared.
func startNATS(t *testing.T, _ bool) broker { return &natsBroker{srv: harness.NATSForTest(t)} }

func (b *natsBroker) flags() []string { return []string{"--broker", b.srv.URL()} }

func (b *natsBroker) read(ctx context.Context, topic string, want int) ([]message, error) {
	return readNATS(ctx, b.srv.URL(), topic, want, b.srv.ClientOptions()...)
}

// readNATS reads topic's stream from the server(s) at url.
func readNATS(ctx context.Context, url, topic string, want int, opts ...natsgo.Option) ([]message, error) {
	raw, err := harness.ReadStream(ctx, url, nats.StreamName(topic), want, opts...)
	out := make([]message, len(raw))
	for i, m := range raw {
		h := map[string]string{}
		for k := range m.Header {
			h[k] = m.Header.Get(k)
		}
		out[i] = message{dest: m.Subject, key: m.Header.Get(nats.KeyHeader), headers: h, payload: m.Data}
	}
	return out, err
}

func (b *natsBroker) stop(context.Context) error      { return b.srv.Stop() }
func (b *natsBroker) kill() error                     { return b.srv.Kill() }
func (b *natsBroker) start(ctx context.Context) error { return b.srv.Start(ctx) }
func (b *natsBroker) dedups() bool                    { return true }

// Without --nats-create-streams, an event whose topic has no stream is
// invalid: under --on-invalid fail the slot holds before it, and outboxd
// streams on by itself once someone creates the stream.
func TestNATSHoldsUntilStreamExists(t *testing.T) {
	b := &natsBroker{srv: harness.NATSForTest(t)}
	f := newFixture(t, b)
	f.startRelay("--nats-create-streams=false", "--on-invalid", "fail")
	held := f.commitHeld(ev(1, "k1"))
	end := f.commit(ev(2, "k2"))
	f.slotHolds(held, 2*time.Second, "past an event without a stream")
	js := b.srv.JetStream(t)
	if _, err := js.CreateStream(f.ctx, jetstream.StreamConfig{Name: nats.StreamName(f.topic()), Subjects: []string{f.topic()}}); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 60*time.Second)
	f.checkDelivered(f.read(f.topic(), 2), 2)
}

// The progress record lives in the KV bucket under <system id>/<slot> and
// outlives the slot: outboxd, running as the role `outboxd setup --role`
// makes, reports the lost slot as a gap and exits, and continues only with
// --accept-gap.
func TestNATSProgressRecordReportsLostSlot(t *testing.T) {
	b := &natsBroker{srv: harness.NATSForTest(t)}
	f := newFixture(t, b)
	role := "r_" + f.slot
	f.exec(`DROP ROLE IF EXISTS ` + role)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, f.slot)
		_, _ = f.conn.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = f.conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	if out, err := exec.CommandContext(f.ctx, outboxdBin, "setup", "--postgres", f.dsn, "--slot", f.slot, "--role", role).CombinedOutput(); err != nil {
		t.Fatalf("outboxd setup --role: %v\n%s", err, out)
	}
	superDSN := f.dsn
	if f.dsn = strings.Replace(f.dsn, "postgres://postgres@", "postgres://"+role+"@", 1); f.dsn == superDSN {
		t.Fatalf("could not rewrite the user of %q", superDSN)
	}
	r := f.startRelay()
	end := f.commit(ev(1, "k1"))
	f.waitConfirmed(end, 30*time.Second)
	var sysid string
	if err := f.conn.QueryRow(f.ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysid); err != nil {
		t.Fatal(err)
	}
	js := b.srv.JetStream(t)
	key := sysid + "/" + f.slot
	if err := r.Stop(20 * time.Second); err != nil { // the final confirmation writes the record too
		t.Fatal(err)
	}
	kv, err := js.KeyValue(f.ctx, "outboxd_progress")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(f.ctx, key); err != nil || len(e.Value()) == 0 {
		t.Fatalf("progress record %s: %v", key, err)
	} else {
		t.Logf("progress record %s = %s", key, e.Value())
	}
	f.waitSlotInactive(10 * time.Second)
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot)

	p, err := harness.StartProc(f.ctx, "outboxd-gap", outboxdBin, []string{"run", "--postgres", f.dsn, "--slot", f.slot, "--broker", b.srv.URL(), "--http-addr", ""}, nil, f.logs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	wctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	if code, err := p.Wait(wctx); err != nil || code != 1 || !strings.Contains(p.Log(), `gap: replication slot "`+f.slot+`" does not exist, but outboxd has confirmed it up to LSN`) {
		t.Fatalf("outboxd after the slot was dropped: exit %d (%v), want 1 with the gap:\n%s", code, err, tail(p.Log(), 3000))
	}
	f.startRelay("--accept-gap")
	end = f.commit(ev(2, "k2"))
	f.waitConfirmed(end, 30*time.Second)
	f.checkDelivered(f.read(f.topic(), 2), 2)
}

// An application that reuses an event id within the duplicate window (the
// row deleted, as outbox rows often are, and the id inserted again) loses
// the second event on NATS: JetStream acks it as a duplicate. outboxd
// counts it (outboxd_nats_duplicates_total{kind="duplicate_id"}), logs it
// at warn with the id, and streams on: a later event arrives.
func TestNATSDuplicateIDCounted(t *testing.T) {
	b := &natsBroker{srv: harness.NATSForTest(t)}
	f := newFixture(t, b)
	r := f.startRelay()
	f.waitConfirmed(f.commit(ev(1, "k1")), 30*time.Second)
	f.exec(`DELETE FROM outbox WHERE id = $1`, eventID(1))
	f.waitConfirmed(f.commit(event{1, "k1", "E", `{"reused": true}`}), 30*time.Second)
	f.waitConfirmed(f.commit(ev(2, "k1")), 60*time.Second)
	msgs := f.read(f.topic(), 2)
	if len(msgs) != 2 || string(msgs[0].payload) != `{"n": 1}` || string(msgs[1].payload) != `{"n": 2}` {
		t.Fatalf("stream holds %d messages, want events 1 and 2 (the reused id dropped): %v", len(msgs), msgs)
	}
	const series = `outboxd_nats_duplicates_total{kind="duplicate_id"}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := harness.Metrics(f.ctx, r.http)
		if err == nil && m[series] == 1 {
			break
		}
		if err == nil && m[series] > 1 || time.Now().After(deadline) {
			t.Fatalf("%s = %v (%v), want 1", series, m[series], err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if log := r.Log(); strings.Count(log, "level=WARN msg=\"nats: JetStream dropped an event because another event with the same id") != 1 || !strings.Contains(log, "id="+eventID(1)) {
		t.Fatalf("want one warning naming %s:\n%s", eventID(1), tail(log, 4000))
	}
}
