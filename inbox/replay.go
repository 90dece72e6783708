package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// replayReleased replays released parked aggregates (Release) every
// ReleaseInterval until ctx ends. Run owns it. Every running consumer of a
// Name does it; the key's lock and the rows' FOR UPDATE make them take the
// events one at a time, in order.
func (c *Consumer) replayReleased(ctx context.Context) {
	every(ctx, c.cfg.ReleaseInterval, c.replayOnce)
}

func (c *Consumer) replayOnce(ctx context.Context) {
	_, parked, _ := c.cfg.tables()
	rows, err := c.cfg.DB.Query(ctx, `SELECT DISTINCT coalesce(key, ''::bytea) FROM `+parked+` WHERE consumer = $1 AND released_at IS NOT NULL`, c.cfg.Name)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("inbox: looking for released parked events failed; trying again", "error", err)
		}
		return
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return
	}
	for _, key := range keys {
		c.replayKey(ctx, key)
	}
}

// replayKey applies a released key's parked events in order, each in one
// transaction with the deletion of its parked row (its inbox row exists
// since it was parked), retrying a failing one as a lane would, and parking
// the key again, with the new error, when it still fails.
func (c *Consumer) replayKey(ctx context.Context, key []byte) {
	n, attempts := 0, 0
	for ctx.Err() == nil {
		ev, err := c.replayHead(ctx, key)
		if err == nil {
			if ev == nil {
				if n > 0 {
					c.log.Info("inbox: replayed a released aggregate; its new events flow again", "key", string(key), "events", n)
				}
				return
			}
			n, attempts = n+1, 0
			continue
		}
		var he *handlerError
		if !errors.As(err, &he) {
			if ctx.Err() == nil {
				c.log.Warn("inbox: replaying a released aggregate: database error; trying again next interval", "key", string(key), "error", err)
			}
			return
		}
		attempts++
		if attempts >= c.cfg.MaxAttempts || isPermanent(he.err) {
			if err := c.repark(ctx, key, ev, attempts, he.err); err != nil {
				c.log.Warn("inbox: parking a released aggregate again failed; the replay retries next interval", "key", string(key), "error", err)
				return
			}
			c.log.Error("inbox: a released event failed again; its aggregate is parked again", "key", string(key), "id", ev.ID, "attempts", attempts, "error", he.err)
			return
		}
		if sleepCtx(ctx, backoff(c.cfg.MinBackoff, c.cfg.MaxBackoff, attempts)) != nil {
			return
		}
	}
}

// replayHead applies the key's first parked event if it is released, and
// returns it (nil: nothing released is left). A handler error comes back as
// a *handlerError with the event.
func (c *Consumer) replayHead(ctx context.Context, key []byte) (ev *Event, err error) {
	_, parked, _ := c.cfg.tables()
	tx, err := c.cfg.DB.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil || ev == nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, c.pg.lockSQL, c.cfg.Name, key); err != nil {
		return nil, err
	}
	var hdrs []byte
	var released bool
	e := &Event{}
	err = tx.QueryRow(ctx, `SELECT event_id, topic, "partition", "offset", key, value, headers::text, released_at IS NOT NULL FROM `+parked+`
WHERE consumer = $1 AND coalesce(key, ''::bytea) = $2 ORDER BY seq NULLS FIRST, parked_at, event_id LIMIT 1 FOR UPDATE`, c.cfg.Name, key).
		Scan(&e.ID, &e.Topic, &e.Partition, &e.Offset, &e.Key, &e.Value, &hdrs, &released)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !released) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var hm map[string]string
	if err := json.Unmarshal(hdrs, &hm); err != nil {
		return nil, fmt.Errorf("headers of parked event %s: %w", e.ID, err)
	}
	for k, v := range hm {
		e.Headers = append(e.Headers, kgo.RecordHeader{Key: k, Value: []byte(v)})
	}
	e.Type = headerValue(e, "type")
	replayCloudEvent(e)
	if err := c.s.tracer.apply(ctx, c.cfg.Handler, tx, e); err != nil {
		return e, &handlerError{err}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM `+parked+` WHERE consumer = $1 AND event_id = $2`, c.cfg.Name, e.ID); err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	if c.m != nil {
		c.m.processed.WithLabelValues(c.cfg.Name, e.Topic, fmt.Sprint(e.Partition)).Inc()
	}
	return e, nil
}

// repark parks a released key again: ev gets the new error and attempts,
// and the key's rows are no longer released.
func (c *Consumer) repark(ctx context.Context, key []byte, ev *Event, attempts int, cause error) error {
	_, parked, _ := c.cfg.tables()
	return pgx.BeginFunc(ctx, c.cfg.DB, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, c.pg.lockSQL, c.cfg.Name, key); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+parked+` SET released_at = NULL WHERE consumer = $1 AND coalesce(key, ''::bytea) = $2`, c.cfg.Name, key); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+parked+` SET attempts = $3, error = $4, parked_at = now() WHERE consumer = $1 AND event_id = $2`, c.cfg.Name, ev.ID, attempts, cause.Error())
		return err
	})
}
