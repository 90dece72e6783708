package outboxd

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxd/outboxd/sink"
)

// Issue 26 item 12: SIGTERM while a topic is held, with nothing else in
// flight, stops within a second or so of the last ack, not after the whole
// --shutdown-timeout; nothing past the held event is confirmed.
func TestShutdownDoesNotWaitForHeldTopics(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.ShutdownTimeout = 30 * time.Second })
	h.relay.state.setTopicHold("outbox.event.Order", errors.New(`kafka topic "outbox.event.Order" is missing`))
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1) // handed to the sink, which holds it: never acked
	start := time.Now()
	h.cancel()
	h.loopErr(10 * time.Second)
	h.s.finish(canceled, true)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown took %s with only a held topic's event in flight", took)
	}
	h.neverSentAbove(100)
}

// Without a held topic the shutdown waits for the acks as before, up to
// --shutdown-timeout.
func TestShutdownWaitsForAcksWithoutHolds(t *testing.T) {
	h := newHarness(t, 100, func(c *Config) { c.ShutdownTimeout = 1500 * time.Millisecond })
	h.start()
	h.stream.push(txn(200, 210, uuid(1))...)
	h.sink.waitProduced(t, 1)
	start := time.Now()
	h.cancel()
	h.loopErr(10 * time.Second)
	h.s.finish(canceled, true)
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("shutdown returned after %s, before --shutdown-timeout, with an event in flight and no hold", took)
	}
	h.neverSentAbove(100)
}

var canceled = func() context.Context { ctx, cancel := context.WithCancel(context.Background()); cancel(); return ctx }()

// blockingTxnSink is a transactional sink whose Commit waits, as Kafka's
// does for a record of a held topic, until its context ends.
type blockingTxnSink struct {
	fakeTxnSink
	mu             sync.Mutex
	commits, abort int
}

func (b *blockingTxnSink) Commit(ctx context.Context, _ sink.Checkpoint) error {
	b.mu.Lock()
	b.commits++
	b.mu.Unlock()
	<-ctx.Done()
	return ctx.Err()
}

func (b *blockingTxnSink) Abort(ctx context.Context) {
	b.mu.Lock()
	b.abort++
	b.mu.Unlock()
}

// Issue 26 item 12 in exactly-once mode: SIGTERM between transactions while
// the open Kafka transaction holds an event of a held topic does not wait
// for a final commit that cannot succeed (the held record is never sent, so
// the commit would only time out, eosCommitTimeout later): it aborts the
// transaction and stops; nothing past the last committed transaction is
// confirmed.
func TestExactlyOnceShutdownAbortsWithHeldTopics(t *testing.T) {
	ts := &blockingTxnSink{}
	h := newHarness(t, 100, func(c *Config) { c.ShutdownTimeout = 30 * time.Second })
	e := &eos{sink: ts, wm: h.s.wm, splitAge: time.Minute}
	h.s.commit = e
	h.relay.state.setTopicHold("outbox.event.Order", errors.New(`kafka topic "outbox.event.Order" is missing`))
	// A whole PostgreSQL transaction waits in the open Kafka one (its event
	// handed to the sink, which holds it), as between a COMMIT and the
	// next quiet tick.
	e.open = true
	e.txns = append(e.txns, h.s.wm.Begin(time.Now()))
	e.ends = append(e.ends, sink.Checkpoint{LSN: 210})
	start := time.Now()
	h.s.finish(canceled, true)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("shutdown took %s with only a held topic's event in the open Kafka transaction", took)
	}
	ts.mu.Lock()
	commits, aborts := ts.commits, ts.abort
	ts.mu.Unlock()
	if commits != 0 || aborts != 1 {
		t.Fatalf("%d commits and %d aborts, want 0 and 1", commits, aborts)
	}
	if e.open {
		t.Fatal("the Kafka transaction is still open")
	}
	h.neverSentAbove(100)
}

// Without a held topic the exactly-once shutdown still commits what is
// complete.
func TestExactlyOnceShutdownCommitsWithoutHolds(t *testing.T) {
	ts := &fakeTxnSink{}
	h := newHarness(t, 100, nil)
	e := &eos{sink: ts, wm: h.s.wm, splitAge: time.Minute}
	h.s.commit = e
	e.open = true
	e.txns = append(e.txns, h.s.wm.Begin(time.Now()))
	e.ends = append(e.ends, sink.Checkpoint{LSN: 210})
	h.s.finish(canceled, true)
	if cps := ts.checkpoints(); len(cps) != 1 || cps[0] != (sink.Checkpoint{LSN: 210}) {
		t.Fatalf("checkpoints %v, want one at 210", cps)
	}
}
