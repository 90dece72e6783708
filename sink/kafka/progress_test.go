package kafka

import (
	"context"
	"testing"
	"time"
)

// The progress record round-trips through its compacted topic: none before
// the first write, then the latest value for the slot's key.
func TestProgressStoreRoundTrip(t *testing.T) {
	c := newCluster(t)
	sk := newSink(t, c, Config{})
	ps := ProgressStore{Sink: sk, Progress: Progress{Topic: "outboxd.progress", Key: "s1"}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ps.EnsureProgressTopic(ctx); err != nil {
		t.Fatal(err)
	}
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
