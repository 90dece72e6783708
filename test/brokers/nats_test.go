package brokers

import (
	"context"
	"testing"

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
