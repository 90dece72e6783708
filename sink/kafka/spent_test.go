package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// An instance whose Kafka transaction failed (here: fenced, because another
// instance took the slot over and registered the transactional id) must not
// register the id again by itself: franz-go's producer-id recovery
// (KIP-360/588: InitProducerID with the old id and epoch, run by the next
// Begin, produce or EndTransaction after a failure) bumps the epoch and
// fences whoever holds the slot now. kfake's coordinator accepts such a
// stale epoch, as the old active resumed from SIGSTOP met it in the fault
// suite (TestFaultsHA -mode exactly-once): the new active was fenced and
// exited 1. Only Reset, which the relay runs once START_REPLICATION holds
// the slot, registers the id.
func TestFailedTransactionDoesNotReRegisterTheID(t *testing.T) {
	c, a, b := oldAndNewActive(t)
	ctx := context.Background()
	// The takeover: b holds the slot now and registers the id.
	if err := b.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	// a resumes: its record and its commit fail, its session ends (abort),
	// and the relay's next session begins before it learns that the slot
	// is taken.
	if err := produceSync(a, &router.Record{Topic: "e", Value: []byte("a2"), Partition: -1}); err == nil {
		t.Fatal("a fenced producer's record was acked")
	}
	if err := a.Commit(ctx, sink.Checkpoint{LSN: 0x100}); err == nil {
		t.Fatal("a fenced producer committed")
	}
	a.Abort(ctx)
	if err := a.Begin(); err == nil {
		if err := produceSync(a, &router.Record{Topic: "e", Value: []byte("a3"), Partition: -1}); err == nil {
			t.Fatal("a fenced producer produced again")
		}
	}
	a.Abort(ctx)
	if err := a.Probe(ctx, &router.Record{Topic: "e", Value: []byte("a4"), Partition: -1}); err == nil {
		t.Fatal("a fenced producer's probe was accepted")
	}
	// b, the slot's holder, is not fenced.
	activeCommits(t, c, b, "after the old one failed")
	// Once a holds the slot again, Reset makes it usable (and fences b).
	if err := a.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	commitCheckpoint(t, a, sink.Checkpoint{LSN: 0x300})
}

// The same after a commit whose outcome is unknown (the broker went away
// during EndTxn; here it answers UNKNOWN_SERVER_ERROR, which franz-go
// treats alike): franz-go marks the producer id for reloading, and the
// abort that follows runs InitProducerID with the old id and epoch. If the
// standby that found this instance silent for --replication-timeout took
// the slot and registered the id in between (the control below holds the
// reload until it has), the reload fences the slot's holder.
func TestUnknownCommitOutcomeDoesNotReRegisterTheID(t *testing.T) {
	c, a, b := oldAndNewActive(t)
	ctx := context.Background()
	c.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		resp := req.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.UnknownServerError.Code
		return resp, nil, true
	})
	var reloads atomic.Int32
	reloading, aDone, resetDone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var resetErr error
	c.ControlKey(int16(kmsg.InitProducerID), func(req kmsg.Request) (kmsg.Response, error, bool) {
		if req.(*kmsg.InitProducerIDRequest).ProducerID < 0 {
			return nil, nil, false // b's registration
		}
		c.DropControl()
		reloads.Add(1)
		close(reloading)
		c.SleepControl(func() { <-resetDone })
		return nil, nil, false
	})
	go func() {
		select {
		case <-reloading:
		case <-aDone:
		}
		resetErr = b.Reset(ctx)
		close(resetDone)
	}()
	if err := a.Commit(ctx, sink.Checkpoint{LSN: 0x100}); err == nil {
		t.Fatal("commit with an unknown outcome succeeded")
	}
	a.Abort(ctx)
	if err := a.Begin(); err == nil {
		_ = produceSync(a, &router.Record{Topic: "e", Value: []byte("a2"), Partition: -1})
		a.Abort(ctx)
	}
	close(aDone)
	<-resetDone
	if resetErr != nil {
		t.Fatal(resetErr)
	}
	if n := reloads.Load(); n != 0 {
		t.Errorf("the failed producer ran InitProducerID with its old id %d times, want 0", n)
	}
	activeCommits(t, c, b, "after the old one's failed commit")
}

// oldAndNewActive are two instances of one slot sharing a transactional id
// on a new cluster: a, the old active, registered the id and has a
// transaction open with record a1 in it; b, the new one, uses the same
// checkpoints and has registered nothing yet.
func oldAndNewActive(t *testing.T) (c *kfake.Cluster, a, b *Sink) {
	t.Helper()
	c = newCluster(t)
	ctx := context.Background()
	cp := Checkpoints{Topic: "cp", Key: "1/slot"}
	txn := &Transactional{ID: "outboxd.1.slot", Timeout: 10 * time.Second}
	a = newSink(t, c, Config{Transactional: txn})
	if err := a.InitTransactions(ctx, cp); err != nil {
		t.Fatal(err)
	}
	if err := a.Begin(); err != nil {
		t.Fatal(err)
	}
	if err := produceSync(a, &router.Record{Topic: "e", Value: []byte("a1"), Partition: -1}); err != nil {
		t.Fatal(err)
	}
	b = newSink(t, c, Config{Transactional: txn})
	if err := b.UseCheckpoints(cp); err != nil {
		t.Fatal(err)
	}
	return c, a, b
}

// activeCommits checks that b, the slot's holder, is not fenced by what
// the old active did (when): it commits record b1 in a transaction of its
// own, the only one read_committed sees.
func activeCommits(t *testing.T, c *kfake.Cluster, b *Sink, when string) {
	t.Helper()
	ctx := context.Background()
	if err := b.Begin(); err != nil {
		t.Fatalf("the active's Begin %s: %v", when, err)
	}
	if err := produceSync(b, &router.Record{Topic: "e", Value: []byte("b1"), Partition: -1}); err != nil {
		t.Fatalf("the active's record %s: %v (kind %s)", when, err, sink.KindOf(err))
	}
	if err := b.Commit(ctx, sink.Checkpoint{LSN: 0x200}); err != nil {
		t.Fatalf("the active's commit %s: %v (kind %s)", when, err, sink.KindOf(err))
	}
	if got := readCommitted(t, c, "e"); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("read_committed sees %q, want [b1]", got)
	}
}
