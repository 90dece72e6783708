package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// store is the database seam: the pgx implementation is store.go, the unit
// tests use a fake.
type store interface {
	begin(ctx context.Context) (txn, error)
	// healthy reports whether the database answers: a handler error while
	// it does not is an outage, not a poison event.
	healthy(ctx context.Context) error
}

// txn is one database transaction.
type txn interface {
	// claim inserts ev's inbox row; false means it was already there (the
	// effect was applied before).
	claim(ctx context.Context, ev *Event) (bool, error)
	// park records a poison event in inbox_parked.
	park(ctx context.Context, ev *Event, attempts int, cause error) error
	tx() pgx.Tx
	commit(ctx context.Context) error
	rollback(ctx context.Context) error
}

// settings are the parts of Config a partition reads.
type settings struct {
	name        string
	handler     Handler
	batch       int
	maxAttempts int
	minBackoff  time.Duration
	maxBackoff  time.Duration
	onPoison    Poison
	// deadLetter, if set, sends a poison event to the dead-letter topic.
	deadLetter func(ctx context.Context, ev *Event, attempts int, cause error) error
}

// errStopped ends a partition's work on an event it has not applied: the
// partition was revoked or the consumer is stopping, and whoever is assigned
// the partition next replays it from the committed offset.
var errStopped = errors.New("partition stopped")

// errNoID is the handler error of a record without an id header: it cannot be
// deduplicated, so it is poison (never applied without its inbox row).
var errNoID = errors.New(`the record has no "id" header: it cannot be deduplicated (is it from outboxd?)`)

// partition applies one topic partition's events in order. Its goroutine
// (run) is owned by the Consumer, which starts it on assignment and stops it
// on revocation with stop, which returns once the current batch is finished
// and marked.
type partition struct {
	topic string
	part  int32
	s     *settings
	db    store
	// mark is called with the last event of each batch after its database
	// commit, never before: the offset committer.
	mark func(*Event)
	// pause/resume stop and restart fetching of the partition while the
	// worker has a backlog past highWater (nil in unit tests).
	pause, resume func()
	// offsets: drop pushed events below next (a repeated Kafka fetch).
	offsets bool
	m       *partitionMetrics
	log     *slog.Logger

	quit chan struct{} // closed by stop: finish the batch, then return
	done chan struct{} // closed when run returns

	mu      sync.Mutex
	pending []*Event
	next    int64 // offset after the last event queued; older ones are re-deliveries
	paused  bool
	stopped bool // set by stop: push ignores a partition that is gone
	notify  chan struct{}
	hwm     int64
}

func newPartition(topic string, part int32, s *settings, db store, mark func(*Event), m *partitionMetrics, log *slog.Logger) *partition {
	return &partition{
		topic: topic, part: part, s: s, db: db, mark: mark, m: m,
		log:    log.With("topic", topic, "partition", part),
		quit:   make(chan struct{}),
		done:   make(chan struct{}),
		notify: make(chan struct{}, 1),
		next:   -1,
	}
}

// push queues fetched events; the poll loop calls it. hwm is the partition's
// high watermark from the fetch, for the lag gauge.
func (p *partition) push(evs []*Event, hwm int64) {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	for _, ev := range evs {
		if p.offsets && ev.Offset < p.next {
			continue // already queued: a fetch repeated after a pause
		}
		p.pending = append(p.pending, ev)
		p.next = ev.Offset + 1
	}
	if hwm > p.hwm {
		p.hwm = hwm
	}
	if len(p.pending) >= p.highWater() && !p.paused && p.pause != nil {
		p.pause()
		p.paused = true
	}
	p.mu.Unlock()
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// take removes up to the batch size from the queue, resuming fetches once the
// backlog is down to half the high water mark.
func (p *partition) take() []*Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := min(len(p.pending), p.s.batch)
	batch := p.pending[:n:n]
	p.pending = p.pending[n:]
	if len(p.pending) == 0 {
		p.pending = nil
	}
	if p.paused && p.resume != nil && len(p.pending) <= p.highWater()/2 {
		p.resume()
		p.paused = false
	}
	return batch
}

// highWater is the backlog at which fetching of the partition pauses; it
// resumes at half of it. Pausing on every fetch would make a partition with a
// backlog wait, after each resume, for the broker's long poll of the idle
// partitions (franz-go adds a resumed partition to the next fetch, up to
// FetchMaxWait later); the hysteresis keeps half a backlog to work on
// meanwhile, and bounds the memory of a slow partition.
func (p *partition) highWater() int { return max(512, 4*p.s.batch) }

// stop asks run to return after its current batch and waits until it has.
func (p *partition) stop() {
	select {
	case <-p.quit:
	default:
		close(p.quit)
	}
	<-p.done
	p.mu.Lock()
	p.stopped = true
	if p.paused && p.resume != nil {
		// Leave no pause behind for a later owner of the partition.
		p.resume()
		p.paused = false
	}
	p.mu.Unlock()
}

func (p *partition) stopping() bool {
	select {
	case <-p.quit:
		return true
	default:
		return false
	}
}

// run applies batches until stop. ctx is cancelled only when the work must
// end without finishing (the partition was lost, or the shutdown timeout
// passed).
func (p *partition) run(ctx context.Context) {
	defer close(p.done)
	for {
		if p.stopping() {
			return
		}
		if batch := p.take(); len(batch) > 0 {
			if err := p.apply(ctx, batch); err != nil {
				return
			}
			p.updateLag(batch[len(batch)-1])
			continue
		}
		select {
		case <-p.quit:
			return
		case <-ctx.Done():
			return
		case <-p.notify:
		}
	}
}

func (p *partition) updateLag(last *Event) {
	p.mu.Lock()
	hwm := p.hwm
	p.mu.Unlock()
	if p.m != nil {
		p.m.lag.Set(float64(max(0, hwm-last.Offset-1)))
	}
}

// apply applies a batch: all in one transaction if it can, else one event at
// a time, so a poison event is isolated and the others still commit. It
// returns only errStopped (or the context's error).
func (p *partition) apply(ctx context.Context, batch []*Event) error {
	if len(batch) > 1 {
		err := p.try(ctx, batch)
		if err == nil {
			p.mark(batch[len(batch)-1])
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Info("inbox: batch failed; applying its events one at a time", "first_offset", batch[0].Offset, "events", len(batch), "error", err)
	}
	for _, ev := range batch {
		if err := p.applyOne(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

// applyOne applies one event until it is applied, parked, or the partition
// stops. Only handler errors while the database answers count as attempts:
// an outage retries forever without parking anything.
func (p *partition) applyOne(ctx context.Context, ev *Event) error {
	held := false
	defer func() {
		if held && p.m != nil {
			p.m.held.Dec()
		}
	}()
	attempts, waits := 0, 0
	for {
		err := p.try(ctx, []*Event{ev})
		if err == nil {
			if held {
				p.log.Info("inbox: held event applied; the partition continues", "offset", ev.Offset, "id", ev.ID, "attempts", attempts+1)
			}
			p.mark(ev)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he *handlerError
		if errors.As(err, &he) && p.db.healthy(ctx) == nil {
			attempts++
			if p.m != nil {
				p.m.errors.Inc()
			}
			if attempts >= p.s.maxAttempts {
				switch {
				case p.s.onPoison != Hold:
					perr := p.parkEvent(ctx, ev, attempts, he.err)
					if perr == nil {
						p.mark(ev)
						return nil
					}
					if ctx.Err() != nil {
						return ctx.Err()
					}
					p.log.Error("inbox: parking a poison event failed; retrying", "offset", ev.Offset, "id", ev.ID, "error", perr)
				case !held:
					held = true
					if p.m != nil {
						p.m.held.Inc()
					}
					p.log.Error("inbox: holding the partition at a poison event (OnPoison: Hold); nothing after it is applied until its handler succeeds: fix the cause, or restart with OnPoison: Park to park it",
						"offset", ev.Offset, "id", ev.ID, "attempts", attempts, "error", he.err)
				default:
					p.log.Warn("inbox: held event still fails", "offset", ev.Offset, "id", ev.ID, "attempts", attempts, "error", he.err)
				}
			} else {
				p.log.Warn("inbox: handler failed; retrying", "offset", ev.Offset, "id", ev.ID, "attempt", attempts, "of", p.s.maxAttempts, "error", he.err)
			}
		} else {
			p.log.Warn("inbox: database error; retrying (not counted as a handler attempt)", "offset", ev.Offset, "id", ev.ID, "error", err)
		}
		waits++
		if held {
			waits = max(waits, 64) // MaxBackoff from now on
		}
		if err := p.wait(ctx, backoff(p.s.minBackoff, p.s.maxBackoff, waits)); err != nil {
			return err
		}
	}
}

// backoff is min·2^(n-1), capped at max.
func backoff(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

func (p *partition) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-p.quit:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

// handlerError marks an error as the handler's (the ones that count as
// attempts), as opposed to the database's.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// try runs one transaction over batch: claim each event's inbox row, run the
// handler for the new ones, commit. Counters move only after the commit.
func (p *partition) try(ctx context.Context, batch []*Event) (err error) {
	tx, err := p.db.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.rollback(context.WithoutCancel(ctx))
		}
	}()
	dups, applied := 0, 0
	var took []time.Duration
	for _, ev := range batch {
		if ev.ID == "" {
			return &handlerError{errNoID}
		}
		fresh, err := tx.claim(ctx, ev)
		if err != nil {
			return fmt.Errorf("insert inbox row: %w", err)
		}
		if !fresh {
			dups++
			continue
		}
		start := time.Now()
		if err := callHandler(ctx, p.s.handler, tx.tx(), ev); err != nil {
			return &handlerError{err}
		}
		took = append(took, time.Since(start))
		applied++
	}
	if err := tx.commit(ctx); err != nil {
		// The commit may have happened: the retry's claim will tell.
		return fmt.Errorf("commit: %w", err)
	}
	if p.m != nil {
		p.m.processed.Add(float64(applied))
		p.m.duplicates.Add(float64(dups))
		for _, d := range took {
			p.m.latency.Observe(d.Seconds())
		}
	}
	if dups > 0 {
		p.log.Debug("inbox: skipped events already applied", "events", dups, "last_offset", batch[len(batch)-1].Offset)
	}
	return nil
}

// callHandler turns a panic into a handler error: one bad event must not
// take the consumer down with every other partition.
func callHandler(ctx context.Context, h Handler, tx pgx.Tx, ev *Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return h(ctx, tx, ev)
}

// parkEvent parks ev: with its inbox row in one transaction, so a replay
// skips it as a duplicate instead of parking it again.
func (p *partition) parkEvent(ctx context.Context, ev *Event, attempts int, cause error) (err error) {
	if p.s.deadLetter != nil {
		if err := p.s.deadLetter(ctx, ev, attempts, cause); err != nil {
			return fmt.Errorf("produce to the dead-letter topic: %w", err)
		}
	}
	tx, err := p.db.begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.rollback(context.WithoutCancel(ctx))
		}
	}()
	id := ev.ID
	if id == "" {
		// No id to dedupe on: park under its position, which is unique.
		id = fmt.Sprintf("%s/%d/%d", ev.Topic, ev.Partition, ev.Offset)
	}
	claimed := *ev
	claimed.ID = id
	fresh, err := tx.claim(ctx, &claimed)
	if err != nil {
		return fmt.Errorf("insert inbox row: %w", err)
	}
	if fresh && p.s.deadLetter == nil {
		if err := tx.park(ctx, &claimed, attempts, cause); err != nil {
			return fmt.Errorf("insert into inbox_parked: %w", err)
		}
	}
	if err := tx.commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if fresh && p.m != nil {
		p.m.parked.Inc()
	}
	where := "inbox_parked"
	if p.s.deadLetter != nil {
		where = "the dead-letter topic"
	}
	p.log.Error("inbox: parked a poison event; the partition continues (OnPoison: Park)", "offset", ev.Offset, "id", id, "attempts", attempts, "parked_in", where, "error", cause)
	return nil
}
