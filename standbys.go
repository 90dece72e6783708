package outboxd

import (
	"context"
	"strings"
)

// pollStandbys looks for physical standbys that could be promoted with a
// copy of a failover slot that is ahead of their WAL. PostgreSQL 17+ holds
// logical walsenders back until the standbys named in
// synchronized_standby_slots have the WAL; a streaming standby whose slot is
// not named there may lag, and after its promotion Kafka holds events the
// new primary never had (phantom events). outboxd warns once per change,
// shows the standbys on /status and counts them in
// outboxd_unprotected_standbys.
func (mo *monitor) pollStandbys(ctx context.Context, conn sqlConn) {
	qctx, cancel := context.WithTimeout(ctx, mo.interval)
	defer cancel()
	listed, slots, err := conn.Standbys(qctx, mo.slot)
	if err != nil {
		mo.log.Debug("monitor: standby poll failed", "err", err)
		return
	}
	protected := map[string]bool{}
	for _, n := range strings.Split(listed, ",") {
		protected[strings.Trim(strings.TrimSpace(n), `"`)] = true
	}
	var unprotected []string
	for _, s := range slots {
		if !protected[s] {
			unprotected = append(unprotected, s)
		}
	}
	mo.m.unprotectedStandbys.Set(float64(len(unprotected)))
	changed := mo.st.setUnprotected(unprotected)
	if changed && len(unprotected) > 0 {
		mo.log.Warn("a physical standby streams through a slot that synchronized_standby_slots does not name: after its promotion the broker may hold events the new primary never had (phantom events)",
			"standby_slots", strings.Join(unprotected, ","), "synchronized_standby_slots", listed,
			"fix", "ALTER SYSTEM SET synchronized_standby_slots = '"+strings.Join(append(nonEmpty(strings.Split(listed, ",")), unprotected...), ",")+"'; SELECT pg_reload_conf();")
	}
}

func nonEmpty(list []string) []string {
	var out []string
	for _, s := range list {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
