package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeDB is the store without PostgreSQL: committed inbox rows, parked rows
// and effects, and a log of every operation in order.
type fakeDB struct {
	mu      sync.Mutex
	inbox   map[string]bool
	parked  map[string]string   // id -> error
	keys    map[string][]string // key -> its parked ids in order (ParkKey)
	starts  map[string]int      // id -> attempts a process started (countStarts); 0: started in a batch
	effects []string            // ids, in commit order
	ops     []string
	cur     *fakeTxn
	// failures injected: the next n commits fail (after or before applying).
	failCommit     int
	commitThenFail bool // the failing commit did commit (an ambiguous failure)
	down           bool // healthy() fails, as with a lost connection
}

type fakeTxn struct {
	db      *fakeDB
	claimed []string
	effects []string
	parked  map[string]string
	keys    map[string][]string
	cleared []string
}

func newFakeDB() *fakeDB {
	return &fakeDB{inbox: map[string]bool{}, parked: map[string]string{}, keys: map[string][]string{}, starts: map[string]int{}}
}

func (d *fakeDB) countStarts(_ context.Context, evs []*Event, individual bool) ([]int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]int, len(evs))
	for i, ev := range evs {
		n, seen := d.starts[ev.ID]
		switch {
		case individual:
			d.starts[ev.ID] = n + 1
			out[i] = n + 1
		case seen:
			out[i] = 1
		default:
			d.starts[ev.ID] = 0
		}
	}
	return out, nil
}

func (d *fakeDB) log(op string) { d.ops = append(d.ops, op) }

func (d *fakeDB) begin(context.Context) (txn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log("begin")
	d.cur = &fakeTxn{db: d, parked: map[string]string{}, keys: map[string][]string{}}
	return d.cur, nil
}

func (d *fakeDB) healthy(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return errors.New("connection refused")
	}
	return nil
}

// effect is what a test handler does: apply ev in the current transaction.
func (d *fakeDB) effect(ev *Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log("handle " + ev.ID)
	d.cur.effects = append(d.cur.effects, ev.ID)
}

func (t *fakeTxn) claim(_ context.Context, ev *Event, checkKey bool) (bool, bool, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	t.db.log("claim " + ev.ID)
	if t.db.inbox[ev.ID] || slices.Contains(t.claimed, ev.ID) {
		return false, false, nil
	}
	t.claimed = append(t.claimed, ev.ID)
	return true, checkKey && len(t.db.keys[string(ev.Key)])+len(t.keys[string(ev.Key)]) > 0, nil
}

func (t *fakeTxn) parkBehind(_ context.Context, ev *Event) (bool, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	k := string(ev.Key)
	if len(t.db.keys[k])+len(t.keys[k]) == 0 {
		return false, nil
	}
	t.db.log("park behind " + ev.ID)
	t.keys[k] = append(t.keys[k], ev.ID)
	t.parked[ev.ID] = "waiting behind"
	return true, nil
}

func (t *fakeTxn) park(_ context.Context, ev *Event, attempts int, cause error, key bool) error {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	t.db.log(fmt.Sprintf("park %s after %d", ev.ID, attempts))
	t.parked[ev.ID] = cause.Error()
	if key {
		t.keys[string(ev.Key)] = append(t.keys[string(ev.Key)], ev.ID)
	}
	return nil
}

func (t *fakeTxn) clearStarts(_ context.Context, evs []*Event) error {
	for _, ev := range evs {
		t.cleared = append(t.cleared, ev.ID)
	}
	return nil
}

func (t *fakeTxn) tx() pgx.Tx { return nil }

func (t *fakeTxn) commit(context.Context) error {
	d := t.db
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failCommit > 0 {
		d.failCommit--
		if !d.commitThenFail {
			d.log("commit failed")
			return errors.New("connection reset")
		}
		d.log("commit failed after committing")
	} else {
		d.log("commit")
	}
	for _, id := range t.claimed {
		d.inbox[id] = true
	}
	d.effects = append(d.effects, t.effects...)
	for id, e := range t.parked {
		d.parked[id] = e
	}
	for k, ids := range t.keys {
		d.keys[k] = append(d.keys[k], ids...)
	}
	for _, id := range t.cleared {
		delete(d.starts, id)
	}
	if d.failCommit >= 0 && d.commitThenFail && d.ops[len(d.ops)-1] == "commit failed after committing" {
		return errors.New("connection reset during commit")
	}
	return nil
}

func (t *fakeTxn) rollback(context.Context) error {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	t.db.log("rollback")
	return nil
}

func (d *fakeDB) snapshot() (ops, effects []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.ops), slices.Clone(d.effects)
}

type harness struct {
	db    *fakeDB
	p     *partition
	m     *metrics
	mu    sync.Mutex
	marks []int64
	logs  lockedBuffer // the partition's log, debug and up
}

// lockedBuffer is a bytes.Buffer the partition's goroutine writes while a
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (h *harness) marked() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.marks)
}

func newHarness(t *testing.T, s settings, handler func(db *fakeDB, ev *Event) error) *harness {
	t.Helper()
	h := &harness{db: newFakeDB()}
	m, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	if s.batch == 0 {
		s.batch = 1
	}
	if s.maxAttempts == 0 {
		s.maxAttempts = 3
	}
	if s.minBackoff == 0 {
		s.minBackoff, s.maxBackoff = 100*time.Millisecond, time.Second
	}
	s.name = "test"
	s.handler = func(ctx context.Context, tx pgx.Tx, ev *Event) error { return handler(h.db, ev) }
	mark := func(ev *Event) {
		h.db.mu.Lock()
		h.db.log(fmt.Sprintf("mark %d", ev.Offset))
		h.db.mu.Unlock()
		h.mu.Lock()
		h.marks = append(h.marks, ev.Offset)
		h.mu.Unlock()
	}
	log := slog.New(slog.NewTextHandler(&h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.p = newPartition("orders", 0, &s, h.db, mark, m.partition("test", "orders", 0), log)
	h.p.offsets = true
	return h
}

func events(ids ...string) []*Event {
	evs := make([]*Event, len(ids))
	for i, id := range ids {
		evs[i] = &Event{ID: id, Topic: "orders", Offset: int64(i)}
	}
	return evs
}

func apply(db *fakeDB, ev *Event) error { db.effect(ev); return nil }

// run pushes evs, runs the partition until every event is marked, stops it.
func (h *harness) run(t *testing.T, evs []*Event) {
	t.Helper()
	ctx := t.Context()
	go h.p.run(ctx)
	h.p.push(evs, int64(len(evs)))
	last := evs[len(evs)-1].Offset
	for {
		if m := h.marked(); len(m) > 0 && m[len(m)-1] == last {
			break
		}
		synctest.Wait()
		if m := h.marked(); len(m) > 0 && m[len(m)-1] == last {
			break
		}
		time.Sleep(time.Millisecond) // virtual time: lets backoff timers fire
	}
	h.p.stop()
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// The order that makes effects exactly once: inbox row, effect, commit, and
// only then the offset.
func TestOffsetMarkedOnlyAfterCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{}, apply)
		h.run(t, events("a", "b"))
		ops, effects := h.db.snapshot()
		want := []string{"begin", "claim a", "handle a", "commit", "mark 0", "begin", "claim b", "handle b", "commit", "mark 1"}
		if !slices.Equal(ops, want) {
			t.Fatalf("ops:\n got %q\nwant %q", ops, want)
		}
		if !slices.Equal(effects, []string{"a", "b"}) {
			t.Fatalf("effects %q", effects)
		}
		if got := counter(h.m.processed); got != 2 {
			t.Fatalf("processed %v, want 2", got)
		}
	})
}

// A failed commit is retried and the offset waits for it; a commit that
// happened but reported an error (the connection died on the way back) is
// caught by the inbox row on the retry: applied once, counted a duplicate.
func TestCommitFailureRetriedAndDeduped(t *testing.T) {
	for _, committed := range []bool{false, true} {
		t.Run(fmt.Sprint("committed=", committed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, settings{}, apply)
				h.db.failCommit, h.db.commitThenFail = 1, committed
				h.run(t, events("a"))
				ops, effects := h.db.snapshot()
				if !slices.Equal(effects, []string{"a"}) {
					t.Fatalf("effects %q, want [a] exactly once", effects)
				}
				if i := slices.Index(ops, "mark 0"); i < 0 || ops[i-1] != "commit" || slices.Contains(ops[:i], "mark 0") {
					t.Fatalf("the offset was marked before a successful commit: %q", ops)
				}
				wantDup := 0.0
				if committed {
					wantDup = 1
				}
				if got := counter(h.m.duplicates); got != wantDup {
					t.Fatalf("duplicates %v, want %v (ops %q)", got, wantDup, ops)
				}
				if got := counter(h.m.errors); got != 0 {
					t.Fatalf("a database error counted as a handler attempt: %v", got)
				}
			})
		})
	}
}

// A redelivered event (its inbox row exists) is skipped, counted, and its
// offset still moves on.
func TestDuplicateSkipped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{}, apply)
		h.db.inbox["a"] = true
		h.run(t, events("a", "b"))
		ops, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"b"}) {
			t.Fatalf("effects %q, want [b]", effects)
		}
		if slices.Contains(ops, "handle a") {
			t.Fatalf("handler ran for a duplicate: %q", ops)
		}
		if got := counter(h.m.duplicates); got != 1 {
			t.Fatalf("duplicates %v, want 1", got)
		}
		if !slices.Equal(h.marked(), []int64{0, 1}) {
			t.Fatalf("marks %v", h.marked())
		}
		// Issue 36 3.9: each duplicate is a debug line with its id, topic
		// and position, so that "why was my event not applied?" has an
		// answer in the log.
		logs := h.logs.String()
		want := `level=DEBUG msg="inbox: skipped an event already applied (its inbox row exists)" topic=orders partition=0 id=a offset=0`
		if !strings.Contains(logs, want) {
			t.Fatalf("no debug line for the duplicate; want %s in:\n%s", want, logs)
		}
		if strings.Contains(logs, "id=b") {
			t.Fatalf("the applied event b logged as a duplicate:\n%s", logs)
		}
	})
}

// A failing handler is retried with exponential backoff, then parked in one
// transaction with its inbox row; meanwhile the events behind it (other
// keys: these have none, so each is its own) are applied, and the offset
// moves past the failing event only once it is parked.
func TestPoisonRetriedThenParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var at []time.Duration
		start := time.Now()
		h := newHarness(t, settings{maxAttempts: 3}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "bad" {
				at = append(at, time.Since(start))
				return errors.New("account closed")
			}
			return apply(db, ev)
		})
		h.run(t, events("a", "bad", "c"))
		ops, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"a", "c"}) {
			t.Fatalf("effects %q", effects)
		}
		if want := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond}; !slices.Equal(at, want) {
			t.Fatalf("attempts at %v, want %v (backoff 100ms, 200ms)", at, want)
		}
		if h.db.parked["bad"] != "account closed" || !h.db.inbox["bad"] {
			t.Fatalf("parked %v inbox %v: want bad parked with its error and its inbox row", h.db.parked, h.db.inbox)
		}
		if !strings.Contains(strings.Join(ops, ","), "begin,claim bad,park bad after 3,commit,mark 2") {
			t.Fatalf("park not in one transaction with the inbox row before the mark: %q", ops)
		}
		if counter(h.m.parked) != 1 || counter(h.m.errors) != 3 || counter(h.m.processed) != 2 {
			t.Fatalf("parked %v errors %v processed %v, want 1 3 2", counter(h.m.parked), counter(h.m.errors), counter(h.m.processed))
		}
		if i, j := slices.Index(ops, "handle c"), slices.Index(ops, "park bad after 3"); i < 0 || i > j {
			t.Fatalf("c waited for bad's retries: %q", ops)
		}
		if !slices.Equal(h.marked(), []int64{0, 2}) {
			t.Fatalf("marks %v, want [0 2]: nothing past bad until it is parked", h.marked())
		}
	})
}

// Hold: nothing after the poison event is applied or marked while it fails;
// when it succeeds, the partition continues in order.
func TestPoisonHoldsPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fails := 6
		h := newHarness(t, settings{maxAttempts: 2, onPoison: Hold}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "bad" && fails > 0 {
				fails--
				return errors.New("downstream refuses")
			}
			return apply(db, ev)
		})
		go h.p.run(t.Context())
		h.p.push(events("a", "bad", "c"), 3)
		// 2 attempts (100ms), then held at MaxBackoff (1s).
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if _, effects := h.db.snapshot(); !slices.Equal(effects, []string{"a"}) {
			t.Fatalf("effects while held %q, want [a]", effects)
		}
		if got := counter(h.m.held); got != 1 {
			t.Fatalf("held gauge %v, want 1", got)
		}
		if !slices.Equal(h.marked(), []int64{0}) {
			t.Fatalf("marks while held %v, want [0]", h.marked())
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		h.p.stop()
		ops, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"a", "bad", "c"}) || len(h.db.parked) != 0 {
			t.Fatalf("effects %q parked %v, want a bad c in order and nothing parked (ops %q)", effects, h.db.parked, ops)
		}
		if got := counter(h.m.held); got != 0 {
			t.Fatalf("held gauge %v after the event succeeded, want 0", got)
		}
	})
}

// While the database is down, handler errors are an outage, not poison: no
// event is parked however long it lasts.
func TestOutageIsNotPoison(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing atomic.Bool
		failing.Store(true)
		h := newHarness(t, settings{maxAttempts: 2}, func(db *fakeDB, ev *Event) error {
			if failing.Load() {
				return errors.New("conn closed")
			}
			return apply(db, ev)
		})
		h.db.down = true
		go h.p.run(t.Context())
		h.p.push(events("a"), 1)
		time.Sleep(time.Minute)
		synctest.Wait()
		if len(h.db.parked) != 0 || counter(h.m.errors) != 0 {
			t.Fatalf("parked %v errors %v during an outage", h.db.parked, counter(h.m.errors))
		}
		h.db.mu.Lock()
		h.db.down = false
		h.db.mu.Unlock()
		failing.Store(false)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.p.stop()
		if _, effects := h.db.snapshot(); !slices.Equal(effects, []string{"a"}) {
			t.Fatalf("effects %q, want [a]", effects)
		}
	})
}

// A batch is one transaction; when one of its events fails, the batch rolls
// back and its events are applied one at a time: the good ones once, in
// order, the poison one parked.
func TestBatchFallsBackToSingleEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{batch: 10, maxAttempts: 1}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "bad" {
				return errors.New("no such account")
			}
			return apply(db, ev)
		})
		h.run(t, events("a", "b", "bad", "d"))
		ops, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"a", "b", "d"}) {
			t.Fatalf("effects %q, want a b d once each", effects)
		}
		if ops[0] != "begin" || ops[len(ops)-1] != "mark 3" || !slices.Contains(ops, "rollback") {
			t.Fatalf("ops %q", ops)
		}
		if !slices.Equal(h.marked(), []int64{0, 1, 2, 3}) {
			t.Fatalf("marks %v", h.marked())
		}
		if h.db.parked["bad"] == "" {
			t.Fatal("bad not parked")
		}
	})
}

// A whole batch commits in one transaction and marks once, at its end.
func TestBatchOneTransaction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{batch: 100}, apply)
		h.db.inbox["b"] = true
		h.run(t, events("a", "b", "c"))
		ops, _ := h.db.snapshot()
		want := []string{"begin", "claim a", "handle a", "claim b", "claim c", "handle c", "commit", "mark 2"}
		if !slices.Equal(ops, want) {
			t.Fatalf("ops:\n got %q\nwant %q", ops, want)
		}
	})
}

// A record without an id header cannot be deduplicated: parked, never
// applied, never skipped silently.
func TestNoIDIsParked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, settings{maxAttempts: 2}, apply)
		evs := events("", "b")
		h.run(t, evs)
		_, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"b"}) {
			t.Fatalf("effects %q", effects)
		}
		if !strings.Contains(h.db.parked["orders/0/0"], `no "id" header`) {
			t.Fatalf("parked %v", h.db.parked)
		}
	})
}

// stop lets the current event finish (effect, commit, mark) and applies
// nothing after it.
func TestStopFinishesCurrentEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		h := newHarness(t, settings{}, func(db *fakeDB, ev *Event) error {
			if ev.ID == "a" {
				close(entered)
				<-release
			}
			return apply(db, ev)
		})
		go h.p.run(t.Context())
		h.p.push(events("a", "b"), 2)
		<-entered
		stopped := make(chan struct{})
		go func() { h.p.stop(); close(stopped) }()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("stop returned while the handler was running")
		default:
		}
		close(release)
		<-stopped
		_, effects := h.db.snapshot()
		if !slices.Equal(effects, []string{"a"}) || !slices.Equal(h.marked(), []int64{0}) {
			t.Fatalf("effects %q marks %v, want [a] [0]", effects, h.marked())
		}
	})
}

// A fetch repeated after a pause does not queue an event twice.
func TestPushDropsRedeliveredOffsets(t *testing.T) {
	h := newHarness(t, settings{}, apply)
	h.p.push(events("a", "b"), 2)
	h.p.push(events("a", "b", "c"), 3)
	if got := len(h.p.pending); got != 3 {
		t.Fatalf("pending %d, want 3", got)
	}
}

func TestBackoff(t *testing.T) {
	got := []time.Duration{}
	for n := 1; n <= 6; n++ {
		got = append(got, backoff(100*time.Millisecond, time.Second, n))
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("backoff %v, want %v", got, want)
	}
}
