package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestWalsenderModes measures what pgoutput's binary mode saves the
// walsender: the same backlog read read-only (no outboxd beside it)
// OUTBOXD_BENCH_MODES times in text and as often in binary, alternating,
// and the walsender's CPU per event compared by median. CPU time rather
// than wall time, and interleaved runs, so that a loaded machine weighs on
// both modes alike. A measurement, not a test: it runs only when asked,
//
//	OUTBOXD_BENCH_MODES=8 go test -count=1 -run TestWalsenderModes -v ./test/bench/
func TestWalsenderModes(t *testing.T) {
	reps, _ := strconv.Atoi(os.Getenv("OUTBOXD_BENCH_MODES"))
	if reps <= 0 {
		t.Skip("a measurement: set OUTBOXD_BENCH_MODES to the reads per mode")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cfg := DefaultConfig(false)
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.StartBroker(ctx, harness.KindKfake); err != nil { // newWorld creates the topic
		t.Fatal(err)
	}
	const events = 100_000
	for _, perTxn := range []int{1, 10, 100} {
		w, err := e.newWorld(ctx, fmt.Sprintf("modes_%d", perTxn))
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 * reps {
			if err := w.createSlot(ctx, fmt.Sprintf("modes_%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		b, err := w.writeBacklog(ctx, events, perTxn, 200)
		if err != nil {
			t.Fatal(err)
		}
		per := map[bool][]time.Duration{}
		rate := map[bool][]float64{}
		for i := range 2 * reps {
			bin := i%2 == 1
			if (i/2)%2 == 1 {
				bin = !bin // ABBA: neither mode always goes first
			}
			var args []string
			if bin {
				args = binaryArgs
			}
			r, err := e.readCeilingArgs(ctx, w, fmt.Sprintf("modes_%d", i), events, caseTimeout(events), args)
			if err != nil {
				t.Fatal(err)
			}
			if r.Inserts != events || r.Commits != b.Txns {
				t.Fatalf("read %d inserts in %d commits, want %d in %d", r.Inserts, r.Commits, events, b.Txns)
			}
			per[bin] = append(per[bin], r.CPU.Walsender/events)
			rate[bin] = append(rate[bin], EventsPerSec(events, r.Elapsed))
		}
		w.drop()
		med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
		medf := func(d []float64) float64 { slices.Sort(d); return d[len(d)/2] }
		tb, tt := med(per[true]), med(per[false])
		t.Logf("%d ev/txn, %d reads per mode (load %s): walsender CPU per event: binary %.2f µs, text %.2f µs (%.2f×); read rate median: binary %.0f ev/s, text %.0f ev/s; all binary %v, all text %v",
			perTxn, reps, loadAvg(), float64(tb)/1e3, float64(tt)/1e3, float64(tb)/float64(tt), medf(rate[true]), medf(rate[false]), per[true], per[false])
	}
}
