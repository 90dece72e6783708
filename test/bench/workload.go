package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// insertSeries inserts the events numbered $1..$2 into aggregatetype $3.
// ids are the sequence number as a uuid, so ORDER BY id is insertion order
// (what a polling publisher relies on); keys spread over 1,000 aggregates;
// the payload is JSON with $4 distinct md5 strings in "note": 2 make a
// ~200-byte event, 124 a ~4 KB one that PostgreSQL cannot compress away.
const insertSeries = `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
SELECT lpad(to_hex(g), 32, '0')::uuid, $3, 'agg-' || (g % 1000), 'OrderCreated',
	jsonb_build_object('seq', g, 'orderId', 'order-' || g, 'customerId', 'cust-' || (g % 997),
		'status', 'CREATED', 'currency', 'EUR', 'items', g % 7 + 1, 'total', round((g % 100000) / 100.0, 2),
		'note', (SELECT string_agg(md5(g::text || ':' || i), '') FROM generate_series(1, $4::int) i))
FROM generate_series($1::bigint, $2::bigint) g`

// backlog is what writeBacklog wrote.
type backlog struct {
	Events, PerTxn, Txns int
	Took                 time.Duration
	PayloadBytes         int64 // sum of the payloads' text (the Kafka record values)
	AfterLSN             uint64
}

// chunksFor is the number of md5 strings that make a payload of about size bytes.
func chunksFor(size int) int { return max(1, (size-130)/32) }

// writeBacklog commits events rows in transactions of exactly perTxn rows
// each (events must be a multiple of perTxn), from several connections at
// once, each pipelining BEGIN; INSERT … SELECT generate_series; COMMIT
// triples. Nothing reads the slots meanwhile.
func (w *world) writeBacklog(ctx context.Context, events, perTxn, payloadSize int) (backlog, error) {
	if perTxn < 1 || events < perTxn || events%perTxn != 0 {
		return backlog{}, fmt.Errorf("backlog: %d events do not split into transactions of %d", events, perTxn)
	}
	txns := events / perTxn
	conns := min(4, txns)
	perBatch := max(1, 2000/perTxn) // ~2,000 rows per round trip
	chunks := chunksFor(payloadSize)
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for c := range conns {
		lo, hi := txns*c/conns, txns*(c+1)/conns // this connection's transactions [lo, hi)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[c] = w.writeTxns(ctx, lo, hi, perTxn, perBatch, chunks)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return backlog{}, err
		}
	}
	b := backlog{Events: events, PerTxn: perTxn, Txns: txns, Took: time.Since(start)}
	var lsn string
	if err := w.conn.QueryRow(ctx, `SELECT coalesce(sum(octet_length(payload::text)), 0)::bigint, pg_current_wal_lsn()::text FROM outbox`).
		Scan(&b.PayloadBytes, &lsn); err != nil {
		return backlog{}, fmt.Errorf("sizing backlog: %w", err)
	}
	var err error
	b.AfterLSN, err = harness.ParseLSN(lsn)
	return b, err
}

func (w *world) writeTxns(ctx context.Context, lo, hi, perTxn, perBatch, chunks int) error {
	conn, err := pgx.Connect(ctx, w.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for t := lo; t < hi; t += perBatch {
		var b pgx.Batch
		for j := t; j < min(hi, t+perBatch); j++ {
			first := int64(j)*int64(perTxn) + 1
			b.Queue("BEGIN")
			b.Queue(insertSeries, first, first+int64(perTxn)-1, w.agg, chunks)
			b.Queue("COMMIT")
		}
		if err := conn.SendBatch(ctx, &b).Close(); err != nil {
			return fmt.Errorf("writing backlog: %w", err)
		}
	}
	return nil
}
