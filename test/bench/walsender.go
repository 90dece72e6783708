package bench

import (
	"fmt"
	"slices"
	"time"
)

// The walsender is the relay's true ceiling: one PostgreSQL process, one
// core, decoding the WAL and formatting every column. The read-only
// ceiling reader beside it competes with the walsender for the same cores,
// so on a small machine a relay can drain faster than that reader; the
// limit that matters is the walsender saturated. For a drain of n events
// whose walsender used W of CPU, a saturated walsender would deliver n/W
// events per second; outboxd's drain of n events in wall time T is then
// the fraction (n/T)/(n/W) = W/T of it: the walsender's busy share.
const targetWalsenderBusy = 0.95

// walsenderTarget says where the busy target applies: the 1 and 10 ev/txn
// drains on kfake and one Apache node (issue 27). At 100 ev/txn and on the
// 3-node cluster it is informational.
func walsenderTarget(broker string, perTxn int) bool {
	return (broker == "kfake" || broker == "apache") && (perTxn == 1 || perTxn == 10)
}

// busy is the walsender's share of one core over its life in the run.
func (r RelayRun) busy() float64 {
	if r.WalsenderLife <= 0 {
		return 0
	}
	return r.CPU.Walsender.Seconds() / r.WalsenderLife.Seconds()
}

// walsenderPerEvent is the walsender's CPU per event of the run.
func (r RelayRun) walsenderPerEvent(events int) time.Duration {
	return r.CPU.Walsender / time.Duration(max(1, events))
}

// medianWalsenderPerEvent over runs: CPU per event depends less on the
// machine's load than wall time does, so it is what compares modes.
func medianWalsenderPerEvent(runs []RelayRun, events int) time.Duration {
	var ds []time.Duration
	for _, r := range runs {
		ds = append(ds, r.walsenderPerEvent(events))
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// walsenderRows are a drain case's rows on the walsender: its busy share
// during outboxd's (fastest) drain, with the CPU split, and the binary
// pgoutput mode beside text when the case ran both.
func walsenderRows(c RelayCase, broker string, perTxn int) []row {
	r := c.Relay()
	if r.Elapsed == 0 || !r.CPU.Known {
		return nil
	}
	n := c.Backlog.Events
	busy := r.busy()
	sat := ""
	if r.CPU.Walsender > 0 {
		sat = fmt.Sprintf(" of a saturated walsender's %s", rate(int64(n), r.CPU.Walsender))
	}
	tgt, res := target(walsenderTarget(broker, perTxn), fmt.Sprintf("walsender ≥ %.0f%% busy", targetWalsenderBusy*100), busy >= targetWalsenderBusy)
	rows := []row{{"", "  ″ walsender busy = outboxd's drain ÷ a saturated walsender",
		fmt.Sprintf("%.0f%%: %s%s", busy*100, rate(int64(n), r.Elapsed), sat),
		"CPU: " + r.CPU.String(), fmt.Sprintf("%.2f", busy), tgt, res}}
	if len(c.BinaryRelays) > 0 {
		t := fastest(c.BinaryRelays)
		rs, _ := ratio(EventsPerSec(int64(n), r.Elapsed), EventsPerSec(int64(n), t.Elapsed))
		wb, wt := medianWalsenderPerEvent(c.Relays, n), medianWalsenderPerEvent(c.BinaryRelays, n)
		rows = append(rows, row{"", fmt.Sprintf("  ″ text pgoutput (outboxd's default) vs --pgoutput-binary auto, %d runs each, interleaved", len(c.Relays)),
			fmt.Sprintf("%s, walsender %.2f µs/ev, %.0f%% busy", rate(int64(n), r.Elapsed), float64(wb)/1e3, busy*100),
			fmt.Sprintf("binary: %s, walsender %.2f µs/ev, %.0f%% busy", rate(int64(n), t.Elapsed), float64(wt)/1e3, t.busy()*100),
			rs, "", ""})
	}
	if len(c.BinaryCeilings) > 0 {
		// The walsender alone, without outboxd beside it: its CPU per
		// event is the cleanest measure of what the mode costs it.
		b, t := medianCeilingPerEvent(c.BinaryCeilings, n), medianCeilingPerEvent(c.Ceilings, n)
		rs := "?"
		if t > 0 {
			rs = fmt.Sprintf("CPU %.2f×", float64(b)/float64(t))
		}
		var fb CeilingRun
		for _, r := range c.BinaryCeilings {
			if fb.Elapsed == 0 || r.Elapsed < fb.Elapsed {
				fb = r
			}
		}
		rows = append(rows, row{"", fmt.Sprintf("  ″ read-only reader's walsender, binary vs text pgoutput, median of %d", len(c.BinaryCeilings)),
			fmt.Sprintf("binary: %.2f µs/ev (fastest read %s)", float64(b)/1e3, rate(int64(n), fb.Elapsed)),
			fmt.Sprintf("text: %.2f µs/ev (fastest read %s)", float64(t)/1e3, rate(int64(n), c.Ceiling().Elapsed)), rs, "", ""})
	}
	return rows
}

// binaryModeArgs are the "binary" case's binary-mode runs' arguments (outboxd's
// default is text: binary did not drain faster here, see docs/performance.md).
var binaryModeArgs = []string{"--pgoutput-binary", "auto"}

// binaryArgs are the binary ceiling reads' extra pgoutput options.
var binaryArgs = []string{"binary 'true'"}

// medianCeilingPerEvent is the median walsender CPU per event of reads.
func medianCeilingPerEvent(runs []CeilingRun, events int) time.Duration {
	var ds []time.Duration
	for _, r := range runs {
		ds = append(ds, r.CPU.Walsender/time.Duration(max(1, events)))
	}
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// outboxdPerWalsender is the target for outboxd's CPU per event ÷ the
// walsender's (issue 34): 0.7 at 1 event per transaction, 0.6 at 100, on
// kfake and one Apache node; elsewhere it is informational (ok false).
func outboxdPerWalsender(broker string, perTxn int) (limit float64, ok bool) {
	if broker != "kfake" && broker != "apache" {
		return 0, false
	}
	switch perTxn {
	case 1:
		return 0.7, true
	case 100:
		return 0.6, true
	}
	return 0, false
}

// perEventRows is a drain case's row on outboxd's cost per event: its CPU
// per event (over its life) ÷ the walsender's over the same drain, with the
// allocations and context switches per event beside it, each the median
// over the runs. A run whose machine had others take more than a quarter
// of a core (CPUSplit.Contended) is counted as busy, and the target is not
// judged then: such a run measures the neighbours as much as outboxd.
func perEventRows(c RelayCase, broker string, perTxn int) []row {
	n := float64(max(1, c.Backlog.Events))
	st := perEventOf(c.Relays, c.Backlog.Events) // sched.go
	if st.runs == 0 {
		return nil
	}
	var allocs []float64
	busy, hogs := 0, 0
	for _, r := range c.Relays {
		hogs = max(hogs, r.CPU.HogsN)
		if !r.CPU.Known || r.CPU.Walsender <= 0 || r.OutboxdCPU <= 0 {
			continue
		}
		if r.Allocs >= 0 {
			allocs = append(allocs, float64(r.Allocs)/n)
		}
		if r.CPU.Contended() {
			busy++
		}
	}
	label := fmt.Sprintf("  ″ CPU per event: outboxd ÷ walsender, median of %d runs", st.runs)
	if hogs > 0 {
		label += fmt.Sprintf(", beside %d CPU hogs", hogs) // judged all the same: the targets hold there too
	}
	if busy > 0 {
		label += fmt.Sprintf(", %d busy", busy)
	}
	al := "allocs/ev unknown"
	if len(allocs) > 0 {
		al = fmt.Sprintf("%.1f allocs/ev", median(allocs))
	}
	limit, applies := outboxdPerWalsender(broker, perTxn)
	tgt, res := target(applies, fmt.Sprintf("≤ %.2f× walsender", limit), st.ratio <= limit)
	if applies && busy > 0 {
		res = "busy"
	}
	return []row{{"", label,
		fmt.Sprintf("outboxd %.2f µs/ev, %s, %.2f context switches/ev", st.outboxd, al, st.cs),
		fmt.Sprintf("walsender %.2f µs/ev", st.walsender), fmt.Sprintf("%.2f×", st.ratio), tgt, res}}
}

// median of xs (the upper middle of an even count); xs is sorted in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}
