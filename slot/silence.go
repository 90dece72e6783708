package slot

import "time"

// Silence measures how long a slot holder's client has not replied, from
// the server's own observations only.
//
// Why not reply_time: pg_stat_replication's reply_time is the send time the
// client writes into its status message, on the client's clock. now() -
// reply_time mixes two clocks: an active host whose clock runs more than
// --replication-timeout behind the database's looked silent at once and
// was terminated, and two such hosts took the slot from each other. What
// the server does see is that each reply changes reply_time (before the
// first one, backend_start stands in). So Silence compares successive
// observations: it remembers the reply mark it last saw and the server's
// now() when it first saw it, and the silence is how long, on the server's
// clock, the mark has not changed. A client that replies moves the mark,
// whatever its clock says; one that vanished leaves it. The first
// observation of a mark is 0: an instance that just started watching
// presumes nothing, and takes over a vanished holder --replication-timeout
// after it started watching it.
//
// A Silence is owned by one goroutine (the relay's).
type Silence struct {
	pid   int
	reply string
	since time.Time
}

// Observe sets s.Holder.Silent from s and what w saw before: the time on
// the server's clock since the holder's reply mark last changed; -1 when it
// cannot be known (PostgreSQL hides the mark from the querying role, the
// slot is inactive, or w is nil: a single look tells nothing).
func (w *Silence) Observe(s *Slot) {
	s.Holder.Silent = -1
	if w == nil || !s.Active || s.Holder.Reply == "" || s.ServerTime.IsZero() {
		return
	}
	if s.ActivePID != w.pid || s.Holder.Reply != w.reply || s.ServerTime.Before(w.since) {
		w.pid, w.reply, w.since = s.ActivePID, s.Holder.Reply, s.ServerTime
	}
	s.Holder.Silent = s.ServerTime.Sub(w.since)
}
