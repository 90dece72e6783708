package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// TestOutboxdBinariesAB compares two outboxd binaries on the drain case's
// figures: the same backlog drained by A (OUTBOXD_BENCH_AB, a binary built
// from another commit) and by B (this checkout's, or OUTBOXD_BENCH_AB_B),
// alternately A B B A …, one slot per drain, each drain's outboxd and
// walsender CPU per event, allocations and context switches per event. The
// verdict is per pair of neighbouring drains (B's outboxd ÷ walsender over
// A's), so that a machine whose load drifts weighs on both alike; the
// medians of each side come with it. Optionally the latency case too (at
// 1,000 ev/s unless OUTBOXD_BENCH_AB_RATE says otherwise), alternating
// likewise (p99 of each run). A measurement, not a test: it runs only when
// asked, and writes no results file.
//
//	go build -o /tmp/outboxd-a ./cmd/outboxd   # on the commit to compare with
//	OUTBOXD_BENCH_AB=/tmp/outboxd-a go test -count=1 -run TestOutboxdBinariesAB -v ./test/bench/
//
// OUTBOXD_BENCH_AB_REPS (drains per binary and transaction size, 5),
// OUTBOXD_BENCH_AB_TXN (events per transaction, "100,1"), OUTBOXD_BENCH_AB_EVENTS
// (200000), OUTBOXD_BENCH_AB_BROKER (kfake or apache), OUTBOXD_BENCH_AB_LATENCY
// (latency runs per binary, 0), OUTBOXD_BENCH_AB_RATE (their events a
// second, 1000), OUTBOXD_BENCH_AB_PERF (a directory: perf
// record each drain's outboxd and walsender there, as the bench's -perf-dir;
// with OUTBOXD_BENCH_PERF_EVENTS, e.g. sched:sched_switch, those events
// with their call chains instead of CPU samples: where each thread blocks).
func TestOutboxdBinariesAB(t *testing.T) {
	a := os.Getenv("OUTBOXD_BENCH_AB")
	if a == "" {
		t.Skip("a measurement: set OUTBOXD_BENCH_AB to the outboxd binary to compare with")
	}
	env := func(k string, def int) int {
		if n, err := strconv.Atoi(os.Getenv(k)); err == nil && n >= 0 {
			return n
		}
		return def
	}
	reps, events, latReps := max(1, env("OUTBOXD_BENCH_AB_REPS", 5)), env("OUTBOXD_BENCH_AB_EVENTS", 200_000), env("OUTBOXD_BENCH_AB_LATENCY", 0)
	rate := max(1, env("OUTBOXD_BENCH_AB_RATE", 1000))
	var sizes []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("OUTBOXD_BENCH_AB_TXN"), "100,1"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || events%n != 0 {
			t.Fatalf("OUTBOXD_BENCH_AB_TXN: %q is not a transaction size that divides %d events", f, events)
		}
		sizes = append(sizes, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cfg := DefaultConfig(false)
	cfg.PerfDir = os.Getenv("OUTBOXD_BENCH_AB_PERF")
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	bins := [2]string{a, cmp.Or(os.Getenv("OUTBOXD_BENCH_AB_B"), e.bin)}
	if err := e.StartBroker(ctx, cmp.Or(os.Getenv("OUTBOXD_BENCH_AB_BROKER"), harness.KindKfake)); err != nil {
		t.Fatal(err)
	}
	// abba is the binary of the i-th run: A B B A A B B A …
	abba := func(i int) int { return (i%2 + i/2%2) % 2 }
	for _, perTxn := range sizes {
		w, err := e.newWorld(ctx, fmt.Sprintf("ab_%d", perTxn))
		if err != nil {
			t.Fatal(err)
		}
		slot := func(i int) string { return fmt.Sprintf("ab_%d_%d", perTxn, i) }
		for i := range 2*reps + 1 { // the last: the read-only reader's, for the end LSN
			if err := w.createSlot(ctx, slot(i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := w.writeBacklog(ctx, events, perTxn, 200); err != nil {
			t.Fatal(err)
		}
		ceil, err := e.readCeiling(ctx, w, slot(2*reps), events, caseTimeout(events))
		if err != nil {
			t.Fatal(err)
		}
		var ratio, ob, allocs, cs [2][]float64
		var pairs []float64
		for i := range 2 * reps {
			b := abba(i)
			e.bin = bins[b]
			r, err := e.drainOutboxd(ctx, w, slot(i), int64(events), ceil.EndLSN, caseTimeout(events), false)
			if err != nil {
				t.Fatal(err)
			}
			per := func(d time.Duration) float64 { return float64(d) / float64(events) / 1e3 }
			x := per(r.OutboxdCPU) / per(r.CPU.Walsender)
			ratio[b], ob[b] = append(ratio[b], x), append(ob[b], per(r.OutboxdCPU))
			allocs[b], cs[b] = append(allocs[b], float64(r.Allocs)/float64(events)), append(cs[b], float64(r.CtxSwitches)/float64(events))
			t.Logf("%d ev/txn %s: outboxd %.2f µs/ev, walsender %.2f µs/ev (%.2f×), %.2f allocs/ev, %.3f context switches/ev, peak RSS %d MiB, drain %s, others %s",
				perTxn, "AB"[b:b+1], per(r.OutboxdCPU), per(r.CPU.Walsender), x, float64(r.Allocs)/float64(events), float64(r.CtxSwitches)/float64(events), r.PeakRSS>>20,
				r.Elapsed.Round(time.Millisecond), r.CPU.Others().Round(10*time.Millisecond))
			if i%2 == 1 {
				pairs = append(pairs, ratio[1][len(ratio[1])-1]/ratio[0][len(ratio[0])-1])
			}
		}
		w.drop()
		lower := 0
		for _, p := range pairs {
			if p < 1 {
				lower++
			}
		}
		lo, hi := slices.Min(pairs), slices.Max(pairs)
		t.Logf("%d ev/txn, %d drains each (load %s): outboxd ÷ walsender A %.2f, B %.2f; B ÷ A by pair: median %.2f (%.2f–%.2f), lower in %d of %d; outboxd µs/ev A %.2f, B %.2f; allocs/ev A %.2f, B %.2f; context switches/ev A %.3f, B %.3f",
			perTxn, reps, loadAvg(), median(ratio[0]), median(ratio[1]), median(pairs), lo, hi, lower, len(pairs),
			median(ob[0]), median(ob[1]), median(allocs[0]), median(allocs[1]), median(cs[0]), median(cs[1]))
	}
	if latReps == 0 {
		return
	}
	var p99 [2][]float64
	for i := range 2 * latReps {
		b := abba(i)
		e.bin = bins[b]
		// Each run's own progress topic: the slot's name repeats, and a
		// record of the previous run's slot would be a gap for this one.
		e.cfg.OutboxdArgs = []string{"--progress-topic", fmt.Sprintf("ab_progress_%d", i)}
		l, err := e.latency(ctx, "outboxd", rate, e.cfg.LatencyDuration, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("latency %d ev/s %s: p50 %s p95 %s p99 %s max %s, writers behind: %v", rate, "AB"[b:b+1], l.P50, l.P95, l.P99, l.Max, l.Behind())
		p99[b] = append(p99[b], float64(l.P99)/1e6)
	}
	t.Logf("latency %d ev/s, %d runs each: p99 median A %.2f ms, B %.2f ms", rate, latReps, median(p99[0]), median(p99[1]))
}
