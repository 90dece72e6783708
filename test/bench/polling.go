package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// pollSQL is the polling publisher's claim query, as the seeds describe it.
const pollSQL = `SELECT id, aggregatetype, aggregateid, type, payload::text
FROM outbox WHERE published_at IS NULL ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 100`

// poller is the baseline outboxd replaces: one loop that claims up to 100
// unpublished rows, produces them (acks=all, waiting for the acks), marks
// them published and commits; it loops at once while rows were found and
// sleeps idle otherwise.
type poller struct {
	conn      *pgx.Conn
	kcl       *kgo.Client
	idle      time.Duration
	backend   int // the PostgreSQL backend serving conn
	published atomic.Int64
	loops     int
}

func (e *Env) newPoller(ctx context.Context, w *world, idle time.Duration) (*poller, error) {
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		return nil, err
	}
	opts, err := e.Kafka.ClientOpts()
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	// acks=all and idempotent, like outboxd; cancellation and a delivery
	// timeout keep a dead broker from hanging the bench.
	kcl, err := kgo.NewClient(append(opts, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0), kgo.AllowAutoTopicCreation(),
		kgo.AllowIdempotentProduceCancellation(), kgo.RecordDeliveryTimeout(30*time.Second))...)
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return &poller{conn: conn, kcl: kcl, idle: idle, backend: int(conn.PgConn().PID())}, nil
}

func (p *poller) close() {
	p.kcl.Close()
	p.conn.Close(context.Background())
}

// run loops until done reports true (checked before each claim) or ctx ends.
func (p *poller) run(ctx context.Context, done func(published int64) bool) error {
	for {
		if done(p.published.Load()) {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := p.once(ctx)
		if err != nil {
			return err
		}
		p.loops++
		if n == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(p.idle):
			}
		}
	}
}

func (p *poller) once(ctx context.Context) (int, error) {
	tx, err := p.conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("poller: %w", err)
	}
	defer tx.Rollback(context.Background()) // a no-op after Commit
	rows, err := tx.Query(ctx, pollSQL)
	if err != nil {
		return 0, fmt.Errorf("poller: %w", err)
	}
	var (
		recs []*kgo.Record
		ids  []string
	)
	for rows.Next() {
		var id, agg, key, typ, payload string
		if err := rows.Scan(&id, &agg, &key, &typ, &payload); err != nil {
			rows.Close()
			return 0, fmt.Errorf("poller: %w", err)
		}
		ids = append(ids, id)
		recs = append(recs, &kgo.Record{
			Topic: "outbox.event." + agg, Key: []byte(key), Value: []byte(payload),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(id)}, {Key: "type", Value: []byte(typ)}},
		})
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("poller: %w", err)
	}
	if len(recs) == 0 {
		return 0, tx.Commit(ctx)
	}
	if err := p.kcl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		return 0, fmt.Errorf("poller: produce: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id = ANY($1::uuid[])`, ids); err != nil {
		return 0, fmt.Errorf("poller: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("poller: %w", err)
	}
	p.published.Add(int64(len(recs)))
	return len(recs), nil
}

// PollRun is one polling publisher drain.
type PollRun struct {
	Elapsed   time.Duration
	Published int64
	Loops     int
	CPU       CPUSplit
}

// drainPolling publishes every unpublished row of w with one poller.
func (e *Env) drainPolling(ctx context.Context, w *world, want int64, timeout time.Duration) (PollRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// A table in production has statistics; without them the planner sorts
	// every unpublished row on each claim instead of walking the partial index.
	if _, err := w.conn.Exec(ctx, `ANALYZE outbox`); err != nil {
		return PollRun{}, err
	}
	snap := e.snapshot()
	start := time.Now()
	p, err := e.newPoller(ctx, w, 500*time.Millisecond)
	if err != nil {
		return PollRun{}, err
	}
	defer p.close()
	err = p.run(ctx, func(n int64) bool { return n >= want })
	r := PollRun{Elapsed: time.Since(start), Published: p.published.Load(), Loops: p.loops}
	r.CPU = e.split(snap, p.backend)
	r.CPU.Label = "poller's backend"
	if err != nil {
		return r, fmt.Errorf("polling drain: %d of %d published: %w", r.Published, want, err)
	}
	if r.Published != want {
		return r, fmt.Errorf("polling drain published %d rows, want %d", r.Published, want)
	}
	return r, nil
}
