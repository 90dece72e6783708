package outboxd

import "time"

// rateLog lets one log line through per interval and counts the ones it
// held back, so that a stream of identical warnings (an UPDATE of every row
// of an outbox table) shows as one line a minute with a count, not one line
// a row. The metric beside the warning still counts every row.
type rateLog struct {
	every time.Duration
	last  time.Time
	held  int
}

// skippedUpdateLogEvery is how often a skipped UPDATE is logged at most.
const skippedUpdateLogEvery = time.Minute

// allow reports whether to log now, and how many lines were held back since
// the last one that was.
func (r *rateLog) allow(now time.Time) (bool, int) {
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.held++
		return false, 0
	}
	held := r.held
	r.last, r.held = now, 0
	return true, held
}
