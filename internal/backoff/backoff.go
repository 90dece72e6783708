// Package backoff is the schedule on which outboxd retries what waiting can
// fix (a server or broker that is down): exponential, with a cap.
package backoff

import (
	"context"
	"time"
)

// Backoff is exponential with a cap. The zero value of cur starts at Min.
type Backoff struct {
	Min, Max, cur time.Duration
}

// Reset starts the schedule over.
func (b *Backoff) Reset() { b.cur = 0 }

// Next is how long the next Wait sleeps: what a log line says before it.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		return b.Min
	}
	return min(b.cur*2, b.Max)
}

// Wait sleeps for the next step, or until ctx ends (then it returns false).
func (b *Backoff) Wait(ctx context.Context) bool {
	b.cur = b.Next()
	t := time.NewTimer(b.cur)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
