package fault

import (
	"cmp"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/results"
)

var resultsDir = flag.String("results", "", "write each run's summary as a results file (fault-<scenario>-<mode>-<kafka>-<date>-<time>.json) into this directory (make soak: results/)")

// writeResults writes the run's summary figures in the results format that
// docs/guarantees.md quotes (package results). The run's wall-clock start is w.started.
func (w *world) writeResults(res *runResult) {
	if *resultsDir == "" || res.rep == nil {
		return
	}
	kind, _ := worldKafkaKind()
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	total := 0
	for _, n := range w.faultsDone {
		total += n
	}
	verdict := "PASS"
	if len(res.failures) > 0 {
		verdict = fmt.Sprintf("FAIL (%d problems)", len(res.failures))
	}
	var one float64
	fmt.Sscan(load, &one)
	f := &results.File{
		Name:     fmt.Sprintf("fault-%s-%s-%s-%s", w.sc.name, w.mode.name, kind, w.started.UTC().Format("2006-01-02-150405")),
		Source:   "go test ./test/fault/ (scenario " + w.sc.name + ")" + binarySource(),
		Commit:   cmp.Or(w.commit, results.Commit()),
		Date:     w.started.UTC().Format(time.RFC3339),
		Machine:  fmt.Sprintf("%d cores, %s", runtime.NumCPU(), runtime.Version()),
		Load:     "load average " + load + " at the end",
		Busy:     one > 0.75*float64(runtime.NumCPU()),
		Settings: fmt.Sprintf("mode %s, kafka %s, seed %d, outboxd %s", w.mode.name, kind, w.seed, strings.Join(w.sc.relayArgs, " ")),
		Figures: map[string]string{
			"wall":       res.wall.Round(time.Second).String(),
			"faults":     fmt.Sprint(total),
			"events":     fmt.Sprint(res.rep.eventsCommitted),
			"lost":       fmt.Sprint(len(res.rep.lost)),
			"duplicates": fmt.Sprint(res.rep.duplicates),
			// By fault kind, as the summary's "dups by fault" attributes
			// them: runs are compared fault by fault.
			"duplicates-by-fault": w.dupsByKind(res.rep),
			"max-lag":             fmtBytes(res.maxLag),
			"checks":              fmt.Sprint(res.rep.pairs),
			"violations":          fmt.Sprint(res.rep.violations),
			"verdict":             verdict,
		},
	}
	if p, err := results.Write(*resultsDir, f); err != nil {
		w.t.Logf("results file: %v", err)
	} else {
		w.t.Logf("results file: %s", p)
	}
}

// A run's summary becomes a results file with the figures of the summary.
func TestFaultRunResultsFile(t *testing.T) {
	dir := t.TempDir()
	old := *resultsDir
	*resultsDir = dir
	defer func() { *resultsDir = old }()
	w := &world{t: t, sc: scenario{name: "short", relayArgs: []string{"--replication-timeout", "5s"}}, mode: deliveryMode{name: "at-least-once"},
		seed: 7, started: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), faultsDone: map[faultKind]int{faultKill: 2, faultBrokerStop: 1}}
	// Five duplicates: two appended while a kill settled, one in each of
	// the two pg-restarts' windows, one after every window.
	t0 := w.started
	w.faultEvents = []faultEvent{
		{kind: faultPGRestart, start: t0.Add(time.Second), settled: t0.Add(2 * time.Second)},
		{kind: faultKill, start: t0.Add(3 * time.Second), settled: t0.Add(4 * time.Second)},
		{kind: faultPGRestart, start: t0.Add(5 * time.Second), settled: t0.Add(6 * time.Second)},
	}
	w.mon = &monitor{snaps: []endSnapshot{
		{at: t0.Add(1500 * time.Millisecond), ends: []int64{1}},
		{at: t0.Add(3500 * time.Millisecond), ends: []int64{3}},
		{at: t0.Add(5500 * time.Millisecond), ends: []int64{4}},
		{at: t0.Add(9 * time.Second), ends: []int64{5}},
	}}
	dups := []dupRec{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}}
	w.writeResults(&runResult{rep: &report{eventsCommitted: 1234, duplicates: 5, dupRecs: dups, pairs: 99}, wall: 61 * time.Second, maxLag: 2048})
	files, err := results.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 1 {
		t.Fatalf("%d results files", len(files))
	}
	for name, f := range files {
		if !strings.HasPrefix(name, "fault-short-at-least-once-") || f.Date != "2026-12-02T01:00:00Z" {
			t.Fatalf("%s: %+v", name, f)
		}
		want := map[string]string{"wall": "1m1s", "faults": "3", "events": "1234", "lost": "0", "duplicates": "5", "checks": "99", "violations": "0", "verdict": "PASS",
			"duplicates-by-fault": "kill=2 pg-restart=2 outside-any-fault=1"}
		for k, v := range want {
			if f.Figures[k] != v {
				t.Errorf("figure %s = %q, want %q", k, f.Figures[k], v)
			}
		}
	}
}

// binarySource names an outboxd binary given with -outboxd-bin: the
// results' commit is then the test code's, not necessarily the binary's.
func binarySource() string {
	if *outboxdBin == "" {
		return ""
	}
	return " with -outboxd-bin " + *outboxdBin
}
