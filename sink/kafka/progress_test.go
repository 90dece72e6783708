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
