package slot

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxd/outboxd/wal"
)

// Txn is one PostgreSQL transaction in flight through the sink.
type Txn struct {
	pending   int  // events handed to the sink and not yet acked
	committed bool // the Commit message has been seen
	failed    bool // an event was rejected: never confirm this transaction
	added     bool // at least one event was handed to the sink
	end       wal.LSN
	started   time.Time
	prev      *Txn
	next      *Txn
}

// Watermark tracks transactions in commit order and the sink acks of their
// events. It is safe for concurrent use: the stream reader calls Begin, Add and
// Commit; sink callbacks call Ack from their own goroutines.
type Watermark struct {
	mu         sync.Mutex
	head, tail *Txn          // oldest and newest unconfirmed transactions
	confirmed  atomic.Uint64 // a wal.LSN; read without the lock on the hot path
	published  atomic.Uint64 // a wal.LSN: the end of the last confirmed transaction with events (Idle does not move it)
	// In-flight events and bytes: written under mu, read without it by
	// InFlight, which the reader asks before every message it reads (a
	// lock there met the acks' lock at every message).
	events  atomic.Int64
	bytes   atomic.Int64
	waiting bool // a WaitBelow caller needs a wake-up when counts drop
	// changed is closed at the next change; nil until someone asks for it
	// (watch). Made lazily because the reader acks every event: a fresh
	// channel per advance was an allocation per event nobody waited on.
	changed chan struct{}
	// spare holds Txns that left the queue (confirmed, or folded into the
	// one before), linked by next, for Begin to reuse: at one event per
	// transaction a new Txn was one allocation per event. Nothing holds a
	// Txn once it left: its events are all acked and the reader has seen
	// its Commit.
	spare  *Txn
	spares int
}

// maxSpareTxns bounds the spare Txns: what one produce response confirms
// at once at one event per transaction, about.
const maxSpareTxns = 4096

// NewWatermark starts at the slot's confirmed position.
func NewWatermark(start wal.LSN) *Watermark {
	w := &Watermark{}
	w.confirmed.Store(uint64(start))
	return w
}

// Begin opens the next transaction. Transactions must be begun in stream order.
func (w *Watermark) Begin(now time.Time) *Txn {
	w.mu.Lock()
	t := w.spare
	if t != nil {
		w.spare, w.spares = t.next, w.spares-1
		*t = Txn{started: now}
	} else {
		t = &Txn{started: now}
	}
	if w.tail == nil {
		w.head = t
	} else {
		w.tail.next = t
		t.prev = w.tail
	}
	w.tail = t
	w.mu.Unlock()
	return t
}

// Add records one event of size bytes handed to the sink for t.
func (w *Watermark) Add(t *Txn, size int) {
	w.mu.Lock()
	t.pending++
	t.added = true
	w.events.Add(1)
	w.bytes.Add(int64(size))
	w.mu.Unlock()
}

// Ack records the outcome of one event of t: ok means the sink durably holds
// it. A failed event still leaves the in-flight counts, but its transaction
// is never confirmed, so the slot keeps it for the next session.
func (w *Watermark) Ack(t *Txn, size int, ok bool) {
	w.mu.Lock()
	t.pending--
	t.failed = t.failed || !ok
	w.events.Add(-1)
	w.bytes.Add(-int64(size))
	w.advance()
	if w.waiting {
		w.waiting = false
		w.notify()
	}
	w.mu.Unlock()
}

// Commit closes t at the transaction's end LSN.
//
// A transaction without events that is not the oldest is folded into the one
// before it: that one's end moves to t's, which confirms nothing earlier than
// before and keeps the queue bounded by the transactions that carry events.
// PostgreSQL sends a Begin/Commit pair for every transaction of the database,
// so without the fold a long Kafka outage would queue one entry per
// transaction written anywhere.
func (w *Watermark) Commit(t *Txn, end wal.LSN) {
	w.mu.Lock()
	if !t.added && t.prev != nil {
		prev := t.prev
		prev.end = max(prev.end, end)
		prev.next = t.next
		if t.next != nil {
			t.next.prev = prev
		} else {
			w.tail = prev
		}
		t.prev, t.next = nil, nil
		w.recycle(t)
	} else {
		t.committed = true
		t.end = max(t.end, end)
	}
	w.advance()
	w.mu.Unlock()
}

// Idle tells the watermark that the server has decoded everything before
// walEnd (a keepalive). With no transaction open or unacked, nothing before
// walEnd can still need delivery, so the slot may move there: this is what
// keeps an idle outbox from pinning WAL while other tables write.
func (w *Watermark) Idle(walEnd wal.LSN) {
	w.mu.Lock()
	if w.head == nil && uint64(walEnd) > w.confirmed.Load() {
		w.confirmed.Store(uint64(walEnd))
		w.notify()
	}
	w.mu.Unlock()
}

// advance pops fully acked, committed transactions off the head. Called with mu held.
func (w *Watermark) advance() {
	moved := false
	for t := w.head; t != nil && t.committed && t.pending == 0 && !t.failed; t = w.head {
		if uint64(t.end) > w.confirmed.Load() {
			w.confirmed.Store(uint64(t.end))
		}
		if t.added && uint64(t.end) > w.published.Load() {
			w.published.Store(uint64(t.end))
		}
		w.head = t.next
		if w.head == nil {
			w.tail = nil
		} else {
			w.head.prev = nil
		}
		w.recycle(t)
		moved = true
	}
	if moved || w.events.Load() == 0 {
		w.notify()
	}
}

// recycle keeps t, which left the queue, for Begin. Called with mu held.
func (w *Watermark) recycle(t *Txn) {
	if w.spares < maxSpareTxns {
		*t = Txn{next: w.spare}
		w.spare = t
		w.spares++
	}
}

// notify closes the channel handed out since the last change, if any.
// Called with mu held.
func (w *Watermark) notify() {
	if w.changed != nil {
		close(w.changed)
		w.changed = nil
	}
}

// watch returns the channel the next notify closes. Called with mu held.
func (w *Watermark) watch() chan struct{} {
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.changed
}

// Confirmed is the LSN that may be sent as the flush position.
func (w *Watermark) Confirmed() wal.LSN { return wal.LSN(w.confirmed.Load()) }

// Published is the end LSN of the last confirmed transaction that carried
// events (0: none this session). Unlike Confirmed, keepalives (Idle) do not
// move it: it is what the gap check compares with a server's WAL, since a
// keepalive's position may not survive a crash of the server while a
// decoded commit always does.
func (w *Watermark) Published() wal.LSN { return wal.LSN(w.published.Load()) }

// Stats is a snapshot for metrics and status.
type Stats struct {
	Confirmed      wal.LSN
	InflightEvents int
	InflightBytes  int64
	OpenTxns       int
	OldestUnacked  time.Time // zero when nothing is in flight
}

// Stats returns a consistent snapshot.
func (w *Watermark) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Stats{Confirmed: w.Confirmed(), InflightEvents: int(w.events.Load()), InflightBytes: w.bytes.Load()}
	for t := w.head; t != nil; t = t.next {
		s.OpenTxns++
	}
	if w.head != nil {
		s.OldestUnacked = w.head.started
	}
	return s
}

// WaitBelow blocks until fewer than maxEvents events and maxBytes bytes are in
// flight, or ctx ends. It is how the reader applies back-pressure: a full sink
// pauses reading instead of growing memory.
func (w *Watermark) WaitBelow(ctx context.Context, maxEvents int, maxBytes int64) error {
	for {
		w.mu.Lock()
		ok := w.events.Load() < int64(maxEvents) && w.bytes.Load() < maxBytes
		var ch chan struct{}
		if !ok {
			w.waiting = true
			ch = w.watch()
		}
		w.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Changed returns a channel closed at the next change of the confirmed LSN or
// of the in-flight counts reaching zero.
func (w *Watermark) Changed() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.watch()
}

// Drained reports whether no event is in flight and, if some are, returns
// the channel closed at the next change (nil when drained). Both come from
// one critical section: checking and then asking for the channel separately
// can miss the last ack between the two and wait forever.
func (w *Watermark) Drained() (bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.events.Load() == 0 {
		return true, nil
	}
	return false, w.watch()
}

// InFlight returns the events and bytes handed to the sink and not yet
// acked, without taking the lock: each is exact, the pair may straddle an
// Add or Ack (a bound checked with them is off by one event at most).
func (w *Watermark) InFlight() (events int, bytes int64) {
	return int(w.events.Load()), w.bytes.Load()
}
