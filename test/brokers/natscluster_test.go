package brokers

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink/nats"
	"github.com/outboxd/outboxd/test/harness"
)

// natsClusterBroker is a 3-node JetStream cluster on 127.0.0.1; outboxd
// knows every node (--broker nats://a,nats://b,nats://c) and creates its
// streams with 3 replicas. "The broker" that stop, kill and start act on
// is the leader of the test's stream at the time of the stop or kill.
type natsClusterBroker struct {
	c     *harness.NATSCluster
	topic string

	mu   sync.Mutex
	down *harness.NATS // the node stop or kill took down
}

func (b *natsClusterBroker) flags() []string {
	return []string{"--broker", b.c.URL(), "--nats-stream-replicas", "3"}
}

func (b *natsClusterBroker) read(ctx context.Context, topic string, want int) ([]message, error) {
	return readNATS(ctx, b.c.URL(), topic, want)
}

// leader takes the test stream's leader down with halt.
func (b *natsClusterBroker) leader(ctx context.Context, halt func(*harness.NATS) error) error {
	n, err := b.c.StreamLeader(ctx, nats.StreamName(b.topic))
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.down = n
	b.mu.Unlock()
	return halt(n)
}

func (b *natsClusterBroker) stop(ctx context.Context) error {
	return b.leader(ctx, (*harness.NATS).Stop)
}

func (b *natsClusterBroker) kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return b.leader(ctx, (*harness.NATS).Kill)
}

func (b *natsClusterBroker) start(ctx context.Context) error {
	b.mu.Lock()
	n := b.down
	b.down = nil
	b.mu.Unlock()
	if n == nil {
		return errors.New("no node is down")
	}
	return n.Start(ctx)
}

func (b *natsClusterBroker) dedups() bool { return true }

func (b *natsClusterBroker) downNode() *harness.NATS {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.down
}

// The e2e core's routing test on a 3-node cluster with R3 streams.
func TestNATSClusterRouting(t *testing.T) {
	b := &natsClusterBroker{c: harness.NATSClusterForTest(t, 3)}
	f := newFixture(t, b)
	b.topic = f.topic()
	testRouting(t, f)
	checkReplicas(t, f, b)
	f.checkDurabilityWarnings() // R3 streams: none
}

// SIGKILL of the stream's leader node under load: the stream elects a new
// leader among the two others and outboxd publishes on. Every event
// arrives, in commit order per aggregate, once (JetStream's duplicate
// window is replicated with the stream), and the slot is confirmed past
// the last commit while the killed node is still down.
func TestNATSClusterLeaderKill(t *testing.T) {
	b := &natsClusterBroker{c: harness.NATSClusterForTest(t, 3)}
	f := newFixture(t, b)
	b.topic = f.topic()
	f.startRelay()
	const total = 3000
	done := f.writeInBackground(total)
	if _, err := b.read(f.ctx, f.topic(), 300); err != nil { // events flow
		t.Fatal(err)
	}
	if err := b.kill(); err != nil {
		t.Fatal(err)
	}
	killed := b.downNode()
	t.Logf("killed the stream leader %s", killed.Name())
	end := <-done
	if end == 0 {
		t.FailNow()
	}
	f.waitConfirmed(end, 90*time.Second)
	n, err := b.c.StreamLeader(f.ctx, nats.StreamName(f.topic()))
	if err != nil {
		t.Fatal(err)
	}
	if n == killed {
		t.Fatalf("%s leads the stream while it is down", n.Name())
	}
	f.checkDelivered(f.read(f.topic(), total), total)
	if err := b.start(f.ctx); err != nil {
		t.Fatal(err)
	}
	checkReplicas(t, f, b)
}

// checkReplicas: outboxd created the test's stream with 3 replicas.
func checkReplicas(t *testing.T, f *fixture, b *natsClusterBroker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(f.ctx, 10*time.Second)
	defer cancel()
	got, err := harness.NATSStreamReplicas(ctx, b.c.URL(), nats.StreamName(f.topic()))
	if err != nil {
		t.Fatal(err)
	}
	if got != 3 {
		t.Fatalf("stream %s has %d replicas, want 3", nats.StreamName(f.topic()), got)
	}
}
