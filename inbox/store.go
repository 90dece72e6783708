package inbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgStore is the store on the consumer's pgxpool.
type pgStore struct {
	pool              *pgxpool.Pool
	name              string
	claimSQL, parkSQL string
}

func newPGStore(pool *pgxpool.Pool, name, inboxTable, parkedTable string) *pgStore {
	return &pgStore{
		pool: pool, name: name,
		claimSQL: `INSERT INTO ` + inboxTable + ` (consumer, event_id, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		parkSQL:  `INSERT INTO ` + parkedTable + ` (consumer, event_id, topic, "partition", "offset", key, value, headers, attempts, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING`,
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

type pgTxn struct {
	s *pgStore
	t pgx.Tx
}

func (t *pgTxn) claim(ctx context.Context, ev *Event) (bool, error) {
	tag, err := t.t.Exec(ctx, t.s.claimSQL, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

func (t *pgTxn) park(ctx context.Context, ev *Event, attempts int, cause error) error {
	hdrs := make(map[string]string, len(ev.Headers))
	for _, h := range ev.Headers {
		hdrs[h.Key] = string(h.Value)
	}
	hj, err := json.Marshal(hdrs)
	if err != nil {
		return fmt.Errorf("headers as JSON: %w", err)
	}
	_, err = t.t.Exec(ctx, t.s.parkSQL, t.s.name, ev.ID, ev.Topic, ev.Partition, ev.Offset, ev.Key, ev.Value, string(hj), attempts, cause.Error())
	return err
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
