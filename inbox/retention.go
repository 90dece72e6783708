package inbox

import (
	"context"
	"time"
)

// retain deletes inbox rows older than Retention every RetentionInterval,
// in batches of RetentionBatch until none is left, until ctx ends. Run owns
// it. A failed DELETE is logged and tried again next interval: the table
// only grows meanwhile, nothing is lost.
func (c *Consumer) retain(ctx context.Context) {
	every(ctx, c.cfg.RetentionInterval, func(ctx context.Context) { c.expireOnce(ctx) })
}

// every runs do at once and then at each tick of interval, until ctx ends. A
// run that outlasts interval delays the next instead of stacking them (the
// ticker drops the ticks it missed).
func every(ctx context.Context, interval time.Duration, do func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		do(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Consumer) expireOnce(ctx context.Context) int64 {
	var total int64
	for ctx.Err() == nil {
		n, err := c.pg.expire(ctx, c.inbox, c.cfg.Retention.Seconds(), c.cfg.RetentionBatch)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("inbox: deleting expired inbox rows failed; retrying next interval", "error", err)
			}
			break
		}
		total += n
		c.m.retained.WithLabelValues(c.cfg.Name).Add(float64(n))
		if n < int64(c.cfg.RetentionBatch) {
			break
		}
	}
	if total > 0 {
		c.log.Info("inbox: deleted expired inbox rows", "rows", total, "retention", c.cfg.Retention)
	}
	return total
}
