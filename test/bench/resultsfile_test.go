package bench

import (
	"slices"
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
	if busy("0.9 0.5 0.2", 2) || !busy("1.6", 2) {
		t.Fatal("busy threshold")
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
