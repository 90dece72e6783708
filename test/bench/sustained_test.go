package bench

import (
	"bytes"
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/harness"
)

// Quantiles are nearest-rank: of 1,000 latencies 1..1000 µs, p50 is the
// 500th, p99 the 990th, p99.9 the 999th.
func TestSustainedQuantiles(t *testing.T) {
	lat := make([]int32, 1000)
	for i := range lat {
		lat[i] = int32(i + 1)
	}
	q := quantiles(lat)
	if q.N != 1000 || q.P50 != 500*time.Microsecond || q.P99 != 990*time.Microsecond || q.P999 != 999*time.Microsecond || q.Max != 1000*time.Microsecond {
		t.Fatalf("%+v", q)
	}
	// Events of one transaction share its ack; a receipt before the ack is 0.
	recv := []int32{110, 120, 0, 95, 200, 300}
	acks := []int32{100, 100, 100}
	a := ackQuantiles(recv, acks, 2)
	if a.N != 5 || a.Zeroes != 1 || a.P50 != 20*time.Microsecond || a.Max != 200*time.Microsecond {
		t.Fatalf("ackQuantiles %+v", a)
	}
}

// A transaction acked at a is confirmed by the first sample whose
// confirmed_flush_lsn reached the insert LSN of the first sample sent at or
// after a; its latency runs to that sample's receipt.
func TestSustainedConfirmed(t *testing.T) {
	lsns := []lsnSample{
		{send: 0, recv: 1, insert: 100, write: 100, confirmed: 50},
		{send: 10, recv: 11, insert: 200, write: 190, confirmed: 100},
		{send: 20, recv: 21, insert: 300, write: 300, confirmed: 150},
		{send: 30, recv: 31, insert: 300, write: 300, confirmed: 300},
	}
	// Ack 5 → sample 1 (insert 200) → confirmed ≥ 200 first at sample 3 (recv 31): 26.
	// Ack 10 → sample 1 as well: 21. Ack 25 → sample 3 (insert 300, confirmed 300): 6.
	// Ack 40: no sample after it.
	q := confirmedQuantiles([]int32{5, 10, 0, 25, 40}, 1, lsns) // 0: not written
	if q.N != 3 || q.Unconfirmed != 1 || q.P50 != 21*time.Microsecond || q.Max != 26*time.Microsecond {
		t.Fatalf("%+v", q)
	}
	if lag, at := lagMax(lsns, 0, 40); lag != 150 || at != 20*time.Microsecond {
		t.Fatalf("lagMax = %d at %s, want 150 at 20µs", lag, at)
	}
	if lag, _ := lagMax(lsns, 25, 40); lag != 0 {
		t.Fatalf("lagMax from 25 = %d, want 0", lag)
	}
}

// The series has whole 10-second steps; CPU per event is the outboxd CPU
// between the steps' ends over the events received meanwhile.
func TestSustainedSeries(t *testing.T) {
	const s = 1_000_000 // µs
	var acks []int32
	for i := range 25 {
		acks = append(acks, int32(i*s+1)) // one transaction per second, 25 s
	}
	procs := []procSample{
		{at: 0, rss: 10 << 20, cpu: 0, received: 0},
		{at: 5 * s, rss: 30 << 20, cpu: 100 * time.Millisecond, received: 50},
		{at: 10 * s, rss: 20 << 20, cpu: 200 * time.Millisecond, received: 100},
		{at: 20 * s, rss: 40 << 20, cpu: 500 * time.Millisecond, received: 200},
	}
	lsns := []lsnSample{{send: 3 * s, write: 500, confirmed: 100}, {send: 15 * s, write: 900, confirmed: 800}}
	pts := series(acks, 2, procs, lsns, 0, 25*s)
	if len(pts) != 2 {
		t.Fatalf("%d points, want 2 whole steps: %+v", len(pts), pts)
	}
	p0, p1 := pts[0], pts[1]
	if p0.At != 10*time.Second || p0.Rate != 2 || p0.RSS != 30<<20 || p0.CPUPerEvent != 2000 || p0.LagMax != 400 {
		t.Errorf("first step %+v", p0)
	}
	if p1.At != 20*time.Second || p1.Rate != 2 || p1.RSS != 40<<20 || p1.CPUPerEvent != 3000 || p1.LagMax != 100 {
		t.Errorf("second step %+v", p1)
	}
	second, last := rssWindows(procs, 0, 20*s, 5*time.Second)
	if second != 30<<20 || last != 40<<20 { // [5 s, 10 s) and [15 s, 20 s]
		t.Errorf("rssWindows = %d, %d", second, last)
	}
	if got := sparkline([]float64{1, 2, 3, 4, 5, 6, 7, 8}); got != "▁▂▃▄▅▆▇█" {
		t.Errorf("sparkline = %q", got)
	}
	if got := sparkline([]float64{3, 3}); got != "▁▁" {
		t.Errorf("flat sparkline = %q", got)
	}
}

// outboxd's histogram: the window's share is the difference of two
// scrapes; quantiles interpolate within a bucket as histogram_quantile does.
func TestPublishHistogram(t *testing.T) {
	inf := math.Inf(1)
	before := publishHistogram{le: []float64{0.01, 0.025, inf}, count: []float64{10, 10, 10}}
	after := publishHistogram{le: []float64{0.01, 0.025, inf}, count: []float64{60, 110, 120}}
	h := after.since(before) // 50 ≤ 10 ms, 50 in (10, 25] ms, 10 above
	if h.total() != 110 {
		t.Fatalf("total %d", h.total())
	}
	if got := h.quantile(0.5); got != 11500*time.Microsecond { // rank 55: 5 of 50 into (10, 25]: 10 + 15/10
		t.Errorf("p50 = %s, want 11.5ms", got)
	}
	if got := h.quantile(0.99); got != 25*time.Millisecond { // in +Inf: the highest finite bound
		t.Errorf("p99 = %s, want 25ms", got)
	}
	if got := h.within(0.01); math.Abs(got-50.0/110) > 1e-9 {
		t.Errorf("within 10 ms = %f", got)
	}
}

func TestInsertMany(t *testing.T) {
	if got, want := insertMany(2), `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)`; got != want {
		t.Fatalf("%s", got)
	}
}

// On the 3-node cluster the rows carry the targets, and a miss is
// a FAIL that Table returns; the results file has figure keys docs/performance.md's
// markers can address (results' figRE) and the series table.
func TestSustainedReport(t *testing.T) {
	run := func(p99 time.Duration, lag int64, rssLast int64) SustainedRun {
		return SustainedRun{Broker: harness.KindApacheCluster, PerTxn: 1, Target: 20000, Rate: 9000, Probe: 9500, Duration: 10 * time.Minute, Writers: 40,
			Sent: 5_400_000, Received: 5_400_000, Achieved: 9000, Ack: Quantiles{N: 5_400_000, P50: 4 * time.Millisecond, P99: p99, P999: 30 * time.Millisecond, Max: time.Second},
			Confirmed: Quantiles{N: 5_400_000, P50: 20 * time.Millisecond, P99: 40 * time.Millisecond}, LagMax: lag, Samples: 100,
			RSSSecond: 20 << 20, RSSLast: rssLast, Series: []SustainedPoint{{At: 10 * time.Second, Rate: 9000, RSS: 20 << 20, CPUPerEvent: 9}}}
	}
	for _, tc := range []struct {
		name string
		run  SustainedRun
		miss []string
	}{
		{"pass", run(12*time.Millisecond, 1<<20, 21<<20), nil},
		{"p99", run(16*time.Millisecond, 1<<20, 21<<20), []string{"commit → ack"}},
		{"lag", run(12*time.Millisecond, 9<<20, 21<<20), []string{"slot lag"}},
		{"rss", run(12*time.Millisecond, 1<<20, 23<<20), []string{"RSS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig(false)
			cfg.Cases = map[string]bool{"sustained": true}
			res := &Results{Config: cfg, Started: time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC), Machine: Machine{NProc: 2, LoadAvg: "1.0 1.0 1.0"}, LoadEnd: "1.0 1.0 1.0",
				Columns: []*Column{{Broker: harness.KindApacheCluster, Sustained: []SustainedRun{tc.run}}}}
			var out bytes.Buffer
			missed := res.Table(&out)
			if len(missed) != len(tc.miss) {
				t.Fatalf("missed %q, want %d matching %q:\n%s", missed, len(tc.miss), tc.miss, out.String())
			}
			for i, m := range tc.miss {
				if !strings.Contains(missed[i], m) {
					t.Errorf("missed %q, want %q", missed[i], m)
				}
			}
			for _, want := range []string{"sustained 10m0s, 1 ev/txn, target 20,000 ev/s", "9,000 ev/s (5,400,000 events, 40 writers", "probe at 20,000 ev/s reached 9,500: scheduled 9,000"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("table lacks %q:\n%s", want, out.String())
				}
			}
			f := res.ResultsFile("-cases sustained")
			if f.Name != "sustained-2026-12-02-0500" {
				t.Errorf("name %q", f.Name)
			}
			key := regexp.MustCompile(`^[a-z0-9.-]+$`) // results_test.go's figRE
			for _, k := range []string{"apache-cluster-sustained-1-ack-p99", "apache-cluster-sustained-1-ack-p99.9", "apache-cluster-sustained-1-confirmed-p99",
				"apache-cluster-sustained-1-lag-max", "apache-cluster-sustained-1-rate", "apache-cluster-sustained-1-rss-last"} {
				if _, ok := f.Figures[k]; !ok || !key.MatchString(k) {
					t.Errorf("figure %q missing or not addressable: %v", k, f.Figures)
				}
			}
			if v := f.Figures["apache-cluster-sustained-1-ack-p99"]; v != ms(tc.run.Ack.P99) {
				t.Errorf("ack-p99 = %q", v)
			}
			if s := f.Tables["apache-cluster-sustained-1-series"]; len(s) != 2 || s[1][0] != "10s" || s[1][1] != "9000" {
				t.Errorf("series table %q", s)
			}
			if _, err := results.Write(t.TempDir(), f); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSustainedQuick runs the case for a few seconds on a real PostgreSQL
// and broker (kfake unless OUTBOXD_TEST_KAFKA_KIND says otherwise): every
// event of the window arrives exactly once, every one is confirmed, and
// the figures are ordered as they must be.
func TestSustainedQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, a broker and outboxd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cfg := DefaultConfig(true)
	cfg.Cases = map[string]bool{"sustained": true}
	cfg.Sustained = SustainedConfig{Duration: 12 * time.Second, Rate: 500, TxnSizes: []int{10}, Probe: 2 * time.Second}
	kind, err := harness.KafkaKind()
	if err != nil {
		t.Fatal(err)
	}
	e, err := StartEnv(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := e.StartBroker(ctx, kind); err != nil {
		t.Fatal(err)
	}
	s := e.Sustained(ctx, kind, 10)
	if s.Err != nil {
		t.Fatal(s.Err)
	}
	t.Logf("achieved %.0f ev/s; ack %s; confirmed %s; lag max %d B; RSS %d → %d; %d samples; series %+v", s.Achieved, s.Ack, s.Confirmed, s.LagMax, s.RSSSecond, s.RSSLast, s.Samples, s.Series)
	if s.Rate != 500 || s.Sent != 6000 || s.Received != 6000 || s.Dups != 0 || s.Ack.N != 6000 || s.Confirmed.N != 6000 || s.Confirmed.Unconfirmed != 0 {
		t.Fatalf("rate %d, sent %d, received %d (%d dups), %d acked and %d confirmed latencies: want 6,000 each at 500 ev/s", s.Rate, s.Sent, s.Received, s.Dups, s.Ack.N, s.Confirmed.N)
	}
	if !(s.Ack.P50 <= s.Ack.P99 && s.Ack.P99 <= s.Ack.P999 && s.Ack.P999 <= s.Ack.Max && s.Ack.Max > 0) {
		t.Errorf("ack quantiles not ordered: %s", s.Ack)
	}
	// The slot confirms a transaction only after the broker acked it: its
	// median confirmation cannot come before the median receipt minus a
	// fetch's worth; and a sample period bounds how early it is read.
	if s.Confirmed.P50 <= 0 || s.Confirmed.Max < s.Confirmed.P50 {
		t.Errorf("confirmed quantiles %s", s.Confirmed)
	}
	if s.Samples < 100 || s.Samples > 12*200+10 { // every 5 ms at most; a starved bench gets far fewer
		t.Errorf("%d LSN samples over 12 s", s.Samples)
	}
	if h := s.OutboxdAck; h.total() < 6000 || h.quantile(0.5) <= 0 {
		t.Errorf("outboxd's publish histogram over the window: %d acks, p50 %s; want ≥ 6,000 (the window and the tail)", h.total(), h.quantile(0.5))
	}
	// VmHWM and VmRSS are read from per-CPU counters, approximately (Linux
	// 6.2+): a later read can come out a few pages lower than an earlier
	// one of the same memory (CI saw a 12 KiB "peak" below the last median),
	// so the peak need only reach the last window's median within 1 MiB.
	if len(s.Series) != 1 || s.Series[0].RSS < 1<<20 || s.RSSSecond < 1<<20 || s.RSSLast < 1<<20 || s.PeakRSS < s.RSSLast-1<<20 || s.Writers != 8 {
		t.Errorf("series %+v, RSS %d → %d (peak %d), %d writers", s.Series, s.RSSSecond, s.RSSLast, s.PeakRSS, s.Writers)
	}
}
