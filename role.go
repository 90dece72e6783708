package outboxd

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxd/outboxd/slot"
)

// Several outboxd instances may run on one slot: PostgreSQL lets one of
// them stream (the active) and refuses the others, which stand by. A
// standby is healthy and ready, watches the slot on an ordinary connection
// and takes it over as soon as the active lets go. No lease or lock is
// needed: the slot is the lock, and PostgreSQL releases it the moment the
// active's walsender exits.

// role is what /status's role says this instance is doing.
type role string

const (
	roleActive   role = "active"   // streaming from the slot
	roleStandby  role = "standby"  // another process holds the slot
	roleInactive role = "inactive" // neither: starting, reconnecting, or stopped on an error
)

// standbyPoll is how often a standby looks at the slot. The walsender of an
// active that exits or whose connection closes releases the slot at once,
// so a standby takes over within standbyPoll plus one connection setup.
const standbyPoll = 200 * time.Millisecond

// standByAndTakeOver stands by (standBy) and tells the mode, whose next
// session may need to start differently (exactlyOnce.standby).
func (r *relay) standByAndTakeOver(ctx context.Context, busy *slot.BusyError) {
	r.mode.standby()
	r.standBy(ctx, busy)
}

// otherHolder is the process that holds the slot now if it is not this
// one's last walsender, or nil: after a fencing, whether another instance
// took the slot over (exactlyOnce.fenced).
func (r *relay) otherHolder(ctx context.Context) *slot.BusyError {
	conn, err := r.dialSQL(ctx, r.cfg.Postgres)
	if err != nil {
		return nil
	}
	holder, err := currentHolder(ctx, conn, r.cfg.Slot, r.cfg.ReplicationTimeout, &r.silence)
	conn.Close(context.WithoutCancel(ctx))
	if err != nil || holder == nil || holder.PID == r.lastPID {
		return nil
	}
	return holder
}

// standBy runs while the slot is busy: it marks this instance a standby and
// returns once the slot is free, or its holder is an outboxd whose client
// has been silent for --replication-timeout (Prepare then terminates it), or
// the slot cannot be watched (the relay's next session then reports why).
// It returns false when ctx ends.
func (r *relay) standBy(ctx context.Context, busy *slot.BusyError) bool {
	r.state.setStandby(busy)
	r.log.Info("standing by: another process streams from the slot; taking over when it lets go",
		"slot", busy.Slot, "holder_pid", busy.PID, "reason", busy.Error())
	conn, err := r.dialSQL(ctx, r.cfg.Postgres)
	if err != nil {
		// The next session reports the cause; do not spin meanwhile.
		r.state.setStandby(nil)
		return sleepCtx(ctx, 5*standbyPoll)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := time.NewTicker(standbyPoll)
	defer t.Stop()
	unknown := 0 // consecutive polls that could not see the holder's silence
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		holder, err := currentHolder(ctx, conn, r.cfg.Slot, r.cfg.ReplicationTimeout, &r.silence)
		if holder != nil && holder.SilenceUnknown {
			unknown++
		} else {
			unknown = 0
		}
		if unknown == 5 && !r.warnedSilence { // not a walsender still starting: a role that may not see it
			r.warnedSilence = true
			r.log.Warn("standing by without seeing whether the active's client replies: pg_stat_replication shows a walsender's reply_time only to superusers and pg_read_all_stats; "+
				"a frozen or partitioned active keeps the slot until PostgreSQL's wal_sender_timeout ends its walsender, not --replication-timeout. "+
				"To take over after --replication-timeout: GRANT pg_read_all_stats TO <outboxd's role>", "slot", r.cfg.Slot)
		}
		if free := holder == nil; err != nil || free {
			if err == nil {
				r.log.Info("the slot is free; taking over", "slot", r.cfg.Slot)
			}
			return ctx.Err() == nil
		}
	}
}

// sleepCtx waits d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// slotBusy reports whether another process streams from the slot as
// outboxd starts. In exactly-once mode registering the transactional id
// would fence it, so such an instance skips that and stands by; the relay
// starts a fresh producer once it holds the slot (exactlyOnce.prepare).
// Unknown (PostgreSQL unreachable) counts as free: the relay reports why.
func slotBusy(ctx context.Context, dsn, name string, staleAfter time.Duration) bool {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := connectSQL(cctx, dsn)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	busy, err := currentHolder(cctx, conn, name, staleAfter, nil)
	return err == nil && busy != nil
}

// currentHolder describes who holds the slot, or nil when it is free to
// take: inactive, gone, or held by an outboxd walsender whose client has not
// replied for staleAfter (Prepare terminates it), as silence measures it
// over successive looks on the server's clock (slot.Silence; nil: one look,
// never silent).
func currentHolder(ctx context.Context, conn sqlConn, name string, staleAfter time.Duration, silence *slot.Silence) (*slot.BusyError, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, found, err := conn.Slot(qctx, name)
	if err != nil {
		return nil, fmt.Errorf("watching slot %q: %w", name, err)
	}
	silence.Observe(&s)
	if !found || !s.Active || s.Stale(staleAfter) {
		return nil, nil
	}
	busy := s.Busy()
	busy.SilenceUnknown = s.Holder.Application == "outboxd" && s.Holder.Reply == ""
	return busy, nil
}

// dialSQL opens an ordinary connection through the relay's seam.
func (r *relay) dialSQL(ctx context.Context, dsn string) (sqlConn, error) {
	if r.dial != nil {
		return r.dial(ctx, dsn)
	}
	return connectSQL(ctx, dsn)
}
