package bench

import (
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/harness"
)

// The sustained case's rows in the table (section 5) and its figures and
// series in the results file.

// sustainedTargets: the targets hold on the 3-node Apache cluster
// (RF 3, acks=all); on other columns the case reports.
func sustainedTargets(broker string) bool { return broker == harness.KindApacheCluster }

func sustainedFailed(runs []SustainedRun) bool {
	for _, s := range runs {
		if s.Err != nil {
			return true
		}
	}
	return false
}

// limit says what held the writers below the target: the machine's CPU
// (and who used it) during the probe, or, with CPU to spare, the writers'
// own round trips.
func (s SustainedRun) limit() string {
	c := s.ProbeCPU
	if s.Probe >= 0.98*float64(s.Target) {
		return fmt.Sprintf("writers held %s ev/s in the probe", commas(int64(s.Target)))
	}
	if c.Wall <= 0 || !c.Known {
		return "probe CPU split not known"
	}
	nproc := runtime.NumCPU()
	busy := c.Busy.Seconds() / c.Wall.Seconds()
	top, topName := time.Duration(0), ""
	for name, d := range map[string]time.Duration{"outboxd": c.Outboxd, "the walsender": c.Walsender,
		"PostgreSQL's other processes (the writers' backends)": c.Postgres, c.BrokerIs: c.Broker,
		"the bench (writers, consumer, sampler)": c.Bench, "other tenants": c.Others()} {
		if d > top {
			top, topName = d, name
		}
	}
	if busy >= 0.9*float64(nproc) {
		return fmt.Sprintf("the machine's CPU: %.0f%% of %d00%% busy in the probe, most of it %s (%s)", 100*busy, nproc, topName, pct(top, c.Wall))
	}
	return fmt.Sprintf("not the CPU (%.0f%% of %d00%% busy in the probe): the writers' round trips (%d connections, each waiting for its COMMIT)", 100*busy, nproc, s.Writers)
}

// spark renders one series: the sparkline and its range.
func spark(pts []SustainedPoint, f func(SustainedPoint) float64, format string) string {
	if len(pts) == 0 {
		return "no points"
	}
	vs := make([]float64, len(pts))
	for i, p := range pts {
		vs[i] = f(p)
	}
	lo, hi := vs[0], vs[0]
	for _, v := range vs {
		lo, hi = min(lo, v), max(hi, v)
	}
	return sparkline(vs) + " " + fmt.Sprintf(format, lo) + "–" + fmt.Sprintf(format, hi)
}

func sustainedRows(col *Column) []row {
	var rows []row
	add := func(cells ...string) {
		var rw row
		copy(rw[:], cells)
		rows = append(rows, rw)
	}
	tg := sustainedTargets(col.Broker)
	for _, s := range col.Sustained {
		label := fmt.Sprintf("sustained %s, %d ev/txn, target %s ev/s: events/s committed", s.Duration, s.PerTxn, commas(int64(s.Target)))
		if s.Err != nil && s.Sent == 0 {
			add("5", label, short(s.Err), "", "", "", "ERROR")
			continue
		}
		sched := fmt.Sprintf("scheduled %s ev/s", commas(int64(s.Rate)))
		if s.Rate != s.Target {
			sched = fmt.Sprintf("probe at %s ev/s reached %s: scheduled %s (95%%)", commas(int64(s.Target)), commas(int64(s.Probe)), commas(int64(s.Rate)))
		}
		rs, _ := ratio(s.Achieved, float64(s.Target))
		res := "—"
		if s.Err != nil {
			res = "ERROR"
		}
		add("5", label, fmt.Sprintf("%s ev/s (%s events, %d writers, %s)", commas(int64(s.Achieved+0.5)), commas(int64(s.Sent)), s.Writers,
			map[bool]string{true: "FELL BEHIND the schedule", false: "on schedule"}[s.Behind()]+map[bool]string{true: ", stopped at 1.25× the window", false: ""}[s.Cut]),
			sched, rs+" target", "—", res)
		if s.Err != nil {
			add("", "  ″ error", short(s.Err))
		}
		add("", "  ″ limit", s.limit())
		tgt, v := target(tg, "p99 ≤ "+ms(targetSustainedP99), s.Err == nil && s.Ack.N > 0 && s.Ack.P99 <= targetSustainedP99)
		add("", "  ″ commit → ack (consumer receipt): p50 / p99 / p99.9 / max", s.Ack.String(), fmt.Sprintf("%s events", commas(int64(s.Ack.N))), "", tgt, v)
		if h := s.OutboxdAck; h.total() > 0 {
			add("", "  ″ commit → ack, outboxd's outboxd_publish_latency_seconds (bucket-interpolated): p50 / p99 / p99.9",
				fmt.Sprintf("%s / %s / %s", ms(h.quantile(0.5)), ms(h.quantile(0.99)), ms(h.quantile(0.999))),
				fmt.Sprintf("%s acks: %.2f%% ≤ 10 ms, %.2f%% ≤ 25 ms", commas(h.total()), 100*h.within(0.01), 100*h.within(0.025)))
		}
		add("", "  ″ commit → confirmed_flush_lsn (5 ms samples, upper bound): p50 / p99 / p99.9 / max", s.Confirmed.String(),
			fmt.Sprintf("%s samples, one per %s on average", commas(int64(s.Samples)), ms(s.Window/time.Duration(max(1, s.Samples)))), "", "—", "—")
		tgt, v = target(tg, fmt.Sprintf("≤ %d MiB", targetSustainedLag>>20), s.Err == nil && s.Samples > 0 && s.LagMax <= targetSustainedLag)
		add("", "  ″ slot lag max (pg_current_wal_lsn − confirmed_flush_lsn, every 5 ms)", fmt.Sprintf("%.2f MiB (at %s)", mib(s.LagMax), s.LagMaxAt.Round(time.Second)),
			"per 10 s: "+spark(s.Series, func(p SustainedPoint) float64 { return mib(p.LagMax) }, "%.2f"), "", tgt, v)
		dev := 0.0
		if s.RSSSecond > 0 {
			dev = 100 * float64(s.RSSLast-s.RSSSecond) / float64(s.RSSSecond)
		}
		tgt, v = target(tg, "last within 10% of 2nd", s.Err == nil && s.RSSFlat())
		add("", fmt.Sprintf("  ″ outboxd RSS per 10 s (MiB); median of window 2 vs last (%s windows)", s.RSSWindow),
			spark(s.Series, func(p SustainedPoint) float64 { return mib(p.RSS) }, "%.1f"),
			fmt.Sprintf("%.1f → %.1f MiB (%+.1f%%), peak %.1f MiB", mib(s.RSSSecond), mib(s.RSSLast), dev, mib(s.PeakRSS)), "", tgt, v)
		add("", "  ″ outboxd CPU per event per 10 s (µs)", spark(s.Series, func(p SustainedPoint) float64 { return p.CPUPerEvent }, "%.1f"),
			fmt.Sprintf("window: %.1f µs/ev", s.CPUPerEvent()))
		add("", "  ″ events/s committed per 10 s", spark(s.Series, func(p SustainedPoint) float64 { return p.Rate }, "%.0f"))
		add("", "  ″ CPU split (% of one core)", "window: "+s.CPU.String(), "probe: "+s.ProbeCPU.String())
		add("", "  ″ load average (start → end)", s.LoadStart+" → "+s.LoadEnd)
	}
	return rows
}

// sustainedResults adds the sustained runs' figures and series to the
// results file: figure keys <broker>-sustained-<k>-<what> (docs/performance.md quotes
// them as <!-- fig:FILE#apache-cluster-sustained-1-ack-p99 -->), series
// tables <broker>-sustained-<k>-series. A run of the sustained case alone
// names its file sustained-<date>-<time>.
func (r *Results) sustainedResults(f *results.File) {
	var found bool
	for _, col := range r.Columns {
		for _, s := range col.Sustained {
			found = true
			if f.Figures == nil {
				f.Figures = map[string]string{}
			}
			k := fmt.Sprintf("%s-sustained-%d-", col.Broker, s.PerTxn)
			fig := func(key, v string) { f.Figures[k+key] = v }
			fig("duration", s.Duration.String())
			fig("target-rate", commas(int64(s.Target))+" ev/s")
			fig("probe-rate", commas(int64(s.Probe+0.5))+" ev/s")
			fig("rate", commas(int64(s.Achieved+0.5))+" ev/s")
			fig("events", commas(int64(s.Sent)))
			fig("writers", fmt.Sprint(s.Writers))
			fig("limit", s.limit())
			fig("load", s.LoadStart+" → "+s.LoadEnd)
			if s.Err != nil {
				fig("error", short(s.Err))
			}
			for _, q := range []struct {
				name string
				q    Quantiles
			}{{"ack", s.Ack}, {"confirmed", s.Confirmed}} {
				fig(q.name+"-p50", ms(q.q.P50))
				fig(q.name+"-p99", ms(q.q.P99))
				fig(q.name+"-p99.9", ms(q.q.P999))
				fig(q.name+"-max", ms(q.q.Max))
			}
			if h := s.OutboxdAck; h.total() > 0 {
				fig("outboxd-ack-p50", ms(h.quantile(0.5)))
				fig("outboxd-ack-p99", ms(h.quantile(0.99)))
				fig("outboxd-ack-p99.9", ms(h.quantile(0.999)))
				fig("outboxd-ack-within-10ms", fmt.Sprintf("%.2f%%", 100*h.within(0.01)))
				fig("outboxd-ack-within-25ms", fmt.Sprintf("%.2f%%", 100*h.within(0.025)))
			}
			fig("lag-max", fmt.Sprintf("%.2f MiB", mib(s.LagMax)))
			fig("rss-second", fmt.Sprintf("%.1f MiB", mib(s.RSSSecond)))
			fig("rss-last", fmt.Sprintf("%.1f MiB", mib(s.RSSLast)))
			fig("rss-peak", fmt.Sprintf("%.1f MiB", mib(s.PeakRSS)))
			fig("cpu-per-event", fmt.Sprintf("%.1f µs/ev", s.CPUPerEvent()))
			t := [][]string{{"t", "events/s", "outboxd RSS MiB (highest)", "outboxd CPU µs/ev", "slot lag max MiB"}}
			for _, p := range s.Series {
				t = append(t, []string{p.At.Round(time.Second).String(), fmt.Sprintf("%.0f", p.Rate), fmt.Sprintf("%.1f", mib(p.RSS)),
					fmt.Sprintf("%.2f", p.CPUPerEvent), fmt.Sprintf("%.3f", mib(p.LagMax))})
			}
			f.Tables[k+"series"] = t
		}
	}
	if !found {
		return
	}
	c := r.Config.Sustained
	var sizes []string
	for _, k := range c.TxnSizes {
		sizes = append(sizes, fmt.Sprint(k))
	}
	f.Settings += fmt.Sprintf("; sustained: %s per transaction size (%s ev/txn) at a target of %s ev/s after a %s probe", c.Duration, strings.Join(sizes, ", "), commas(int64(c.Rate)), c.Probe)
	f.Notes = append(f.Notes, "sustained: commit → ack is receipt by a franz-go consumer in the bench minus the writer's COMMIT acknowledgement (an upper bound on the broker's ack: with acks=all a record is fetchable once every in-sync replica has it); commit → confirmed maps each ack to the first 5 ms sample of pg_current_wal_insert_lsn() after it and to the first sample whose confirmed_flush_lsn reached that LSN (an upper bound, up to ~2 sample periods coarse); slot lag is pg_current_wal_lsn() − confirmed_flush_lsn of the same samples; RSS and CPU from /proc every second, series per 10 s (test/bench/sustained.go).")
	if len(r.Config.Cases) == 1 && r.Config.Cases["sustained"] {
		f.Name = "sustained-" + r.Started.UTC().Format("2006-01-02-1504")
	}
}
