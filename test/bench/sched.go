package bench

import "fmt"

// schedOffArgs are the "sched" case's runs' arguments: outboxd under the
// default CPU scheduling policy, beside its default, SCHED_BATCH
// (internal/schedbatch).
var schedOffArgs = []string{"--sched-batch=false"}

// perEventStats are the medians over runs of outboxd's and the walsender's
// CPU per event (µs), their ratio and outboxd's context switches per event,
// from the runs whose CPU split is known.
type perEventStats struct {
	runs                   int
	outboxd, walsender, cs float64
	ratio                  float64
	ratios                 []float64 // by run, in run order (unsorted)
}

func perEventOf(runs []RelayRun, events int) perEventStats {
	n := float64(max(1, events))
	var st perEventStats
	var ob, ws, ratios, cs []float64
	for _, r := range runs {
		if !r.CPU.Known || r.CPU.Walsender <= 0 || r.OutboxdCPU <= 0 {
			continue
		}
		o, w := r.OutboxdCPU.Seconds()*1e6/n, r.CPU.Walsender.Seconds()*1e6/n
		ob, ws, ratios, cs = append(ob, o), append(ws, w), append(ratios, o/w), append(cs, float64(r.CtxSwitches)/n)
	}
	if st.runs = len(ratios); st.runs == 0 {
		return st
	}
	st.ratios = append([]float64(nil), ratios...)
	st.outboxd, st.walsender, st.ratio, st.cs = median(ob), median(ws), median(ratios), median(cs)
	return st
}

// schedRows is the "sched" case's row: outboxd ÷ walsender under
// SCHED_BATCH (the default, the case's Relays) and under the default
// policy (--sched-batch=false, SchedOff), runs interleaved round by round;
// the ratio is the first's median over the second's, and each round says
// which of its two runs cost less per event.
func schedRows(c RelayCase) []row {
	if len(c.SchedOff) == 0 {
		return nil
	}
	b, o := perEventOf(c.Relays, c.Backlog.Events), perEventOf(c.SchedOff, c.Backlog.Events)
	if b.runs == 0 || o.runs == 0 {
		return nil
	}
	lower, pairs := 0, min(len(b.ratios), len(o.ratios))
	for i := range pairs {
		if b.ratios[i] < o.ratios[i] {
			lower++
		}
	}
	return []row{{"", fmt.Sprintf("  ″ CPU per event under SCHED_BATCH (outboxd's default) vs --sched-batch=false, median of %d and %d runs, interleaved", b.runs, o.runs),
		fmt.Sprintf("SCHED_BATCH: outboxd %.2f µs/ev = %.2f× walsender, %.2f context switches/ev; lower in %d of %d rounds", b.outboxd, b.ratio, b.cs, lower, pairs),
		fmt.Sprintf("default policy: outboxd %.2f µs/ev = %.2f× walsender, %.2f context switches/ev", o.outboxd, o.ratio, o.cs),
		fmt.Sprintf("%.2f×", b.ratio/o.ratio), "", ""}}
}
