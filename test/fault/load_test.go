package fault

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The writers commit a mixed outbox load and remember, for every
// transaction, what they tried and what PostgreSQL answered. Ground truth
// for "committed" is the side table committed_txns: every writer
// transaction inserts its own id there, so the row exists exactly when the
// transaction committed, even when the outbox rows were deleted again in
// the same transaction or the COMMIT's outcome was lost to a restart.

type txnKind uint8

const (
	kindCommit       txnKind = iota // insert events, COMMIT
	kindRollback                    // insert events, ROLLBACK
	kindInsertDelete                // insert events, delete them again, COMMIT
)

func (k txnKind) String() string {
	return [...]string{"commit", "rollback", "insert+delete"}[k]
}

// outcome is what the writer saw; the checker resolves it against
// committed_txns.
type outcome uint8

const (
	outPending    outcome = iota
	outCommitted          // COMMIT returned OK
	outRolledBack         // explicit ROLLBACK (whatever it returned)
	outFailed             // an error before COMMIT was sent: cannot have committed
	outUnknown            // COMMIT sent, no answer: committed_txns decides
)

func (o outcome) String() string {
	return [...]string{"pending", "committed", "rolled back", "failed", "unknown"}[o]
}

type event struct {
	id      string
	aggType string
	aggID   string
	typ     string
	payload string
	txn     *txn
	idx     int // position in its transaction
}

type txn struct {
	id      int64
	writer  int
	kind    txnKind
	slow    bool
	events  []*event
	outcome outcome
	err     string

	// Filled by the checker.
	committed   bool
	xid         uint32
	commitStart uint64 // start LSN of the commit record
	commitEnd   uint64 // end LSN of the commit record
}

type loadConfig struct {
	writers            int
	pauseMin, pauseMax time.Duration // between a writer's transactions
	pBulk, pTen        float64       // share of 500- and 10-event transactions (rest: 1)
	bulkSize           int
	pRollback          float64
	pInsertDelete      float64
	aggTypes           []string
	aggIDs             int     // aggregate ids per type
	maxPad             int     // payload padding bytes
	pSlowCommit        float64 // share of transactions whose COMMIT takes 50 ms (see setupSchema)
}

type load struct {
	cfg  loadConfig
	dsn  string
	seed uint64

	mu     sync.Mutex
	txns   []*txn
	events map[string]*event

	nextTxn, nextEvent atomic.Int64
	reconnects         atomic.Int64
	stopping           atomic.Bool
	wg                 sync.WaitGroup
}

const insertSQL = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`

func newLoad(cfg loadConfig, dsn string, seed uint64) *load {
	return &load{cfg: cfg, dsn: dsn, seed: seed, events: map[string]*event{}}
}

func (l *load) start(ctx context.Context) {
	for w := range l.cfg.writers {
		l.wg.Add(1)
		go l.writer(ctx, w)
	}
}

// stop lets every writer finish its current transaction and waits.
func (l *load) stop() {
	l.stopping.Store(true)
	l.wg.Wait()
}

func (l *load) writer(ctx context.Context, w int) {
	defer l.wg.Done()
	rng := rand.New(rand.NewPCG(l.seed, uint64(w)+1))
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for !l.stopping.Load() && ctx.Err() == nil {
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err := pgx.Connect(cctx, l.dsn)
			cancel()
			if err != nil {
				l.reconnects.Add(1)
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			conn = c
		}
		t := l.plan(rng, w)
		if !l.run(ctx, conn, t) {
			conn.Close(context.Background())
			conn = nil
		}
		sleepCtx(ctx, l.cfg.pauseMin+time.Duration(rng.Int64N(int64(l.cfg.pauseMax-l.cfg.pauseMin)+1)))
	}
}

func (l *load) plan(rng *rand.Rand, w int) *txn {
	t := &txn{id: l.nextTxn.Add(1), writer: w, slow: rng.Float64() < l.cfg.pSlowCommit}
	switch r := rng.Float64(); {
	case r < l.cfg.pRollback:
		t.kind = kindRollback
	case r < l.cfg.pRollback+l.cfg.pInsertDelete:
		t.kind = kindInsertDelete
	}
	n := 1
	switch r := rng.Float64(); {
	case r < l.cfg.pBulk:
		n = l.cfg.bulkSize
	case r < l.cfg.pBulk+l.cfg.pTen:
		n = 10
	}
	for i := range n {
		seq := l.nextEvent.Add(1)
		e := &event{
			id:      fmt.Sprintf("00000000-0000-4000-8000-%012d", seq),
			aggType: l.cfg.aggTypes[rng.IntN(len(l.cfg.aggTypes))],
			typ:     [...]string{"Created", "Updated", "Shipped"}[rng.IntN(3)],
			txn:     t,
			idx:     i,
		}
		e.aggID = fmt.Sprintf("%s-%d", strings.ToLower(e.aggType), rng.IntN(l.cfg.aggIDs))
		e.payload = fmt.Sprintf(`{"eid": %q, "txn": %d, "i": %d, "pad": %q}`, e.id, t.id, i, strings.Repeat("x", rng.IntN(l.cfg.maxPad+1)))
		t.events = append(t.events, e)
	}
	l.mu.Lock()
	l.txns = append(l.txns, t)
	for _, e := range t.events {
		l.events[e.id] = e
	}
	l.mu.Unlock()
	return t
}

// run executes t and records its outcome. It returns false when the
// connection should be replaced.
func (l *load) run(ctx context.Context, conn *pgx.Conn, t *txn) bool {
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fail := func(o outcome, err error) bool {
		t.outcome, t.err = o, err.Error()
		return false
	}
	tx, err := conn.Begin(tctx)
	if err != nil {
		return fail(outFailed, err)
	}
	b := &pgx.Batch{}
	ids := make([]string, len(t.events))
	for i, e := range t.events {
		b.Queue(insertSQL, e.id, e.aggType, e.aggID, e.typ, e.payload)
		ids[i] = e.id
	}
	if t.kind == kindInsertDelete {
		b.Queue(`DELETE FROM outbox WHERE id = ANY($1::uuid[])`, ids)
	}
	b.Queue(`INSERT INTO committed_txns (id, xid, slow) VALUES ($1, pg_current_xact_id()::text::bigint, $2)`, t.id, t.slow)
	if err := tx.SendBatch(tctx, b).Close(); err != nil {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = tx.Rollback(rctx)
		rcancel()
		return fail(outFailed, err)
	}
	if t.kind == kindRollback {
		if err := tx.Rollback(tctx); err != nil {
			t.outcome, t.err = outRolledBack, err.Error()
			return false
		}
		t.outcome = outRolledBack
		return true
	}
	if err := tx.Commit(tctx); err != nil {
		if errors.Is(err, pgx.ErrTxCommitRollback) {
			return fail(outFailed, err)
		}
		return fail(outUnknown, err)
	}
	t.outcome = outCommitted
	return true
}

// snapshot returns every planned transaction (call after stop).
func (l *load) snapshot() ([]*txn, map[string]*event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*txn(nil), l.txns...), l.events
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// writeOne commits one transaction with one event of aggregate type agg
// whose payload is padded to pad bytes, and records it like the load's own.
func (l *load) writeOne(ctx context.Context, agg string, pad int) error {
	t := &txn{id: l.nextTxn.Add(1), writer: -1}
	e := &event{
		id:      fmt.Sprintf("00000000-0000-4000-8000-%012d", l.nextEvent.Add(1)),
		aggType: agg, aggID: strings.ToLower(agg) + "-big", typ: "Created", txn: t,
	}
	e.payload = fmt.Sprintf(`{"eid": %q, "txn": %d, "i": 0, "pad": %q}`, e.id, t.id, strings.Repeat("x", pad))
	t.events = []*event{e}
	l.mu.Lock()
	l.txns = append(l.txns, t)
	l.events[e.id] = e
	l.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, l.dsn)
	if err != nil {
		t.outcome, t.err = outFailed, err.Error()
		return err
	}
	defer conn.Close(context.Background())
	if !l.run(ctx, conn, t) || t.outcome != outCommitted {
		return fmt.Errorf("transaction %d: %s %s", t.id, t.outcome, t.err)
	}
	return nil
}
