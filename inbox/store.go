package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgStore is the store on the consumer's pgxpool.
type pgStore struct {
	pool                            *pgxpool.Pool
	name                            string
	inboxT, parkedT, attemptsT      string
	claimSQL, claimKeySQL, parkSQL  string
	parkKeySQL, behindSQL, countSQL string
	clearSQL, lockSQL, startSQL     string
}

func newPGStore(pool *pgxpool.Pool, name, inboxTable, parkedTable, attemptsTable string) *pgStore {
	const parkCols = `(consumer, event_id, topic, "partition", "offset", key, value, headers, attempts, error, seq, released_at)`
	return &pgStore{
		pool: pool, name: name, inboxT: inboxTable, parkedT: parkedTable, attemptsT: attemptsTable,
		claimSQL: `INSERT INTO ` + inboxTable + ` (consumer, event_id, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		// One round trip for both: the new inbox row, and whether the
		// key is parked (the parked table is small, and indexed by key).
		claimKeySQL: `WITH ins AS (INSERT INTO ` + inboxTable + ` (consumer, event_id, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1)
SELECT EXISTS (SELECT 1 FROM ins), EXISTS (SELECT 1 FROM ` + parkedTable + ` WHERE consumer = $1 AND key = $6 AND seq IS NOT NULL)`,
		parkSQL: `INSERT INTO ` + parkedTable + ` ` + parkCols + ` VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, NULL) ON CONFLICT DO NOTHING`,
		parkKeySQL: `INSERT INTO ` + parkedTable + ` ` + parkCols + `
SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, coalesce(max(seq), 0) + 1, NULL FROM ` + parkedTable + ` WHERE consumer = $1 AND key = $6 AND seq IS NOT NULL
ON CONFLICT DO NOTHING`,
		// Behind the key's last parked event, released if the key is
		// being released (the replay then takes it too).
		behindSQL: `INSERT INTO ` + parkedTable + ` ` + parkCols + `
SELECT $1, $2, $3, $4, $5, $6, $7, $8, 0, 'waiting behind ' || (array_agg(event_id ORDER BY seq))[1] || ', parked with: ' || (array_agg(error ORDER BY seq))[1],
       max(seq) + 1, max(released_at)
FROM ` + parkedTable + ` WHERE consumer = $1 AND key = $6 AND seq IS NOT NULL
HAVING count(*) > 0
ON CONFLICT DO NOTHING`,
		countSQL: `INSERT INTO ` + attemptsTable + ` (consumer, event_id, attempts) VALUES ($1, $2, 1)
ON CONFLICT (consumer, event_id) DO UPDATE SET attempts = ` + attemptsTable + `.attempts + 1, updated_at = now()
RETURNING attempts`,
		startSQL: `WITH seen AS (SELECT event_id FROM ` + attemptsTable + ` WHERE consumer = $1 AND event_id = ANY ($2::text[])),
ins AS (INSERT INTO ` + attemptsTable + ` (consumer, event_id, attempts) SELECT $1, unnest($2::text[]), 0 ON CONFLICT DO NOTHING)
SELECT event_id FROM seen`,
		clearSQL: `DELETE FROM ` + attemptsTable + ` WHERE consumer = $1 AND event_id = ANY ($2::text[])`,
		lockSQL:  `SELECT pg_advisory_xact_lock(hashtextextended('outboxd.inbox.key/' || $1 || '/' || encode($2::bytea, 'hex'), 0))`,
	}
}

func (s *pgStore) begin(ctx context.Context) (txn, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTxn{s: s, t: tx}, nil
}

func (s *pgStore) healthy(ctx context.Context) error { return s.pool.Ping(ctx) }

// countStarts commits with synchronous_commit off: the rows are for a
// consumer process that dies while PostgreSQL lives on (an asynchronous
// commit is visible at once and lost only if PostgreSQL itself crashes
// within a fraction of a second), and cost no WAL flush.
func (s *pgStore) countStarts(ctx context.Context, evs []*Event, individual bool) ([]int, error) {
	ids := make([]string, 0, len(evs))
	for _, ev := range evs {
		if ev.ID != "" {
			ids = append(ids, ev.ID)
		}
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make([]int, len(evs))
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		if individual {
			if len(ids) == 0 {
				return nil
			}
			return tx.QueryRow(ctx, s.countSQL, s.name, ids[0]).Scan(&out[0])
		}
		rows, err := tx.Query(ctx, s.startSQL, s.name, ids)
		if err != nil {
			return err
		}
		seen, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for i, ev := range evs {
			if slices.Contains(seen, ev.ID) {
				out[i] = 1
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

type pgTxn struct {
	s *pgStore
	t pgx.Tx
}

func (t *pgTxn) claim(ctx context.Context, ev *Event, checkKey bool) (fresh, keyParked bool, err error) {
	if !checkKey {
		tag, err := t.t.Exec(ctx, t.s.claimSQL, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset)
		if err != nil {
			return false, false, err
		}
		return tag.RowsAffected() == 1, false, nil
	}
	err = t.t.QueryRow(ctx, t.s.claimKeySQL, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset, ev.Key).Scan(&fresh, &keyParked)
	return fresh, keyParked, err
}

// lockKey takes the transaction-scoped lock of ev's key, which a parking
// and a release's replay of the same key hold one at a time.
func (t *pgTxn) lockKey(ctx context.Context, key []byte) error {
	_, err := t.t.Exec(ctx, t.s.lockSQL, t.s.name, key)
	return err
}

func (t *pgTxn) parkBehind(ctx context.Context, ev *Event) (bool, error) {
	if err := t.lockKey(ctx, ev.Key); err != nil {
		return false, err
	}
	hj, err := headersJSON(ev)
	if err != nil {
		return false, err
	}
	tag, err := t.t.Exec(ctx, t.s.behindSQL, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset, ev.Key, ev.Value, hj)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func (t *pgTxn) park(ctx context.Context, ev *Event, attempts int, cause error, key bool) error {
	hj, err := headersJSON(ev)
	if err != nil {
		return err
	}
	q := t.s.parkSQL
	if key {
		if err := t.lockKey(ctx, ev.Key); err != nil {
			return err
		}
		q = t.s.parkKeySQL
	}
	_, err = t.t.Exec(ctx, q, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset, ev.Key, ev.Value, hj, attempts, cause.Error())
	return err
}

func (t *pgTxn) clearStarts(ctx context.Context, evs []*Event) error {
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	_, err := t.t.Exec(ctx, t.s.clearSQL, t.s.name, ids)
	return err
}

func headersJSON(ev *Event) (string, error) {
	hdrs := make(map[string]string, len(ev.Headers))
	for _, h := range ev.Headers {
		hdrs[h.Key] = string(h.Value)
	}
	hj, err := json.Marshal(hdrs)
	if err != nil {
		return "", fmt.Errorf("headers as JSON: %w", err)
	}
	return string(hj), nil
}

func (t *pgTxn) tx() pgx.Tx                         { return t.t }
func (t *pgTxn) commit(ctx context.Context) error   { return t.t.Commit(ctx) }
func (t *pgTxn) rollback(ctx context.Context) error { return t.t.Rollback(ctx) }

// expire deletes up to batch inbox rows older than the retention, oldest
// first, and returns how many. Small batches keep each DELETE's locks and WAL
// short next to the consumer's own transactions.
func (s *pgStore) expire(ctx context.Context, inboxTable string, retentionSeconds float64, batch int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+inboxTable+` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM `+inboxTable+` WHERE consumer = $1 AND processed_at < now() - make_interval(secs => $2)
	ORDER BY processed_at LIMIT $3))`, s.name, retentionSeconds, batch)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
