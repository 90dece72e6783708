package bench

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/outboxd/outboxd/results"
)

// ResultsFile is the run as a results file (package results): the tables
// Table prints, with the machine, load and settings printed above them, so
// that docs quote exactly what was measured. args is the command line.
func (r *Results) ResultsFile(args string) *results.File {
	var buf bytes.Buffer
	r.Table(&buf)
	m := r.Machine
	f := &results.File{
		Name:    "bench-" + r.Started.UTC().Format("2006-01-02-1504"),
		Source:  strings.TrimSpace("go run ./test/cmd/bench " + args),
		Commit:  r.commit(),
		Date:    r.Started.UTC().Format("2006-01-02T15:04:05Z"),
		Machine: fmt.Sprintf("%d cores (%s), %s RAM, Linux %s, %s, PostgreSQL %s", m.NProc, m.CPUModel, m.MemTotal, m.Kernel, m.Go, m.Postgres),
		Load:    fmt.Sprintf("load average %s at start, %s at end", m.LoadAvg, r.LoadEnd),
		// The load at the start, before the bench ran anything, and the
		// others' CPU measured in every drain: not the load average at
		// the end, which counts the bench's own servers and outboxd over
		// its last minute (above 1.5 on 2 cores in every quiet run).
		Busy:     busy(m.LoadAvg, m.NProc, r.Config.Hogs) || r.contended(),
		Settings: settingsLine(buf.String()),
		Tables:   map[string][][]string{},
	}
	for i, t := range results.ParseMarkdownTables(buf.String()) {
		name := "main"
		if i > 0 {
			name = "table-" + strconv.Itoa(i+1) // the Debezium case's, in print order
		}
		f.Tables[name] = t
	}
	r.sustainedResults(f) // sustained.go
	r.perEventFigures(f)
	return f
}

// perEventFigures adds the CPU-per-event rows' ratios as figures, so that
// a summary in the docs can quote one ratio in a sentence (results
// package: a figure is checked against its file like a table):
// "cpu-per-walsender-<broker>-<events per transaction>", the ratio and
// what the row's result says of it, e.g. "0.61× (met)", "0.74× (missed)",
// "0.84× (busy: not judged)", or the bare ratio where no target applies.
func (r *Results) perEventFigures(f *results.File) {
	if f.Figures == nil {
		f.Figures = map[string]string{}
	}
	for _, col := range r.Columns {
		for _, c := range col.Drains {
			k := c.Backlog.PerTxn
			rows := perEventRows(c, col.Broker, k)
			if len(rows) == 0 {
				continue
			}
			v := rows[0][4]
			switch rows[0][6] {
			case "PASS":
				v += " (met)"
			case "FAIL":
				v += " (missed)"
			case "busy":
				v += " (busy: not judged)"
			}
			f.Figures[fmt.Sprintf("cpu-per-walsender-%s-%d", col.Broker, k)] = v
		}
	}
}

// busy: a 1-minute load average above three quarters of the cores means
// other work competed for the CPU the figures were measured on. The -hogs
// the run started are not other work: each adds one to the load average.
func busy(load string, nproc, hogs int) bool {
	fields := strings.Fields(load)
	if len(fields) == 0 {
		return false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	return err == nil && nproc > 0 && v-float64(hogs) > 0.75*float64(nproc)
}

// contended reports whether any drain run, or any of outboxd's latency
// runs, had others take more than a quarter of a core
// (CPUSplit.Contended): its figures then measure the neighbours too,
// whatever the load average said.
func (r *Results) contended() bool {
	for _, col := range r.Columns {
		for _, l := range col.Latency {
			if l.Publisher == "outboxd" && l.CPU.Contended() {
				return true
			}
		}
		for _, c := range append(append([]RelayCase(nil), col.Drains...), col.EOSDrains...) {
			for _, runs := range [][]RelayRun{c.Relays, c.EOSRelays, c.BinaryRelays, c.SchedOff} {
				for _, run := range runs {
					if run.CPU.Contended() {
						return true
					}
				}
			}
		}
	}
	return false
}

// settingsLine is the kafka:/outboxd: lines of the printed header.
func settingsLine(printed string) string {
	var parts []string
	for _, l := range strings.Split(printed, "\n") {
		if strings.HasPrefix(l, "kafka:") || strings.HasPrefix(l, "outboxd:") || strings.HasPrefix(l, "hogs:") {
			parts = append(parts, strings.Join(strings.Fields(l), " "))
		}
	}
	if len(parts) == 0 {
		return "not printed"
	}
	return strings.Join(parts, "; ")
}

// commit is the run's commit: Results.Commit, taken when it began, or the
// checkout's now for Results built elsewhere (tests, the sustained case).
func (r *Results) commit() string {
	if r.Commit != "" {
		return r.Commit
	}
	return results.Commit()
}
