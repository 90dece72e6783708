package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
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
	// countStarts records durably, in a transaction of its own committed
	// before any handler runs, that this process starts applying evs. For
	// a batch (individual false) it returns 1 for each event that already
	// had a row (an earlier process started it and died) and 0 for the
	// others, and leaves a row with no attempt for each; for one event
	// (individual true) it counts an attempt and returns the count, this
	// one included.
	countStarts(ctx context.Context, evs []*Event, individual bool) ([]int, error)
}

// txn is one database transaction.
type txn interface {
	// claim inserts ev's inbox row; fresh false means it was already there
	// (the effect was applied before). keyParked says whether ev's key has
	// events parked by ParkKey (only asked when checkKey).
	claim(ctx context.Context, ev *Event, checkKey bool) (fresh, keyParked bool, err error)
	// parkBehind parks ev behind its key's parked events, after taking the
	// key's lock and looking again (a release may have just replayed them
	// all); false means the key is no longer parked and ev is to be applied.
	parkBehind(ctx context.Context, ev *Event) (bool, error)
	// park records a poison event in inbox_parked; with key, as the first
	// of its parked aggregate (seq), else alone.
	park(ctx context.Context, ev *Event, attempts int, cause error, key bool) error
	// clearStarts deletes the start counts of evs (they are applied).
	clearStarts(ctx context.Context, evs []*Event) error
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
	// tracer, if set, starts a span per applied event (trace.go).
	tracer *tracing
}

// errStopped ends a partition's work on an event it has not applied: the
// partition was revoked or the consumer is stopping, and whoever is assigned
// the partition next replays it from the committed offset.
var errStopped = errors.New("partition stopped")

// errNoID is the handler error of a record without an id header: it cannot be
// deduplicated, so it is poison (never applied without its inbox row).
var errNoID = Permanent(errors.New(`the record has no "id" header: it cannot be deduplicated (is it from outboxd?)`))

// partition is a lane: it applies one ordered stream of events (a Kafka
// topic partition, a JetStream stream, a RabbitMQ queue) in order per key.
// Its goroutine (run) is owned by the Consumer, which starts it when the
// source opens the lane and stops it with stop, which returns once the
// current batch is finished and acknowledged.
//
// A key whose event fails with a transient error is blocked in memory: the
// event waits for its backoff, the key's later events queue behind it, and
// the other keys go on. A key's order of application is therefore the
// lane's order, and no key waits for another's retries. What is
// acknowledged: on Kafka (offsets) the end of the prefix of the lane whose
// events are all done, so a crash replays from the oldest event not done
// (what was done after it is a counted duplicate); on NATS and RabbitMQ each
// event once it is done.
type partition struct {
	topic string
	part  int32
	s     *settings
	db    store
	// mark is called after the database commit, never before: with offsets,
	// with the last event of the done prefix; else with each done event.
	mark func(*Event)
	// pause/resume stop and restart fetching of the partition while the
	// worker has a backlog past highWater (nil in unit tests).
	pause, resume func()
	// offsets: drop pushed events below next (a repeated Kafka fetch), and
	// acknowledge cumulatively (see mark).
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

	// Owned by run's goroutine:
	inOrder doneInOrder          // taken and not yet done, in lane order (offsets only)
	blocked map[string]*keyRetry // keys waiting for a retry, with their queued events
	// cautious: record process starts durably before applying (see
	// countStarts) until a batch commits that no earlier process died on.
	cautious bool
}

// keyRetry is a key whose head event is waiting for its next attempt.
type keyRetry struct {
	key      string
	evs      []*Event // evs[0] is the failed event
	attempts int
	due      time.Time
	cause    error
}

func newPartition(topic string, part int32, s *settings, db store, mark func(*Event), m *partitionMetrics, log *slog.Logger) *partition {
	return &partition{
		topic: topic, part: part, s: s, db: db, mark: mark, m: m,
		log:      log.With("topic", topic, "partition", part),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		notify:   make(chan struct{}, 1),
		next:     -1,
		blocked:  map[string]*keyRetry{},
		cautious: s.onPoison != Hold,
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

// run applies batches and due retries until stop. ctx is cancelled only
// when the work must end without finishing (the partition was lost, or the
// shutdown timeout passed).
func (p *partition) run(ctx context.Context) {
	defer close(p.done)
	for {
		if p.stopping() {
			return
		}
		if r := p.dueRetry(time.Now()); r != nil {
			if err := p.retry(ctx, r); err != nil {
				return
			}
			continue
		}
		if batch := p.take(); len(batch) > 0 {
			if err := p.apply(ctx, batch); err != nil {
				return
			}
			p.updateLag(batch[len(batch)-1])
			continue
		}
		var due <-chan time.Time
		var timer *time.Timer
		if next, ok := p.nextDue(); ok {
			timer = time.NewTimer(time.Until(next))
			due = timer.C
		}
		select {
		case <-p.quit:
		case <-ctx.Done():
		case <-p.notify:
		case <-due:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
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

// blockKey is the key a retry blocks: the aggregate id; an event without a
// key has no aggregate and blocks only itself.
func blockKey(ev *Event) string {
	if len(ev.Key) == 0 {
		return "\x00" + ev.ID + "\x00" + strconv.FormatInt(ev.Offset, 10)
	}
	return string(ev.Key)
}

func (p *partition) dueRetry(now time.Time) *keyRetry {
	var first *keyRetry
	for _, r := range p.blocked {
		if !r.due.After(now) && (first == nil || r.due.Before(first.due)) {
			first = r
		}
	}
	return first
}

func (p *partition) nextDue() (time.Time, bool) {
	var next time.Time
	for _, r := range p.blocked {
		if next.IsZero() || r.due.Before(next) {
			next = r.due
		}
	}
	return next, !next.IsZero()
}

// taken registers events the lane took, in order, for the cumulative mark.
func (p *partition) taken(evs []*Event) {
	if p.offsets {
		p.inOrder.take(evs...)
	}
}

// finish acknowledges ev, done (applied, a duplicate or parked): at once,
// or, with offsets, once every event before it is done too.
func (p *partition) finish(evs ...*Event) {
	if !p.offsets {
		for _, ev := range evs {
			p.mark(ev)
		}
		return
	}
	if last := p.inOrder.done(evs...); last != nil {
		p.mark(last)
	}
}

// doneInOrder holds a lane's events done out of order (keys retried or on
// other workers) until the ones taken before them are done too: an offset
// acknowledges every event before it.
type doneInOrder struct {
	order    []*Event        // taken and not done, in lane order
	finished map[*Event]bool // done, waiting for the prefix
}

// take appends the lane's next events.
func (d *doneInOrder) take(evs ...*Event) { d.order = append(d.order, evs...) }

// done marks evs done and returns the last of the events now done with all
// those before them (nil if none is), forgetting them.
func (d *doneInOrder) done(evs ...*Event) (last *Event) {
	if d.finished == nil {
		d.finished = map[*Event]bool{}
	}
	for _, ev := range evs {
		d.finished[ev] = true
	}
	for len(d.order) > 0 && d.finished[d.order[0]] {
		last = d.order[0]
		delete(d.finished, last)
		d.order = d.order[1:]
	}
	return last
}

// apply applies a batch: all in one transaction if it can, else one event at
// a time, so a failing event is isolated and the others still commit. Events
// of a key waiting for a retry queue behind it. It returns only errStopped
// (or the context's error).
func (p *partition) apply(ctx context.Context, batch []*Event) error {
	p.taken(batch)
	var ready []*Event
	for _, ev := range batch {
		if r := p.blocked[blockKey(ev)]; r != nil {
			r.evs = append(r.evs, ev)
			continue
		}
		ready = append(ready, ev)
	}
	if len(ready) == 0 {
		return nil
	}
	// Crash counting: a lane starts cautious and records that it starts the
	// batch. If an earlier process had started one of its events and died
	// (its row is there), the lane is suspicious: it applies the batch one
	// event at a time, counting an attempt before each, and parks an event
	// whose attempts pass MaxAttempts without running it. Events after the
	// one a process died on are not counted for it: only attempts are. A
	// batch that no earlier process died on ends the cautious start.
	suspicious := false
	if p.cautious {
		seen, err := p.countStarts(ctx, ready, false)
		if err != nil {
			return err
		}
		suspicious = slices.Contains(seen, 1)
		p.cautious = suspicious
	}
	if len(ready) > 1 && !suspicious {
		err := p.try(ctx, ready)
		if err == nil {
			p.finish(ready...)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Info("inbox: batch failed; applying its events one at a time", "first_offset", ready[0].Offset, "events", len(ready), "error", err)
	}
	for _, ev := range ready {
		if r := p.blocked[blockKey(ev)]; r != nil {
			r.evs = append(r.evs, ev)
			continue
		}
		if suspicious && ev.ID != "" {
			n, err := p.countStarts(ctx, []*Event{ev}, true)
			if err != nil {
				return err
			}
			if died := n[0] - 1; died >= p.s.maxAttempts {
				cause := Permanent(fmt.Errorf("the consumer process ended %d times while applying this event (a crash, an OOM kill, a kill -9): parked so that it stops crash-looping", died))
				if err := p.poison(ctx, ev, died, cause); err != nil {
					return err
				}
				continue
			}
		}
		if err := p.applyOne(ctx, ev, 0); err != nil {
			return err
		}
	}
	return nil
}

// countStarts asks the store, retrying through an outage.
func (p *partition) countStarts(ctx context.Context, evs []*Event, individual bool) ([]int, error) {
	for waits := 1; ; waits++ {
		n, err := p.db.countStarts(ctx, evs, individual)
		if err == nil {
			for _, ev := range evs {
				ev.counted = true
			}
			return n, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		p.log.Warn("inbox: database error counting attempts; retrying", "error", err)
		if err := p.wait(ctx, backoff(p.s.minBackoff, p.s.maxBackoff, waits)); err != nil {
			return nil, err
		}
	}
}

// applyOne tries ev once more after attempts failed ones: applied, it is
// acknowledged; a handler error blocks its key for a retry (or, at
// MaxAttempts or Permanent, parks it; with Hold, holds the lane). Database
// errors retry in place without counting: an outage stops every key alike.
func (p *partition) applyOne(ctx context.Context, ev *Event, attempts int) error {
	held := false
	defer func() {
		if held && p.m != nil {
			p.m.held.Dec()
		}
	}()
	waits := 0
	for {
		err := p.try(ctx, []*Event{ev})
		if err == nil {
			if held {
				p.log.Info("inbox: held event applied; the partition continues", "offset", ev.Offset, "id", ev.ID, "attempts", attempts+1)
			}
			p.finish(ev)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var he *handlerError
		if !errors.As(err, &he) || p.db.healthy(ctx) != nil {
			p.log.Warn("inbox: database error; retrying (not counted as a handler attempt)", "offset", ev.Offset, "id", ev.ID, "error", err)
			waits++
			if err := p.wait(ctx, backoff(p.s.minBackoff, p.s.maxBackoff, waits)); err != nil {
				return err
			}
			continue
		}
		attempts++
		if p.m != nil {
			p.m.errors.Inc()
		}
		poison := attempts >= p.s.maxAttempts || isPermanent(he.err)
		switch {
		case p.s.onPoison != Hold && poison:
			return p.poison(ctx, ev, attempts, he.err)
		case p.s.onPoison != Hold:
			p.log.Warn("inbox: handler failed; retrying its key later, the other keys go on", "offset", ev.Offset, "id", ev.ID, "attempt", attempts, "of", p.s.maxAttempts, "error", he.err)
			p.blocked[blockKey(ev)] = &keyRetry{key: blockKey(ev), evs: []*Event{ev}, attempts: attempts,
				due: time.Now().Add(backoff(p.s.minBackoff, p.s.maxBackoff, attempts)), cause: he.err}
			return nil
		case !poison:
			p.log.Warn("inbox: handler failed; retrying", "offset", ev.Offset, "id", ev.ID, "attempt", attempts, "of", p.s.maxAttempts, "error", he.err)
			waits = attempts
		case !held:
			held = true
			if p.m != nil {
				p.m.held.Inc()
			}
			p.log.Error("inbox: holding the partition at a poison event (OnPoison: Hold); nothing after it is applied until its handler succeeds: fix the cause, or restart with OnPoison: ParkKey to park its aggregate",
				"offset", ev.Offset, "id", ev.ID, "attempts", attempts, "error", he.err)
			waits = 64 // MaxBackoff from now on
		default:
			p.log.Warn("inbox: held event still fails", "offset", ev.Offset, "id", ev.ID, "attempts", attempts, "error", he.err)
		}
		if err := p.wait(ctx, backoff(p.s.minBackoff, p.s.maxBackoff, waits)); err != nil {
			return err
		}
	}
}

// poison parks ev, retrying through database errors, and acknowledges it.
func (p *partition) poison(ctx context.Context, ev *Event, attempts int, cause error) error {
	for waits := 1; ; waits++ {
		err := p.parkEvent(ctx, ev, attempts, cause)
		if err == nil {
			p.finish(ev)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p.log.Error("inbox: parking a poison event failed; retrying", "offset", ev.Offset, "id", ev.ID, "error", err)
		if err := p.wait(ctx, backoff(p.s.minBackoff, p.s.maxBackoff, waits)); err != nil {
			return err
		}
	}
}

// retry tries a blocked key's head event again; when it is applied or
// parked, the key's queued events follow, in order, until one fails again
// or none is left.
func (p *partition) retry(ctx context.Context, r *keyRetry) error {
	delete(p.blocked, r.key)
	evs := r.evs
	if err := p.applyOne(ctx, evs[0], r.attempts); err != nil {
		p.blocked[r.key] = r
		return err
	}
	for i, ev := range evs[1:] {
		if nr := p.blocked[r.key]; nr != nil {
			nr.evs = append(nr.evs, evs[1+i:]...)
			return nil
		}
		if err := p.applyOne(ctx, ev, 0); err != nil {
			// Stopping: what was not applied is not acknowledged.
			return err
		}
	}
	return nil
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

// try runs one transaction over batch: claim each event's inbox row, park
// it behind its key if the key is parked (ParkKey), else run the handler,
// commit. Counters move only after the commit.
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
	dups, applied, behind := 0, 0, 0
	// dupEvs are the duplicates to log after the commit, kept only when
	// debug logging is on: no work per event otherwise.
	var dupEvs []*Event
	debug := p.log.Enabled(ctx, slog.LevelDebug)
	var took []time.Duration
	var counted []*Event
	for _, ev := range batch {
		if ev.ID == "" {
			return &handlerError{errNoID}
		}
		if ev.counted {
			counted = append(counted, ev)
		}
		checkKey := p.s.onPoison == ParkKey && len(ev.Key) > 0
		fresh, keyParked, err := tx.claim(ctx, ev, checkKey)
		if err != nil {
			return fmt.Errorf("insert inbox row: %w", err)
		}
		if !fresh {
			dups++
			if debug {
				dupEvs = append(dupEvs, ev)
			}
			continue
		}
		if keyParked {
			parked, err := tx.parkBehind(ctx, ev)
			if err != nil {
				return fmt.Errorf("park behind the key's parked events: %w", err)
			}
			if parked {
				behind++
				continue
			}
		}
		start := time.Now()
		if err := p.s.tracer.apply(ctx, p.s.handler, tx.tx(), ev); err != nil {
			return &handlerError{err}
		}
		took = append(took, time.Since(start))
		applied++
	}
	if len(counted) > 0 {
		if err := tx.clearStarts(ctx, counted); err != nil {
			return fmt.Errorf("delete attempt counts: %w", err)
		}
	}
	if err := tx.commit(ctx); err != nil {
		// The commit may have happened: the retry's claim will tell.
		return fmt.Errorf("commit: %w", err)
	}
	for _, ev := range counted {
		ev.counted = false
	}
	if p.m != nil {
		p.m.processed.Add(float64(applied))
		p.m.duplicates.Add(float64(dups))
		p.m.parked.Add(float64(behind))
		for _, d := range took {
			p.m.latency.Observe(d.Seconds())
		}
	}
	// Logged after the commit, so that a retried transaction does not log
	// its duplicates twice. The logger carries the lane's topic and
	// partition; the event's own topic (a NATS subject) is added where it
	// differs.
	for _, ev := range dupEvs {
		if ev.Topic != p.topic && ev.Topic != "" {
			p.log.Debug("inbox: skipped an event already applied (its inbox row exists)", "id", ev.ID, "offset", ev.Offset, "subject", ev.Topic)
			continue
		}
		p.log.Debug("inbox: skipped an event already applied (its inbox row exists)", "id", ev.ID, "offset", ev.Offset)
	}
	if behind > 0 {
		p.log.Warn("inbox: parked events behind their aggregate's poison event (OnPoison: ParkKey); release the key to replay them", "events", behind, "last_offset", batch[len(batch)-1].Offset)
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
// skips it as a duplicate instead of parking it again. With ParkKey and a
// key, it is the first event of its parked aggregate.
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
	fresh, _, err := tx.claim(ctx, &claimed, false)
	if err != nil {
		return fmt.Errorf("insert inbox row: %w", err)
	}
	withKey := p.s.onPoison == ParkKey && len(ev.Key) > 0
	if fresh && p.s.deadLetter == nil {
		if err := tx.park(ctx, &claimed, attempts, cause, withKey); err != nil {
			return fmt.Errorf("insert into inbox_parked: %w", err)
		}
	}
	if ev.counted {
		if err := tx.clearStarts(ctx, []*Event{ev}); err != nil {
			return fmt.Errorf("delete attempt counts: %w", err)
		}
	}
	if err := tx.commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	ev.counted = false
	if fresh && p.m != nil {
		p.m.parked.Inc()
	}
	where := "inbox_parked"
	if p.s.deadLetter != nil {
		where = "the dead-letter topic"
	}
	if withKey {
		p.log.Error("inbox: parked a poison event and its aggregate: the key's later events wait behind it, the other keys go on (OnPoison: ParkKey); fix the cause, then outboxd inbox release",
			"offset", ev.Offset, "id", id, "key", string(ev.Key), "attempts", attempts, "error", cause)
		return nil
	}
	p.log.Error("inbox: parked a poison event; the partition continues", "offset", ev.Offset, "id", id, "attempts", attempts, "parked_in", where, "error", cause)
	return nil
}
