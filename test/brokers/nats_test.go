package brokers

import (
	"context"
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
	raw, err := harness.ReadStream(ctx, b.srv.URL(), nats.StreamName(topic), want)
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
	before := f.walLSN()
	f.commit(ev(1, "k1"))
	end := f.commit(ev(2, "k2"))
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if s := f.slotState(); s.ConfirmedFlushLSN > before {
			t.Fatalf("confirmed_flush_lsn passed an event without a stream: %s > %s", harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(before))
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc, err := natsgo.Connect(b.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(f.ctx, jetstream.StreamConfig{Name: nats.StreamName(f.topic()), Subjects: []string{f.topic()}}); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 60*time.Second)
	f.checkDelivered(f.read(f.topic(), 2), 2)
}
