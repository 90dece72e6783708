package bench

import (
	"strings"
	"testing"
	"time"
)

// TestCloudEventsRows: each mode's row sets its fastest drain and median CPU
// per event beside the plain runs'; a case without CloudEvents runs has none.
func TestCloudEventsRows(t *testing.T) {
	run := func(elapsed time.Duration, cpuMS int) RelayRun {
		return RelayRun{Elapsed: elapsed, OutboxdCPU: time.Duration(cpuMS) * time.Millisecond}
	}
	c := RelayCase{Backlog: backlog{Events: 100000},
		Ceilings: []CeilingRun{{Elapsed: time.Second}},
		Relays:   []RelayRun{run(2*time.Second, 1000), run(3*time.Second, 1200)},
		CloudEvents: map[string][]RelayRun{
			"binary":     {run(2*time.Second, 1100), run(4*time.Second, 1300)},
			"structured": {run(3*time.Second, 1500)},
		}}
	rows := cloudEventsRows(c)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %v", len(rows), rows)
	}
	// Medians: plain 12 µs/ev (upper middle of 10 and 12), binary 13, structured 15.
	for i, want := range []struct{ mode, cpu, ratio string }{{"binary", "13.00 µs/ev", "CPU +8.3%"}, {"structured", "15.00 µs/ev", "CPU +25.0%"}} {
		if !strings.Contains(rows[i][1], want.mode) || !strings.Contains(rows[i][2], want.cpu) || !strings.Contains(rows[i][3], "12.00 µs/ev") || rows[i][4] != want.ratio {
			t.Errorf("row %d: %q", i, rows[i])
		}
	}
	if rows := cloudEventsRows(RelayCase{Relays: c.Relays}); rows != nil {
		t.Errorf("rows without CloudEvents runs: %v", rows)
	}
}
