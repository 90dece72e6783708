package outboxd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/outboxd/outboxd/slot"
)

type pingSink struct {
	*heldSink
	err error
}

func (p *pingSink) Ping(context.Context) error { return p.err }

// The monitor's broker poll flips /readyz and counts a reconnection when
// Kafka comes back; the lag guard warns with the likely cause, once a
// minute; heartbeats set the replication delay.
func TestMonitorKafkaLagAndHeartbeat(t *testing.T) {
	var logs bytes.Buffer
	st := &state{slotName: "s", maxSlotLag: 100}
	m := newMetrics("test", st)
	ps := &pingSink{heldSink: newHeldSink(), err: errors.New("dial: connection refused")}
	mo := &monitor{interval: time.Second, maxSlotLag: 100, log: slog.New(slog.NewTextHandler(&logs, nil)), m: m, st: st, sink: ps}
	ok := mo.pollKafka(context.Background(), true)
	if ok || !strings.Contains(logs.String(), "kafka unreachable") {
		t.Fatalf("down: ok=%v log %s", ok, logs.String())
	}
	ps.err = nil
	if !mo.pollKafka(context.Background(), ok) || testutil.ToFloat64(m.reconnects.WithLabelValues("kafka")) != 1 {
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
	if HumanBytes(1536<<20) != "1.5GiB" || HumanBytes(-2048) != "-2.0KiB" {
		t.Fatal("helpers")
	}
}
