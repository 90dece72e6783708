package outboxd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/internal/humanize"
	"github.com/outboxd/outboxd/slot"
)

type pingSink struct {
	*heldSink
	err error
}

func (p *pingSink) Ping(context.Context) error { return p.err }
func (p *pingSink) Name() string               { return "kafka" }

// The monitor's broker poll flips /readyz and counts a reconnection when
// Kafka comes back; the lag guard warns with the likely cause, once a
// minute; heartbeats set the replication delay.
func TestMonitorKafkaLagAndHeartbeat(t *testing.T) {
	var logs bytes.Buffer
	st := &state{slotName: "s", maxSlotLag: 100}
	m := newMetrics("test", st)
	ps := &pingSink{heldSink: newHeldSink(), err: errors.New("dial: connection refused")}
	mo := &monitor{interval: time.Second, maxSlotLag: 100, log: slog.New(slog.NewTextHandler(&logs, nil)), m: m, st: st, sink: ps}
	ok := mo.pollBroker(context.Background(), true)
	if ok || !strings.Contains(logs.String(), "broker unreachable") {
		t.Fatalf("down: ok=%v log %s", ok, logs.String())
	}
	ps.err = nil
	if !mo.pollBroker(context.Background(), ok) || testutil.ToFloat64(m.reconnects.WithLabelValues("kafka")) != 1 {
		t.Fatal("kafka back: not reachable, or no reconnection counted")
	}
	st.mu.Lock()
	st.slot.LagBytes = 5000
	st.mu.Unlock()
	mo.checkLag()
	mo.checkLag()
	if n := strings.Count(logs.String(), "above --max-slot-lag"); n != 1 {
		t.Fatalf("%d lag warnings, want 1 within a minute", n)
	}
	sent := time.Now().Add(-1500 * time.Millisecond)
	mo.onHeartbeat([]byte(strconv.FormatInt(sent.UnixNano(), 10)), time.Now())
	if d := testutil.ToFloat64(m.replDelay); d < 1.4 || d > 5 {
		t.Fatalf("replication delay %v", d)
	}
	mo.onHeartbeat([]byte("not a number"), time.Now()) // ignored
	lag := int64(4096)
	if v := newSlotView(slot.Slot{Plugin: "pgoutput", ConfirmedFlush: 0x3000100, LagBytes: &lag}, true, time.Time{}); v != (slotView{Found: true,
		Plugin: "pgoutput", ConfirmedFlush: "0/3000100", LagBytes: 4096, SafeWALSize: -1}) {
		t.Fatalf("slot view %+v", v)
	}
	if v := newSlotView(slot.Slot{}, false, time.Time{}); v.ConfirmedFlush != "" || v.Found {
		t.Fatalf("missing slot's view %+v", v)
	}
	if humanize.Bytes(1536<<20) != "1.5GiB" || humanize.Bytes(-2048) != "-2.0KiB" {
		t.Fatal("helpers")
	}
}

// A heartbeat that fails (pg_logical_emit_message REVOKEd from PUBLIC) is
// counted, logged once per run of failures with the GRANT that fixes it,
// shown on /status and in /readyz's reason, and leaves the replication
// delay unknown, not at its last good value; a success clears it all.
func TestMonitorHeartbeatFailureIsVisible(t *testing.T) {
	var logs bytes.Buffer
	st := &state{slotName: "s", brokerOK: true}
	m := newMetrics("test", st)
	mo := &monitor{interval: time.Second, heartbeatInterval: time.Second, log: slog.New(slog.NewTextHandler(&logs, nil)), m: m, st: st}
	st.startSession(slot.NewWatermark(0), slot.Info{})
	m.replDelay.Set(0.01)
	denied := &pgconn.PgError{Code: "42501", Message: "permission denied for function pg_logical_emit_message"}
	mo.heartbeatResult(denied)
	mo.heartbeatResult(denied)
	if n := strings.Count(logs.String(), "heartbeat failed"); n != 1 || !strings.Contains(logs.String(), "GRANT EXECUTE ON FUNCTION pg_logical_emit_message") {
		t.Fatalf("%d warnings, want 1 naming the GRANT:\n%s", n, logs.String())
	}
	if v := testutil.ToFloat64(m.heartbeatErrors); v != 2 {
		t.Fatalf("outboxd_heartbeat_errors_total %v", v)
	}
	if d := testutil.ToFloat64(m.replDelay); !math.IsNaN(d) {
		t.Fatalf("replication delay %v while heartbeats fail, want NaN", d)
	}
	ok, why := st.ready()
	if !ok || !strings.Contains(why, "heartbeats fail") {
		t.Fatalf("/readyz %v %q", ok, why)
	}
	if s, _ := st.status()["heartbeat_error"].(string); !strings.Contains(s, "permission denied") {
		t.Fatalf("/status heartbeat_error %q", s)
	}
	mo.heartbeatResult(nil)
	if _, why := st.ready(); why != "streaming" || st.status()["heartbeat_error"] != nil || !strings.Contains(logs.String(), "heartbeats work again") {
		t.Fatalf("after a good heartbeat: %q, %v", why, st.status()["heartbeat_error"])
	}
}
