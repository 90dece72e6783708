package outboxd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/internal/humanize"
	"github.com/outboxd/outboxd/internal/redact"
	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/slot"
)

// monitor watches what the relay cannot see from the replication stream: the
// slot as the server reports it (lag, retained WAL, wal_status), Kafka's
// reachability, and the replication delay measured by heartbeat messages. It
// runs on its own ordinary connection, in one goroutine owned by run.
type monitor struct {
	dsn               string
	slot              string
	interval          time.Duration // slot and broker polls
	heartbeatInterval time.Duration // 0 disables heartbeats
	maxSlotLag        int64
	log               *slog.Logger
	m                 *metrics
	st                *state
	sink              sink.Sink
	watcher           sink.CheckpointWatcher // exactly-once mode's checkpoint partition; nil if none
	lastLagWarn       time.Time
	lastHeartbeatWarn time.Time
	// dial opens the monitor's connection; nil: connectSQL. Tests script it.
	dial func(ctx context.Context, dsn string) (sqlConn, error)
}

// slotView is the monitor's latest reading of the slot as /status shows
// it (slot_server_view): zeros where the server has no value, and -1 for an
// unlimited safe_wal_size.
type slotView struct {
	Found          bool   `json:"found"`
	Plugin         string `json:"plugin"`
	Active         bool   `json:"active"`
	ActivePID      int    `json:"active_pid"`
	ConfirmedFlush string `json:"confirmed_flush_lsn"`
	LagBytes       int64  `json:"lag_bytes"`
	RetainedBytes  int64  `json:"retained_wal_bytes"`
	WALStatus      string `json:"wal_status"`
	SafeWALSize    int64  `json:"safe_wal_size_bytes"`
	Failover       bool   `json:"failover"` // PostgreSQL 17+: copied to standbys that sync slots
	Synced         bool   `json:"synced"`   // this copy was synchronized from a primary
	At             time.Time
}

func newSlotView(s slot.Slot, found bool, at time.Time) slotView {
	v := slotView{Found: found, Plugin: s.Plugin, Active: s.Active, ActivePID: s.ActivePID, WALStatus: s.WALStatus,
		LagBytes: orZero(s.LagBytes), RetainedBytes: orZero(s.RetainedBytes), SafeWALSize: -1, Failover: s.Failover, Synced: s.Synced, At: at}
	if s.ConfirmedFlush != 0 {
		v.ConfirmedFlush = s.ConfirmedFlush.String()
	}
	if s.SafeWALSize != nil {
		v.SafeWALSize = *s.SafeWALSize
	}
	return v
}

func orZero(n *int64) int64 {
	if n == nil {
		return 0
	}
	return *n
}

func (mo *monitor) run(ctx context.Context) {
	dial := mo.dial
	if dial == nil {
		dial = connectSQL
	}
	var conn sqlConn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	// connected reconnects lazily: a failed connection is retried at the next tick.
	connected := func() bool {
		if conn != nil && !conn.IsClosed() {
			return true
		}
		c, err := dial(ctx, mo.dsn)
		if err != nil {
			mo.log.Debug("monitor: postgres connect failed", "err", redact.Err(err, mo.dsn))
			return false
		}
		conn = c
		return true
	}
	brokerOK := true
	poll := func() {
		if connected() {
			mo.pollSlot(ctx, conn)
			mo.pollStandbys(ctx, conn)
		}
		brokerOK = mo.pollBroker(ctx, brokerOK)
		mo.pollCheckpoint(ctx)
		mo.checkLag()
	}
	pollTick := time.NewTicker(mo.interval)
	defer pollTick.Stop()
	var hb <-chan time.Time
	if mo.heartbeatInterval > 0 {
		t := time.NewTicker(mo.heartbeatInterval)
		defer t.Stop()
		hb = t.C
	}
	poll() // at once: /readyz should not wait a whole interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-pollTick.C:
			poll()
		case <-hb:
			if connected() {
				mo.heartbeat(ctx, conn)
			}
		}
	}
}

func (mo *monitor) pollSlot(ctx context.Context, conn sqlConn) {
	qctx, cancel := context.WithTimeout(ctx, mo.interval)
	defer cancel()
	row, found, err := conn.Slot(qctx, mo.slot)
	if err != nil {
		mo.log.Debug("monitor: slot poll failed", "err", redact.Err(err, mo.dsn))
		return
	}
	v := newSlotView(row, found, time.Now())
	mo.m.slotLag.Set(float64(v.LagBytes))
	mo.m.slotRetained.Set(float64(v.RetainedBytes))
	mo.m.slotSafeWAL.Set(float64(v.SafeWALSize))
	for _, s := range []string{"reserved", "extended", "unreserved", "lost"} {
		val := 0.0
		if s == v.WALStatus {
			val = 1
		}
		mo.m.slotWALStatus.WithLabelValues(s).Set(val)
	}
	mo.st.setSlotView(v)
}

func (mo *monitor) pollBroker(ctx context.Context, wasOK bool) bool {
	pctx, cancel := context.WithTimeout(ctx, mo.interval)
	defer cancel()
	err := mo.sink.Ping(pctx)
	ok := err == nil
	if ctx.Err() != nil {
		return wasOK
	}
	switch {
	case wasOK && !ok:
		mo.log.Warn("broker unreachable; events wait in the slot, nothing is confirmed past them", "err", err)
		mo.st.setErr(fmt.Errorf("broker unreachable: %w", err))
	case !wasOK && ok:
		mo.log.Info("broker reachable again")
		mo.m.reconnects.WithLabelValues(brokerLabel(mo.sink)).Inc()
	}
	mo.st.setBrokerOK(ok)
	return ok
}

// heartbeat writes a non-transactional logical message: no table, nothing in
// the publication, and the slot delivers it in WAL order, so the time until it
// arrives is the replication delay.
func (mo *monitor) heartbeat(ctx context.Context, conn sqlConn) {
	hctx, cancel := context.WithTimeout(ctx, mo.heartbeatInterval)
	defer cancel()
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	err := conn.EmitHeartbeat(hctx, heartbeatPrefix, now)
	if ctx.Err() != nil {
		return
	}
	mo.heartbeatResult(err)
}

// heartbeatWarnEvery is how often a heartbeat failure that persists is
// logged again.
const heartbeatWarnEvery = 5 * time.Minute

// heartbeatResult records a heartbeat's outcome: a failure is counted,
// logged (the first of a run at once, then every heartbeatWarnEvery) with
// its fix, shown on /status and in /readyz's reason, and makes the
// replication delay unknown (NaN) rather than the last, good-looking value.
func (mo *monitor) heartbeatResult(err error) {
	if err == nil {
		if mo.st.setHeartbeatErr("") != "" {
			mo.log.Info("heartbeats work again")
		}
		return
	}
	mo.m.heartbeatErrors.Inc()
	mo.m.replDelay.Set(math.NaN())
	why := "heartbeats fail, so outboxd_replication_delay_seconds is unknown: " + redact.Err(err, mo.dsn).Error()
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42501" {
		why += "; outboxd's role may not call pg_logical_emit_message (REVOKEd from PUBLIC?): " +
			"GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO <outboxd's role> (PostgreSQL 17+: pg_logical_emit_message(boolean, text, text, boolean)), " +
			"run outboxd setup --role <outboxd's role> again, or run without --heartbeat-interval"
	}
	if prev := mo.st.setHeartbeatErr(why); prev != why || time.Since(mo.lastHeartbeatWarn) >= heartbeatWarnEvery {
		mo.lastHeartbeatWarn = time.Now()
		mo.log.Warn("heartbeat failed", "err", why)
	}
}

// onHeartbeat runs in the relay's goroutine when a heartbeat arrives.
func (mo *monitor) onHeartbeat(content []byte, received time.Time) {
	ns, err := strconv.ParseInt(string(content), 10, 64)
	if err != nil {
		return
	}
	mo.m.replDelay.Set(received.Sub(time.Unix(0, ns)).Seconds())
}

// checkLag warns (once a minute) while the slot lags more than allowed, with
// the most likely cause.
func (mo *monitor) checkLag() {
	lag := mo.st.slotView().LagBytes
	if mo.maxSlotLag <= 0 || lag <= mo.maxSlotLag || time.Since(mo.lastLagWarn) < time.Minute {
		return
	}
	mo.lastLagWarn = time.Now()
	mo.log.Warn("replication slot lag above --max-slot-lag", "lag", humanize.Bytes(lag), "max", humanize.Bytes(mo.maxSlotLag), "cause", mo.st.lagCause())
}
