package kafka

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// newProgressStore is slot s1's record on a fresh kfake, its topic created.
func newProgressStore(t *testing.T) (*kfake.Cluster, ProgressStore, context.Context) {
	t.Helper()
	c := newCluster(t)
	ps := ProgressStore{Sink: newSink(t, c, Config{}), Progress: Progress{Topic: "outboxd.progress", Key: "s1"}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	if err := ps.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	return c, ps, ctx
}

// The progress record round-trips through its compacted topic: none before
// the first write, then the latest value for the slot's key.
func TestProgressStoreRoundTrip(t *testing.T) {
	_, ps, ctx := newProgressStore(t)
	if err := ps.EnsureProgressTopic(ctx); err != nil {
		t.Fatalf("second ensure: %v", err)
	}
	if v, err := ps.LoadProgress(ctx); err != nil || v != nil {
		t.Fatalf("before any write: %q, %v", v, err)
	}
	for _, v := range []string{`{"confirmed_lsn":"0/1"}`, `{"confirmed_lsn":"0/2"}`} {
		if err := ps.WriteProgress(ctx, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if v, err := ps.LoadProgress(ctx); err != nil || string(v) != `{"confirmed_lsn":"0/2"}` {
		t.Fatalf("after two writes: %q, %v", v, err)
	}
	if s := ps.String(); s != "topic outboxd.progress, key s1" {
		t.Fatalf("String() = %q", s)
	}
}

// The key carries the system identifier; the old slot-only key's record is
// still readable (once, for an upgrade) and a write never goes there.
func TestProgressStoreLegacyKey(t *testing.T) {
	c := newCluster(t)
	sk := newSink(t, c, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	old := ProgressStore{Sink: sk, Progress: Progress{Topic: "outboxd.progress", Key: "s1"}}
	if err := old.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
	if err := old.WriteProgress(ctx, []byte(`{"confirmed_lsn":"0/7"}`)); err != nil {
		t.Fatal(err)
	}
	ps := ProgressStore{Sink: sk, Progress: Progress{Topic: "outboxd.progress", Key: "7321/s1", Legacy: "s1"}}
	if v, err := ps.LoadProgress(ctx); err != nil || v != nil {
		t.Fatalf("new key before any write: %q, %v", v, err)
	}
	if v, err := ps.LoadLegacyProgress(ctx); err != nil || string(v) != `{"confirmed_lsn":"0/7"}` {
		t.Fatalf("old key: %q, %v", v, err)
	}
	if err := ps.WriteProgress(ctx, []byte(`{"confirmed_lsn":"0/8"}`)); err != nil {
		t.Fatal(err)
	}
	if v, err := ps.LoadProgress(ctx); err != nil || string(v) != `{"confirmed_lsn":"0/8"}` {
		t.Fatalf("new key: %q, %v", v, err)
	}
	if v, err := old.LoadProgress(ctx); err != nil || string(v) != `{"confirmed_lsn":"0/7"}` {
		t.Fatalf("the old key was written: %q, %v", v, err)
	}
	if v, err := (ProgressStore{Sink: sk, Progress: Progress{Topic: "outboxd.progress", Key: "x"}}).LoadLegacyProgress(ctx); err != nil || v != nil {
		t.Fatalf("no legacy key: %q, %v", v, err)
	}
}

// A progress write abandoned while its record waits in the producer (the
// writer goroutine's, when shutdown cancels it) must not fail the next
// write behind it: franz-go fails every record buffered behind a first one
// whose context ended, and the session's final write comes right after on
// the same partition. It did: the final confirmation stayed behind the old
// record and the next start published an event again (TestGapAnotherCluster,
// whose writer's first record waited for the progress topic's metadata).
func TestProgressWriteAbandonedDoesNotFailTheNext(t *testing.T) {
	c, ps, ctx := newProgressStore(t)
	sk := ps.Sink
	// The broker holds the producer's first metadata request, so the
	// records wait in the producer, unsent.
	held, release := make(chan struct{}), make(chan struct{})
	var fired atomic.Bool
	c.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if fired.Swap(true) {
			return nil, nil, false
		}
		close(held)
		c.SleepControl(func() { <-release })
		return nil, nil, false
	})
	write := func(ctx context.Context, v string) <-chan error {
		done := make(chan error, 1)
		go func() { done <- ps.WriteProgress(ctx, []byte(v)) }()
		return done
	}
	// b waits for the metadata, c behind it; then b's writer gives up.
	bctx, bcancel := context.WithCancel(ctx)
	b := write(bctx, "b")
	<-held
	c2 := write(ctx, "c")
	for sk.cl().BufferedProduceRecords() != 2 {
		select {
		case err := <-c2:
			t.Fatalf("the write behind b ended before the broker answered: %v", err)
		default:
		}
		time.Sleep(time.Millisecond) // polling the producer's count
	}
	bcancel()
	if err := <-b; err == nil {
		t.Fatal("the abandoned write returned no error")
	}
	close(release)
	if err := <-c2; err != nil {
		t.Fatalf("the write after an abandoned one failed: %v", err)
	}
	if v, err := ps.LoadProgress(ctx); err != nil || string(v) != "c" {
		t.Fatalf("record %q, %v; want c", v, err)
	}
}
