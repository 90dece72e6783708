package bench

import (
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Targets of the debezium case: outboxd against Debezium.
const (
	targetDbzDrain   = 3.0  // outboxd drain throughput ≥ 3× Debezium's
	targetDbzP99     = 0.1  // outboxd p99 ≤ 1/10 of Debezium's
	targetDbzCPU     = 0.2  // outboxd CPU per event ≤ 1/5
	targetDbzRSS     = 0.1  // outboxd peak RSS ≤ 1/10
	targetDbzConfirm = 0.01 // outboxd ack → confirmed delay ≤ 1/100
	confirmPoll      = 10 * time.Millisecond
)

// confirmDelay is the time from Kafka holding every event to the slot
// confirming the last commit, floored at the 10 ms the bench polls at
// (both are polled: a smaller figure is not resolved).
func confirmDelay(kafka, confirmed time.Duration) time.Duration {
	return max(confirmed-kafka, confirmPoll)
}

func delayCell(kafka, confirmed time.Duration) string {
	if confirmed-kafka <= confirmPoll {
		return "≤ 10 ms (poll interval)"
	}
	return ms(confirmed - kafka)
}

// Table prints the debezium case's table and Debezium's configuration and
// returns the measurements that missed their target.
func (d *DebeziumResults) Table(w io.Writer) (missed []string) {
	if d == nil {
		return nil
	}
	fmt.Fprintf(w, "\noutboxd beside Debezium — same PostgreSQL, same WAL (a slot per reader, created before the backlog), same broker: %s\n", d.Broker)
	if d.Err != nil {
		fmt.Fprintf(w, "ERROR: %v\n", d.Err)
	}
	rows := []row{{"#", "measurement", "outboxd", "Debezium 3.6.1 (Connect defaults)", "ratio", "target", "result"}}
	add := func(cells ...string) {
		var rw row
		copy(rw[:], cells)
		rows = append(rows, rw)
	}
	var obRSS, dbzRSS int64
	for _, c := range d.Drains {
		n := int64(c.Backlog.Events)
		label := fmt.Sprintf("drain %s events, %d ev/txn: until all in Kafka", commas(n), c.PerTxn)
		if c.Err != nil && c.Default.KafkaAt == 0 {
			add("D1", label, short(c.Err), "", "", "", "ERROR")
			continue
		}
		o, b := c.Outboxd, c.Default
		obRSS, dbzRSS = max(obRSS, o.PeakRSS), max(dbzRSS, b.PeakRSS)
		if c.Fast != nil {
			dbzRSS = max(dbzRSS, c.Fast.PeakRSS)
		}
		rs, rv := ratio(EventsPerSec(n, o.KafkaAt), EventsPerSec(n, b.KafkaAt))
		add("D1", label, rate(n, o.KafkaAt)+" ("+secs(o.KafkaAt)+" from process start)",
			rate(n, b.KafkaAt)+" ("+secs(b.KafkaAt)+" from slot active; JVM start-up "+secs(b.Startup)+" more)",
			rs, fmt.Sprintf("≥ %.0f×", targetDbzDrain), verdict(rv >= targetDbzDrain))
		cs, _ := ratio(float64(o.ConfirmedAt), float64(b.ConfirmedAt))
		add("", "  ″ until confirmed_flush_lsn reached the last commit", secs(o.ConfirmedAt), secs(b.ConfirmedAt)+" (offset.flush.interval.ms=60000)", cs, "—", "—")
		if f := c.Fast; f != nil {
			add("", "  ″ Debezium with offset.flush.interval.ms=1000", "", fmt.Sprintf("in Kafka %s (%s), confirmed %s, JVM start-up %s", secs(f.KafkaAt), rate(n, f.KafkaAt), secs(f.ConfirmedAt), secs(f.Startup)), "", "—", "—")
		}
		oc := float64(o.OutboxdCPU.Nanoseconds()) / float64(n) / 1000
		bc := float64(b.CPU.Nanoseconds()) / float64(n) / 1000
		crs, crv := ratio(oc, bc)
		add("D3", fmt.Sprintf("CPU per event, drain %d ev/txn", c.PerTxn), fmt.Sprintf("%.1f µs/ev (whole process life)", oc),
			fmt.Sprintf("%.1f µs/ev (slot active → all in Kafka; whole JVM life %.1f µs/ev)", bc, float64(b.LifeCPU.Nanoseconds())/float64(n)/1000),
			crs, fmt.Sprintf("≤ 1/%.0f", 1/targetDbzCPU), verdict(crv > 0 && crv <= targetDbzCPU))
		od, bd := confirmDelay(o.KafkaAt, o.ConfirmedAt), confirmDelay(b.KafkaAt, b.ConfirmedAt)
		drs, drv := ratio(float64(od), float64(bd))
		add("D5", fmt.Sprintf("all in Kafka → confirmed_flush_lsn at the last commit, drain %d ev/txn", c.PerTxn), delayCell(o.KafkaAt, o.ConfirmedAt),
			delayCell(b.KafkaAt, b.ConfirmedAt), drs, fmt.Sprintf("≤ 1/%.0f", 1/targetDbzConfirm), verdict(drv > 0 && drv <= targetDbzConfirm))
		if f := c.Fast; f != nil {
			add("", "  ″ Debezium with offset.flush.interval.ms=1000", "", delayCell(f.KafkaAt, f.ConfirmedAt), "", "—", "—")
		}
	}
	for _, l := range d.Latency {
		label := fmt.Sprintf("latency %s ev/s × %s, 1 ev/txn: p50 / p99 / max", commas(int64(l.Rate)), l.Debezium.Duration)
		three := func(r LatencyRun) string { return fmt.Sprintf("%s / %s / %s", ms(r.P50), ms(r.P99), ms(r.Max)) }
		switch {
		case l.OutboxdErr != nil:
			add("D2", label, short(l.OutboxdErr), "", "", "", "ERROR")
		case l.DbzErr != nil:
			add("D2", label, three(l.Outboxd), short(l.DbzErr), "", "", "ERROR")
		default:
			rs, rv := ratio(float64(l.Outboxd.P99), float64(l.Debezium.P99))
			add("D2", label, three(l.Outboxd), three(l.Debezium), "p99 "+rs, fmt.Sprintf("p99 ≤ 1/%.0f", 1/targetDbzP99), verdict(rv > 0 && rv <= targetDbzP99))
			add("", "  ″ writers; CPU per event over the window; peak RSS",
				fmt.Sprintf("%s; %.1f µs/ev; %.1f MiB", writersNote(l.Outboxd), l.Outboxd.cpuPerEvent(), mib(l.Outboxd.PeakRSS)),
				fmt.Sprintf("%s; %.1f µs/ev; %.1f MiB", writersNote(l.Debezium), l.Debezium.cpuPerEvent(), mib(l.Debezium.PeakRSS)))
			obRSS, dbzRSS = max(obRSS, l.Outboxd.PeakRSS), max(dbzRSS, l.Debezium.PeakRSS)
		}
	}
	if obRSS > 0 && dbzRSS > 0 {
		rs, rv := ratio(float64(obRSS), float64(dbzRSS))
		add("D4", "peak RSS (VmHWM), highest over the drains and latency runs", fmt.Sprintf("%.1f MiB", mib(obRSS)), fmt.Sprintf("%.1f MiB (Connect JVM)", mib(dbzRSS)),
			rs, fmt.Sprintf("≤ 1/%.0f", 1/targetDbzRSS), verdict(rv <= targetDbzRSS))
	}
	if i := d.Idle; i != nil {
		label := fmt.Sprintf("idle slot: %.1f MB of WAL to a table outside the publication, then watched %s", float64(i.WAL)/1e6, i.Wait)
		if i.Err != nil {
			add("D6", label, short(i.Err), "", "", "", "ERROR")
		} else {
			add("D6", label)
			for _, s := range i.Slots {
				cell := fmt.Sprintf("not released: %.1f MB behind at the end", float64(s.LagAtEnd)/1e6)
				if s.ReleasedAt > 0 {
					cell = "released after " + secs(s.ReleasedAt)
				}
				add("", "  "+s.Reader, cell)
			}
		}
	}
	writeRows(w, rows)
	for _, rw := range rows[1:] {
		if rw[6] == "FAIL" {
			missed = append(missed, rw[1])
		}
	}
	fmt.Fprintf(w, `
debezium: Kafka Connect 4.3.0 standalone + Debezium 3.6.1.Final PostgreSQL connector (pgoutput) + Outbox Event Router,
          JVM flags as bin/connect-standalone.sh sets them:
          %s
          Debezium times count from the moment its walsender held the slot (JVM start-up shown apart), which favours it;
          outboxd's from process start. Debezium confirms the transaction before the last one it streamed (its lsn_commit
          offset), never the last commit's end: its "confirmed" is the slot reaching the last transaction's start, outboxd's
          the last commit's end. ratio = outboxd / Debezium (throughput: > 1 is better; times: < 1 is). CPU: utime+stime of
          /proc/<pid>/stat. Confirmation delay: both polled every 10 ms, so ≤ 10 ms is the resolution. Latency: the same
          writers and consumer as the latency case (receipt minus COMMIT acknowledgement). Idle: "released" = the slot's
          confirmed_flush_lsn passed the end of the unrelated WAL.
debezium worker properties (Connect's offset.flush.interval.ms default 60000 stated explicitly):
%s
debezium connector properties:
%s
`, d.JVM, indent(d.Worker), indent(d.Connector))
	return missed
}

func indent(s string) string {
	if s == "" {
		return "          (not recorded: no drain ran)"
	}
	return "          " + strings.ReplaceAll(s, "\n", "\n          ")
}

// writeRows renders rows as a Markdown-style table (writeTable's layout, for
// the 7 columns of this table).
func writeRows(w io.Writer, rows []row) {
	var width [7]int
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	line := func(r row) {
		var b strings.Builder
		b.WriteString("|")
		for i, c := range r {
			b.WriteString(" " + c + strings.Repeat(" ", width[i]-utf8.RuneCountInString(c)) + " |")
		}
		fmt.Fprintln(w, b.String())
	}
	line(rows[0])
	var sep row
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows[1:] {
		line(r)
	}
}
