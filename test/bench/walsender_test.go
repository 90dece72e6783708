package bench

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestWalsenderRows: the busy share is the walsender's CPU over its life,
// checked (≥ 95%) at 1 and 10 ev/txn on kfake and Apache only; the binary
// row compares the modes' walsender CPU per event.
func TestWalsenderRows(t *testing.T) {
	split := func(ws time.Duration) CPUSplit {
		return CPUSplit{Wall: 2 * time.Second, Walsender: ws, Known: true, BrokerIs: "kfaked"}
	}
	run := func(elapsed, ws time.Duration) RelayRun {
		return RelayRun{Elapsed: elapsed, CPU: split(ws), WalsenderLife: 2 * time.Second}
	}
	c := RelayCase{Backlog: backlog{Events: 100_000, PerTxn: 10},
		Relays:       []RelayRun{run(2*time.Second, 1960*time.Millisecond), run(3*time.Second, 1900*time.Millisecond)},
		BinaryRelays: []RelayRun{run(2500*time.Millisecond, 2200*time.Millisecond)}}
	rows := walsenderRows(c, "kfake", 10)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %q", len(rows), rows)
	}
	if rows[0][2] != "98%: 50,000 ev/s of a saturated walsender's 51,020 ev/s" || rows[0][4] != "0.98" || rows[0][6] != "PASS" {
		t.Errorf("busy row %q", rows[0])
	}
	// Median walsender CPU per event: 19.6 and 19.0 µs → the upper middle, 19.6.
	if !strings.Contains(rows[1][2], "walsender 19.60 µs/ev") || !strings.Contains(rows[1][3], "binary: 40,000 ev/s, walsender 22.00 µs/ev") || rows[1][4] != "1.25×" {
		t.Errorf("binary row %q", rows[1])
	}
	c.Relays[0].CPU.Walsender = 1800 * time.Millisecond // 90%
	if r := walsenderRows(c, "apache", 1); r[0][6] != "FAIL" {
		t.Errorf("90%% busy on apache at 1 ev/txn: %q", r[0])
	}
	if r := walsenderRows(c, "apache-cluster", 10); r[0][6] != "—" {
		t.Errorf("3-node cluster: %q", r[0])
	}
	if r := walsenderRows(c, "kfake", 100); r[0][6] != "—" {
		t.Errorf("100 ev/txn: %q", r[0])
	}
	ceil := func(elapsed, ws time.Duration) CeilingRun {
		return CeilingRun{Elapsed: elapsed, CPU: CPUSplit{Walsender: ws, Known: true}}
	}
	c.Ceilings = []CeilingRun{ceil(2*time.Second, time.Second), ceil(3*time.Second, 1200*time.Millisecond), ceil(2*time.Second, 1100*time.Millisecond)}
	c.BinaryCeilings = []CeilingRun{ceil(1500*time.Millisecond, 800*time.Millisecond), ceil(2*time.Second, 900*time.Millisecond), ceil(2*time.Second, 700*time.Millisecond)}
	rows = walsenderRows(c, "kfake", 10)
	if len(rows) != 3 || rows[2][2] != "binary: 8.00 µs/ev (fastest read 66,667 ev/s)" || rows[2][3] != "text: 11.00 µs/ev (fastest read 50,000 ev/s)" || rows[2][4] != "CPU 0.73×" {
		t.Errorf("ceiling row %q", rows[len(rows)-1])
	}
	if life := procLife(os.Getpid()); life <= 0 || life > time.Hour {
		t.Errorf("procLife(self) = %s", life)
	}
}

// TestMemCurveRows: the default bounds' peak RSS is checked against 64 MiB
// on every broker (issue 34), each other bound is shown beside the default.
func TestMemCurveRows(t *testing.T) {
	m := &MemCurve{Backlog: backlog{Events: 200_000, PerTxn: 200_000}, Ceiling: CeilingRun{Elapsed: 4 * time.Second},
		Points: []MemPoint{
			{Bytes: 0, Runs: []RelayRun{{Elapsed: 5 * time.Second, PeakRSS: 70 << 20}, {Elapsed: 4 * time.Second, PeakRSS: 60 << 20}}},
			{Bytes: 8 << 20, Runs: []RelayRun{{Elapsed: 8 * time.Second, PeakRSS: 30 << 20}}},
		}}
	rows := memCurveRows(m, "apache")
	if len(rows) != 2 || rows[0][2] != "4.00 s (50,000 ev/s), peak RSS 70.0 MiB" || rows[0][6] != "FAIL" {
		t.Fatalf("rows %q", rows)
	}
	if rows[1][1] != "  ″ --max-inflight-bytes 8MiB" || rows[1][2] != "25,000 ev/s, peak RSS 30.0 MiB" || rows[1][4] != "0.50×" {
		t.Errorf("curve row %q", rows[1])
	}
	m.Points[0].Runs[0].PeakRSS = 50 << 20
	if r := memCurveRows(m, "kfake"); r[0][6] != "PASS" {
		t.Errorf("60 MiB: %q", r[0])
	}
	for _, b := range []string{"kfake", "apache", "apache-cluster", "nats", "rabbitmq", "external"} {
		if r := memCurveRows(m, b); r[0][5] != "≤ 64 MiB peak RSS" || r[0][6] != "PASS" {
			t.Errorf("%s, 60 MiB: %q", b, r[0])
		}
	}
	m.Points[0].Runs[1].PeakRSS = 64<<20 + 1
	for _, b := range []string{"nats", "rabbitmq"} {
		if r := memCurveRows(m, b); r[0][6] != "FAIL" {
			t.Errorf("%s, 64 MiB + 1 byte: %q", b, r[0])
		}
	}
	m.Points[0].Runs[1].PeakRSS = 64 << 20
	if r := memCurveRows(m, "nats"); r[0][6] != "PASS" {
		t.Errorf("nats, 64 MiB: %q", r[0])
	}
}

// TestPerEventRow: outboxd's CPU per event is set beside the walsender's
// with its allocations and context switches per event (medians over the
// runs), judged against 0.7× at 1 ev/txn and 0.6× at 100 on kfake and
// Apache, and not judged when others took more than a quarter of a core.
func TestPerEventRow(t *testing.T) {
	run := func(ob, ws, others time.Duration, allocs, cs int64) RelayRun {
		split := CPUSplit{Wall: 2 * time.Second, Walsender: ws, Outboxd: ob, Known: true, BrokerIs: "kfaked"}
		split.Busy = ob + ws + others
		return RelayRun{Elapsed: 2 * time.Second, OutboxdCPU: ob, CPU: split, Allocs: allocs, CtxSwitches: cs}
	}
	c := RelayCase{Backlog: backlog{Events: 100_000, PerTxn: 1}, Relays: []RelayRun{
		run(600*time.Millisecond, time.Second, 0, 500_000, 80_000),
		run(900*time.Millisecond, time.Second, 100*time.Millisecond, 700_000, 120_000),
		run(650*time.Millisecond, time.Second, 0, 600_000, 100_000),
	}}
	r := perEventRows(c, "kfake", 1)
	if len(r) != 1 {
		t.Fatalf("%d rows, want 1", len(r))
	}
	want := row{"", "  ″ CPU per event: outboxd ÷ walsender, median of 3 runs",
		"outboxd 6.50 µs/ev, 6.0 allocs/ev, 1.00 context switches/ev", "walsender 10.00 µs/ev", "0.65×", "≤ 0.70× walsender", "PASS"}
	if r[0] != want {
		t.Errorf("row\n%q\nwant\n%q", r[0], want)
	}
	if r := perEventRows(c, "apache", 100); r[0][5] != "≤ 0.60× walsender" || r[0][6] != "FAIL" {
		t.Errorf("0.65× at 100 ev/txn: %q", r[0])
	}
	if r := perEventRows(c, "apache-cluster", 1); r[0][6] != "—" {
		t.Errorf("3-node cluster: %q", r[0])
	}
	if r := perEventRows(c, "kfake", 10); r[0][6] != "—" {
		t.Errorf("10 ev/txn: %q", r[0])
	}
	c.Relays[1] = run(900*time.Millisecond, time.Second, 600*time.Millisecond, -1, 120_000) // others 30% of a core
	r = perEventRows(c, "kfake", 1)
	if r[0][1] != "  ″ CPU per event: outboxd ÷ walsender, median of 3 runs, 1 busy" || r[0][6] != "busy" ||
		r[0][2] != "outboxd 6.50 µs/ev, 6.0 allocs/ev, 1.00 context switches/ev" {
		t.Errorf("a busy run (others 30%% of a core) and one without allocations: %q", r[0])
	}
	if !c.Relays[1].CPU.Contended() || c.Relays[0].CPU.Contended() {
		t.Error("Contended: others above a quarter of a core")
	}
}

// TestSchedRows: the sched row sets the default runs' median outboxd ÷
// walsender beside --sched-batch=false's, round by round.
func TestSchedRows(t *testing.T) {
	run := func(ob, ws time.Duration, cs int64) RelayRun {
		return RelayRun{OutboxdCPU: ob, CPU: CPUSplit{Walsender: ws, Known: true}, CtxSwitches: cs}
	}
	c := RelayCase{Backlog: backlog{Events: 100_000, PerTxn: 100},
		Relays: []RelayRun{run(300*time.Millisecond, 400*time.Millisecond, 3000), run(200*time.Millisecond, 400*time.Millisecond, 2000), run(280*time.Millisecond, 400*time.Millisecond, 2500)}}
	if rows := schedRows(c); rows != nil {
		t.Fatalf("rows without --sched-batch=false runs: %q", rows)
	}
	c.SchedOff = []RelayRun{run(360*time.Millisecond, 400*time.Millisecond, 9000), run(180*time.Millisecond, 400*time.Millisecond, 4000), run(320*time.Millisecond, 400*time.Millisecond, 5000)}
	rows := schedRows(c)
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1: %q", len(rows), rows)
	}
	// Ratios 0.75, 0.50, 0.70 (median 0.70) beside 0.90, 0.45, 0.80 (0.80):
	// lower in rounds 1 and 3.
	r := rows[0]
	if r[2] != "SCHED_BATCH: outboxd 2.80 µs/ev = 0.70× walsender, 0.03 context switches/ev; lower in 2 of 3 rounds" ||
		r[3] != "default policy: outboxd 3.20 µs/ev = 0.80× walsender, 0.05 context switches/ev" || r[4] != "0.87×" {
		t.Errorf("sched row %q", r)
	}
}
