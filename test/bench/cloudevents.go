package bench

import (
	"fmt"
	"strings"
	"time"
)

// The "cloudevents" case: every drain case also drains its backlog with
// --envelope cloudevents, in binary and in structured mode, interleaved with
// the plain runs (RelayCase.CloudEvents), so that what the envelope costs is
// measured on the same backlog in the same run: drain rate and outboxd CPU
// per event beside the plain payload.

// ceModes are the envelope's runs, by name, with their arguments.
var ceModes = []struct{ name, slot string }{{"binary", "ceb"}, {"structured", "ces"}}

func ceArgs(mode string) []string {
	return []string{"--envelope", "cloudevents", "--cloudevents-mode", mode, "--cloudevents-source", "/bench"}
}

// cloudEventsRows are a drain case's CloudEvents rows: per mode, the fastest
// run's rate and the median outboxd CPU per event, beside the plain runs'.
func cloudEventsRows(c RelayCase) []row {
	if len(c.CloudEvents) == 0 || c.Relay().Elapsed == 0 {
		return nil
	}
	n := int64(c.Backlog.Events)
	plainCPU := perEvent(medianCPU(c.Relays), n)
	var rows []row
	for _, m := range ceModes {
		runs := c.CloudEvents[m.name]
		if len(runs) == 0 {
			continue
		}
		r := fastest(runs)
		cpu := perEvent(medianCPU(runs), n)
		over := "?"
		if plainCPU > 0 {
			over = fmt.Sprintf("CPU %+.1f%%", 100*(cpu/plainCPU-1))
		}
		rows = append(rows, row{"", fmt.Sprintf("  ″ --envelope cloudevents, %s mode, vs plain payloads, interleaved, runs each: %d", m.name, len(runs)),
			fmt.Sprintf("%s: %s, outboxd %.2f µs/ev", m.name, rate(n, r.Elapsed), cpu),
			fmt.Sprintf("plain: %s, outboxd %.2f µs/ev", rate(n, c.Relay().Elapsed), plainCPU),
			over, "", ""})
	}
	return rows
}

// perEvent is d per event in microseconds.
func perEvent(d time.Duration, n int64) float64 {
	if n == 0 {
		return 0
	}
	return float64(d) / float64(n) / 1e3
}

// ceRunLabel is how progress lines name a CloudEvents run.
func ceRunLabel(mode string) string { return "outboxd " + strings.Join(ceArgs(mode), " ") }
