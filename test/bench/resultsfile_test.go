package bench

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/results"
)

// make bench's results file holds the printed table cell for cell, with the
// machine and load it printed, and a busy machine is marked busy.
func TestResultsFileIsThePrintedTable(t *testing.T) {
	drain := RelayCase{Name: "d", Events: 1000, PerTxn: 10, Backlog: backlog{Events: 1000, PerTxn: 10, Txns: 100, PayloadBytes: 200_000},
		Ceilings: []CeilingRun{{Elapsed: time.Second}}, Relays: []RelayRun{{Elapsed: 2 * time.Second, OutboxdCPU: time.Millisecond}}}
	res := &Results{Config: Config{Cases: map[string]bool{"drain": true}, DrainEvents: 1000},
		Started: time.Date(2026, 12, 2, 1, 30, 0, 0, time.UTC), LoadEnd: "2.5 1.2 0.9",
		Machine: Machine{NProc: 2, CPUModel: "Intel(R) Xeon(R) Processor", MemTotal: "23.5 GiB", Kernel: "6.18", Go: "go1.26.8", Postgres: "15.18", LoadAvg: "1.9 1.0 0.5"},
		Columns: []*Column{{Broker: "apache", Desc: "Apache Kafka 4.4.0", Drains: []RelayCase{drain}}}}
	f := res.ResultsFile("-brokers apache")
	dir := t.TempDir()
	if _, err := results.Write(dir, f); err != nil {
		t.Fatal(err)
	}
	files, err := results.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := files["bench-2026-12-02-0130"]
	if got == nil || !got.Busy || got.Date != "2026-12-02T01:30:00Z" || got.Source != "go run ./test/cmd/bench -brokers apache" ||
		got.Load != "load average 1.9 1.0 0.5 at start, 2.5 1.2 0.9 at end" {
		t.Fatalf("results file %+v", got)
	}
	main := got.Tables["main"]
	if len(main) < 2 || !slices.Equal(main[0], []string{"#", "measurement", "kafka", "outboxd", "baseline", "ratio", "target", "result"}) {
		t.Fatalf("main table %q", main)
	}
	found := false
	for _, r := range main[1:] {
		found = found || (r[2] == "apache" && r[7] == "FAIL")
	}
	if !found {
		t.Fatalf("no failed apache drain row in %q", main)
	}
	if busy("0.9 0.5 0.2", 2, 0) || !busy("1.6", 2, 0) {
		t.Fatal("busy threshold")
	}
	// Two hogs add two to the load average; only what is left counts.
	if busy("3.4 3.0 2.0", 2, 2) || !busy("3.7", 2, 2) {
		t.Fatal("busy threshold beside two hogs")
	}
	// A quiet load average, but others took 30% of a core during a drain.
	res.Machine.LoadAvg, res.LoadEnd = "0.2 0.2 0.2", "0.3 0.2 0.2"
	if res.ResultsFile("").Busy {
		t.Fatal("a quiet run marked busy")
	}
	res.Columns[0].Drains[0].Relays[0].CPU = CPUSplit{Known: true, Wall: time.Second, Busy: 300 * time.Millisecond}
	if !res.ResultsFile("").Busy {
		t.Fatal("a drain whose others took 30% of a core is not marked busy")
	}
}

// TestHogsInTheResultsFile: a run with -hogs says so in the header and the
// results file's settings, its drains' CPU split shows the hogs apart from
// "others", and two hogs' load does not mark the file busy by itself.
func TestHogsInTheResultsFile(t *testing.T) {
	split := CPUSplit{Known: true, Wall: time.Second, Outboxd: 250 * time.Millisecond, Walsender: 400 * time.Millisecond,
		BrokerIs: "kfaked", Hogs: 900 * time.Millisecond, HogsN: 2, Busy: 1650 * time.Millisecond}
	if got, want := split.String(), "outboxd 25% walsender 40% pg-other 0% kfaked 0% bench 0% 2 hogs 90% others 10% = 165%/"; !strings.HasPrefix(got, want) {
		t.Errorf("CPU split %q, want it to start %q", got, want)
	}
	if split.Contended() {
		t.Error("the hogs' CPU counted as others: contended")
	}
	drain := RelayCase{Name: "d", Events: 1000, PerTxn: 1, Backlog: backlog{Events: 1000, PerTxn: 1, Txns: 1000, PayloadBytes: 200_000},
		Ceilings: []CeilingRun{{Elapsed: time.Second}}, Relays: []RelayRun{{Elapsed: time.Second, OutboxdCPU: 250 * time.Millisecond, CPU: split}}}
	res := &Results{Config: Config{Cases: map[string]bool{"drain": true}, DrainEvents: 1000, Hogs: 2},
		Started: time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC), LoadEnd: "3.2 2.5 1.5",
		Machine: Machine{NProc: 2, LoadAvg: "2.9 2.0 1.0"},
		Columns: []*Column{{Broker: "kfake", Desc: "kfaked", Drains: []RelayCase{drain}}}}
	f := res.ResultsFile("-hogs 2")
	if f.Busy {
		t.Error("a run beside two hogs with nothing else marked busy")
	}
	if want := "hogs: " + hogsCommand(2); !strings.Contains(f.Settings, want) || !strings.Contains(hogsCommand(2), "stress-ng --cpu 2") {
		t.Errorf("settings %q, want them to hold %q", f.Settings, want)
	}
	var found bool
	for _, r := range f.Tables["main"] {
		if strings.HasPrefix(r[1], "″ CPU per event") {
			found = true
			if !strings.Contains(r[1], "beside 2 CPU hogs") || r[7] != "PASS" {
				t.Errorf("per-event row beside hogs %q: want it labelled and judged (0.62× ≤ 0.70×: PASS, not busy)", r)
			}
		}
	}
	if !found {
		t.Fatalf("no per-event row in %q", f.Tables["main"])
	}
	if hogsCommand(0) != "" {
		t.Error("-hogs 0 described")
	}
}

// A quiet start and no other load in the drains is not busy, whatever the
// load average at the end: that counts the bench's own servers and outboxd.
func TestResultsFileEndLoadIsTheBenchsOwn(t *testing.T) {
	res := &Results{Config: Config{Cases: map[string]bool{"drain": true}, DrainEvents: 1000},
		Started: time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC), LoadEnd: "2.97 2.32 3.28",
		Machine: Machine{NProc: 2, LoadAvg: "0.22 1.69 3.41"}}
	if f := res.ResultsFile("-brokers kfake"); f.Busy {
		t.Error("a run that started quiet and met no other load marked busy by its own end load")
	}
}

// TestBusyLatencyRun: a latency run whose others took more than a quarter
// of a core says so in its label, is not judged against the p99 target,
// and marks the results file busy; one without is judged as before.
func TestBusyLatencyRun(t *testing.T) {
	quiet := CPUSplit{Known: true, Wall: 10 * time.Second, Busy: time.Second}
	busySplit := CPUSplit{Known: true, Wall: 10 * time.Second, Busy: 3300 * time.Millisecond}
	for _, tc := range []struct {
		split            CPUSplit
		label, res, name string
		fileBusy         bool
	}{
		{quiet, "", "FAIL", "quiet", false},
		{busySplit, ", busy (others 33% of a core)", "busy", "busy", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lat := LatencyRun{Publisher: "outboxd", Rate: targetP99Rate, Duration: 12 * time.Second, Sent: 60000, Received: 60000,
				P50: 3 * time.Millisecond, P95: 20 * time.Millisecond, P99: 40 * time.Millisecond, Max: 60 * time.Millisecond,
				Achieved: targetP99Rate, CPU: tc.split}
			res := &Results{Config: Config{Cases: map[string]bool{"latency": true}},
				Started: time.Date(2026, 12, 3, 23, 0, 0, 0, time.UTC), LoadEnd: "0.3 0.2 0.2",
				Machine: Machine{NProc: 2, LoadAvg: "0.2 0.2 0.2"},
				Columns: []*Column{{Broker: "kfake", Desc: "kfaked", Latency: []LatencyRun{lat}, LatencyErrs: []error{nil}}}}
			f := res.ResultsFile("")
			if f.Busy != tc.fileBusy {
				t.Errorf("results file busy %v, want %v", f.Busy, tc.fileBusy)
			}
			want := "latency 5,000 ev/s × 12s, 1 ev/txn: p50 / p95 / p99 / max" + tc.label
			var found bool
			for _, r := range f.Tables["main"] {
				if r[1] == want {
					found = true
					if r[7] != tc.res {
						t.Errorf("row %q: result %q, want %q", r, r[7], tc.res)
					}
				}
			}
			if !found {
				t.Fatalf("no row %q in %q", want, f.Tables["main"])
			}
		})
	}
}

// TestPerEventFigures: each drain's CPU per event ÷ the walsender is a
// figure of the results file, keyed by broker and transaction size, with
// what the row's result says of it, so that a sentence can quote it.
func TestPerEventFigures(t *testing.T) {
	run := func(ob, others time.Duration) RelayRun {
		split := CPUSplit{Wall: 2 * time.Second, Walsender: time.Second, Outboxd: ob, Known: true, BrokerIs: "kfaked"}
		split.Busy = ob + time.Second + others
		return RelayRun{Elapsed: 2 * time.Second, OutboxdCPU: ob, CPU: split, Allocs: -1}
	}
	drain := func(perTxn int, runs ...RelayRun) RelayCase {
		return RelayCase{Backlog: backlog{Events: 100_000, PerTxn: perTxn}, Relays: runs}
	}
	ms := time.Millisecond
	res := &Results{Config: Config{Cases: map[string]bool{"drain": true}}, Started: time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC),
		Machine: Machine{NProc: 2, LoadAvg: "0.1 0.1 0.1"}, LoadEnd: "1.0 0.5 0.2",
		Columns: []*Column{
			{Broker: "kfake", Drains: []RelayCase{drain(1, run(600*ms, 0), run(650*ms, 0), run(700*ms, 0)), drain(10, run(800*ms, 0))}},
			{Broker: "apache", Drains: []RelayCase{drain(100, run(700*ms, 0), run(750*ms, 0), run(800*ms, 0))}},
		}}
	f := res.ResultsFile("")
	want := map[string]string{
		"cpu-per-walsender-kfake-1":    "0.65× (met)",
		"cpu-per-walsender-kfake-10":   "0.80×",
		"cpu-per-walsender-apache-100": "0.75× (missed)",
	}
	if f.Busy || !maps.Equal(f.Figures, want) {
		t.Fatalf("figures %q (busy %v), want %q", f.Figures, f.Busy, want)
	}
	// A run whose others took 30% of a core: the row is not judged, and
	// the whole file is busy (the results package adds "(busy machine)").
	res.Columns[1].Drains[0].Relays[1] = run(750*ms, 600*ms)
	f = res.ResultsFile("")
	if v, _ := f.Figure("cpu-per-walsender-apache-100"); v != "0.75× (busy: not judged) (busy machine)" {
		t.Fatalf("busy figure %q", v)
	}
}

// TestLatencyFloor: outboxd's p99 over the target is not judged when the
// bare producer's p99 in the same column misses the target too (the broker
// alone cannot meet it), and is a miss when the bare producer met it; the
// bare producer gets its own comparison row.
func TestLatencyFloor(t *testing.T) {
	quiet := CPUSplit{Known: true, Wall: 10 * time.Second, Busy: time.Second}
	run := func(pub string, p99 time.Duration) LatencyRun {
		return LatencyRun{Publisher: pub, Rate: targetP99Rate, Duration: 12 * time.Second, Sent: 60000, Received: 60000,
			P50: 3 * time.Millisecond, P95: p99 / 2, P99: p99, Max: 2 * p99, Achieved: targetP99Rate, CPU: quiet}
	}
	for _, tc := range []struct {
		name        string
		producer    time.Duration
		label, res  string
		missedWants int
	}{
		{"broker misses too", 60 * time.Millisecond, ", not judged (the bare producer's p99 60.0ms misses it too)", "floor", 0},
		{"broker meets it", 9 * time.Millisecond, "", "FAIL", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := &Results{Config: Config{Cases: map[string]bool{"latency": true}},
				Started: time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC), LoadEnd: "0.3 0.2 0.2",
				Machine: Machine{NProc: 2, LoadAvg: "0.2 0.2 0.2"},
				Columns: []*Column{{Broker: "apache", Desc: "Apache Kafka",
					Latency:     []LatencyRun{run("outboxd", 80*time.Millisecond), run("bare producer", tc.producer)},
					LatencyErrs: []error{nil, nil}}}}
			var out strings.Builder
			if missed := res.Table(&out); len(missed) != tc.missedWants {
				t.Errorf("missed %q, want %d", missed, tc.missedWants)
			}
			rows := res.ResultsFile("").Tables["main"]
			want := "latency 5,000 ev/s × 12s, 1 ev/txn: p50 / p95 / p99 / max" + tc.label
			var found, vs bool
			for _, r := range rows {
				if r[1] == want {
					found = true
					if r[3] != "3.0ms / 40.0ms / 80.0ms / 160ms" || r[7] != tc.res {
						t.Errorf("row %q: want quantiles 3.0ms / 40.0ms / 80.0ms / 160ms and result %q", r, tc.res)
					}
				}
				if strings.HasPrefix(strings.TrimSpace(r[1]), "″ vs a bare producer") {
					vs = true
					if !strings.HasPrefix(r[4], "bare producer: 3.0ms / ") {
						t.Errorf("bare producer row %q", r)
					}
				}
			}
			if !found || !vs {
				t.Fatalf("rows %q: latency row %v (%q), bare producer row %v", rows, found, want, vs)
			}
		})
	}
}
