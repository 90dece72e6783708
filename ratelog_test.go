package outboxd

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/wal"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Issue 26 item 11: an UPDATE of 1,000 outbox rows is one warning line with
// the count, not 1,000 lines; the metric counts every row.
func TestSkippedUpdatesLoggedOnceWithACount(t *testing.T) {
	h := newHarness(t, 100, nil)
	var logs syncBuffer
	h.relay.log = slog.New(slog.NewTextHandler(&logs, nil))
	h.s.log = h.relay.log
	h.start()
	msgs := []*wal.Msg{{Kind: wal.KindBegin, Begin: wal.Begin{FinalLSN: 200, CommitTime: time.Now(), Xid: 200}}}
	for i := 0; i < 1000; i++ {
		msgs = append(msgs, &wal.Msg{Kind: wal.KindUpdate, Row: wal.Row{Relation: outboxRel, Values: []wal.Value{
			text(uuid(i)), text("Order"), text("order-1"), text("Created"), text(`{"n":1}`)}}})
	}
	msgs = append(msgs, &wal.Msg{Kind: wal.KindCommit, Commit: wal.Commit{CommitLSN: 200, EndLSN: 210}})
	h.stream.push(msgs...)
	h.waitSent(210)
	if got := testutil.ToFloat64(h.relay.m.skipped.WithLabelValues("update")); got != 1000 {
		t.Fatalf("outboxd_events_skipped_total{reason=update} = %v, want 1000", got)
	}
	if n := strings.Count(logs.String(), "skipped UPDATE"); n != 1 {
		t.Fatalf("%d skipped-UPDATE lines, want 1:\n%s", n, logs.String())
	}

	// A minute later the next line carries the count held back meanwhile.
	r := rateLog{every: time.Minute}
	t0 := time.Unix(0, 0)
	for i, want := range []struct {
		at   time.Duration
		ok   bool
		held int
	}{{0, true, 0}, {time.Second, false, 0}, {30 * time.Second, false, 0}, {61 * time.Second, true, 2}, {62 * time.Second, false, 0}, {3 * time.Minute, true, 1}} {
		ok, held := r.allow(t0.Add(want.at))
		if ok != want.ok || held != want.held {
			t.Errorf("call %d at %s: (%v, %d), want (%v, %d)", i, want.at, ok, held, want.ok, want.held)
		}
	}
}
