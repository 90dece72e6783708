package kafka

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// A probe whose abort fails (the coordinator answers the EndTxn with an
// error) must not leave the producer stuck inside the transaction: the next
// probe succeeds, so a hold ends once Kafka accepts the event, the failed
// probe's record never becomes visible, and the transactions after it
// commit (issue 22, item 8: a hold that never ends when a probe's abort
// failed).
func TestProbeAfterAFailedAbort(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Transactional: &Transactional{ID: "outboxd.probeabort", Timeout: 10 * time.Second}})
	ctx := context.Background()
	if err := s.InitTransactions(ctx, Checkpoints{Topic: "cp", Key: "slot"}); err != nil {
		t.Fatal(err)
	}
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, Err: kerr.UnknownServerError, TopLevel: true})
	defer h.Remove()
	if err := s.Probe(ctx, &router.Record{Topic: "e", Value: []byte("probe-1"), Partition: -1}); err != nil {
		t.Fatalf("first probe: %v", err)
	}
	if h.Hits() != 1 {
		t.Fatalf("the fault answered %d EndTxn requests, want 1 (the probe's abort)", h.Hits())
	}
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Probe(pctx, &router.Record{Topic: "e", Value: []byte("probe-2"), Partition: -1}); err != nil {
		t.Fatalf("the probe after a failed abort: %v (kind %s); a hold would never end", err, sink.KindOf(err))
	}
	if err := s.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(s, &router.Record{Topic: "e", Value: []byte("event"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, sink.Checkpoint{LSN: 10}); err != nil {
		t.Fatal(err)
	}
	if got := readCommitted(t, c, "e"); strings.Join(got, ",") != "event" {
		t.Fatalf("read_committed sees %q, want only the committed event", got)
	}
}
