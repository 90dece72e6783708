package parity

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/results"
	"github.com/outboxd/outboxd/test/harness"
)

var (
	facts      = flag.Bool("facts", false, "run TestDebeziumFacts without -full (it waits up to one offset flush, 60 s, after the corpus is in Kafka)")
	resultsDir = flag.String("results", "", "TestDebeziumFacts writes what it measured as results/debezium-facts-<date>.json into this directory (make parity: results/)")
)

// factsFlushInterval is Connect's default offset.flush.interval.ms, which
// test/debezium/worker.properties keeps: the figures are about Debezium as
// its users run it.
const factsFlushInterval = 60 * time.Second

// factsWait bounds the wait, after the corpus is in Kafka, for Debezium's
// confirmed_flush_lsn to move at all: one flush interval and a margin.
const factsWait = 90 * time.Second

// The corpus's last transaction as the WAL holds it: where its first record
// starts (BEGIN's LSN), where its commit record starts (pgoutput's
// commit_lsn, BEGIN's final_lsn) and ends (end_lsn).
type lastTxn struct {
	first, commit, end uint64
}

// TestDebeziumFacts measures what docs/debezium.md says about Debezium 3.6.1 beside
// outboxd (issue 26 item 6): where its confirmed_flush_lsn ends up after a
// run, relative to the last transaction; the __debezium.context.* headers it
// adds to a record; and how long after the last event was in Kafka it
// confirmed, with Connect's default 60 s offset flush. The position and the
// header names are Debezium's behaviour, not a timing: they must be what the
// newest results/debezium-facts-*.json says (docs/debezium.md quotes that file), so a
// Debezium that behaves otherwise fails here. -results DIR writes this
// run's figures as a new results file. The delay depends on where in the
// flush cycle the corpus ended: it is recorded, and only bounded by the wait.
func TestDebeziumFacts(t *testing.T) {
	if !*full && !*facts {
		t.Skip("waits for two Debezium offset flushes (60 s each) per run: make parity runs it (-full), or pass -facts")
	}
	started := time.Now().UTC()
	figures := map[string]string{}
	var pgVersion string
	var events int
	for _, v := range []struct {
		name string
		// heartbeat: a non-transactional pg_logical_emit_message with
		// outboxd's heartbeat prefix every second after the corpus, as
		// outboxd beside Debezium writes (every --heartbeat-interval, 10 s
		// by default): WAL that Debezium reads and drops
		// (message.prefix.exclude.list).
		heartbeat time.Duration
	}{{name: "quiet"}, {name: "heartbeats", heartbeat: time.Second}} {
		t.Run(v.name, func(t *testing.T) {
			m := measureDebezium(t, v.heartbeat)
			pgVersion, events = m.pgVersion, m.events
			for k, val := range m.figures {
				figures[k+"-"+v.name] = val
			}
		})
	}
	if t.Failed() {
		return
	}
	if figures["dbz-header-names-quiet"] != figures["dbz-header-names-heartbeats"] {
		t.Fatalf("the header names differ between the runs: %q and %q", figures["dbz-header-names-quiet"], figures["dbz-header-names-heartbeats"])
	}
	for _, k := range []string{"dbz-headers", "dbz-header-names"} {
		figures[k] = figures[k+"-quiet"]
		delete(figures, k+"-quiet")
		delete(figures, k+"-heartbeats")
	}
	// What docs/debezium.md quotes: one place where both runs agree, and the delays'
	// range.
	for _, k := range []string{"dbz-confirmed-at", "dbz-confirmed-at-stop"} {
		if q, h := figures[k+"-quiet"], figures[k+"-heartbeats"]; q == h {
			figures[k] = q
		} else {
			figures[k] = q + " (quiet), " + h + " (with heartbeats)"
		}
	}
	figures["dbz-confirm-after-kafka"] = secondsRange(figures["dbz-confirm-after-kafka-quiet"], figures["dbz-confirm-after-kafka-heartbeats"])
	if *resultsDir != "" {
		writeFacts(t, started, "PostgreSQL "+pgVersion, events, figures)
		return
	}
	// Without -results: what Debezium did must be what the newest results
	// file (and so docs/debezium.md) says.
	root, err := harness.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := results.Load(filepath.Join(root, "results"))
	if err != nil {
		t.Fatal(err)
	}
	var newest *results.File
	for name, f := range files {
		if strings.HasPrefix(name, "debezium-facts-") && (newest == nil || name > newest.Name) {
			newest = f
		}
	}
	if newest == nil {
		t.Fatal("no results/debezium-facts-*.json to compare with: run with -results results/ once")
	}
	for _, key := range []string{"dbz-confirmed-at", "dbz-confirmed-at-stop", "dbz-confirmed-at-quiet", "dbz-confirmed-at-heartbeats",
		"dbz-confirmed-at-stop-quiet", "dbz-confirmed-at-stop-heartbeats", "dbz-headers", "dbz-header-names"} {
		if got, want := figures[key], newest.Figures[key]; got != want {
			t.Errorf("%s: measured %q, results/%s.json (which docs/debezium.md quotes) says %q: re-run with -results, point the markers at the new file and run go test ./results -update", key, got, newest.Name, want)
		}
	}
}

type measured struct {
	pgVersion string
	events    int
	figures   map[string]string
}

// measureDebezium runs Debezium over the corpus on a database of its own and
// measures, once the last event is in Kafka, where its confirmed_flush_lsn
// ends up and when, and the headers of its records. With heartbeat > 0 a
// heartbeat message is written that often after the corpus.
func measureDebezium(t *testing.T, heartbeat time.Duration) measured {
	orderEvents := 50
	if *full {
		orderEvents = 20000
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := buildCorpus(orderEvents)
	pg := harness.PostgresForTest(t)
	dsn, err := pg.NewDatabase(ctx, "facts")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "facts")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pgVersion string
	if err := conn.QueryRow(ctx, `SHOW server_version`).Scan(&pgVersion); err != nil {
		t.Fatal(err)
	}
	for _, q := range setupSQL() {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// Debezium's slot, and a second one only this test reads (peeks) to
	// find the last transaction's LSNs in the same WAL.
	const slotDbz, slotPeek = "dbz_facts", "peek_facts"
	for _, s := range []string{slotDbz, slotPeek} {
		if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.write(ctx, conn); err != nil {
		t.Fatal(err)
	}
	walEnd, err := harness.CurrentWALLSN(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	last, err := peekLastTxn(ctx, conn, slotPeek, "parity")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slotPeek); err != nil {
		t.Fatal(err)
	}
	t.Logf("corpus: %d transactions, %d events; last transaction: first record %s, commit record %s-%s; pg_current_wal_lsn %s",
		len(c.txs), len(c.expected), harness.FormatLSN(last.first), harness.FormatLSN(last.commit), harness.FormatLSN(last.end), harness.FormatLSN(walEnd))
	if heartbeat > 0 {
		hb, err := pg.Connect(ctx, "facts")
		if err != nil {
			t.Fatal(err)
		}
		hctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer hb.Close(context.WithoutCancel(hctx))
			for {
				if _, err := hb.Exec(hctx, `SELECT pg_logical_emit_message(false, 'outboxd.heartbeat', now()::text)`); err != nil && hctx.Err() == nil {
					t.Errorf("heartbeat: %v", err)
					return
				}
				select {
				case <-hctx.Done():
					return
				case <-time.After(heartbeat):
				}
			}
		}()
		defer func() { stop(); <-done }()
	}

	k, err := harness.StartApacheKafka(ctx, 1)
	if err != nil {
		t.Fatalf("starting apache kafka: %v", err)
	}
	t.Cleanup(k.Close)
	s := setups[0] // string converters: the flush and the headers do not depend on them
	d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: dsn, Brokers: k.Brokers(), Slot: slotDbz,
		Publication: "parity", Connector: debeziumConnector(s),
		Worker: map[string]string{"offset.flush.interval.ms": fmt.Sprint(factsFlushInterval.Milliseconds())}})
	if err := topicHas(ctx, k, doneTopic, 1, d.Alive); err != nil {
		t.Fatalf("debezium: %v", err)
	}
	inKafka := time.Now()
	confirmed, err := slotConfirmed(ctx, conn, slotDbz)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the last event is in Kafka; debezium's confirmed_flush_lsn %s", harness.FormatLSN(confirmed))

	// confirmed_flush_lsn until it stops moving: after its first move it
	// must stay put for one more flush interval (and a margin), so a flush
	// that would move it further is seen; bounded by factsWait for the
	// first move.
	var firstMove, lastMove, reached time.Time
	for {
		if err := d.Alive(); err != nil {
			t.Fatalf("debezium: %v", err)
		}
		lsn, err := slotConfirmed(ctx, conn, slotDbz)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		if lsn != confirmed {
			t.Logf("debezium's confirmed_flush_lsn %s → %s (%s) after %s", harness.FormatLSN(confirmed), harness.FormatLSN(lsn),
				lsnPlace(lsn, last, walEnd), now.Sub(inKafka).Round(100*time.Millisecond))
			confirmed, lastMove = lsn, now
			if firstMove.IsZero() {
				firstMove = now
			}
			if reached.IsZero() && lsn >= last.first {
				reached = now
			}
		}
		if firstMove.IsZero() && now.Sub(inKafka) > factsWait {
			t.Fatalf("debezium's confirmed_flush_lsn did not move within %s of the last event reaching Kafka (stayed at %s; the last commit record ends at %s)",
				factsWait, harness.FormatLSN(confirmed), harness.FormatLSN(last.end))
		}
		// With heartbeats the slot may follow them: then the first move
		// at or past the corpus's end is where it is.
		if !firstMove.IsZero() && (now.Sub(lastMove) > factsFlushInterval+10*time.Second || (heartbeat > 0 && confirmed > last.end)) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The delay: to the first move that reached the last transaction (or
	// beyond it), else to the last move.
	delay := lastMove.Sub(inKafka)
	if !reached.IsZero() {
		delay = reached.Sub(inKafka)
	}
	where := lsnPlace(confirmed, last, walEnd)
	t.Logf("debezium confirmed %s (%s) %s after the last event was in Kafka", harness.FormatLSN(confirmed), where, delay.Round(100*time.Millisecond))

	// A graceful stop (what docs/debezium.md's cutover asks for) commits Connect's
	// offsets once more: where does that leave the slot?
	stopped := time.Now()
	if err := d.Stop(); err != nil {
		t.Fatalf("stopping debezium: %v", err)
	}
	if err := waitSlot(ctx, dsn, slotDbz, "debezium's walsender to exit", func(st harness.SlotState) bool { return !st.Active }); err != nil {
		t.Fatal(err)
	}
	afterStop, err := slotConfirmed(ctx, conn, slotDbz)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after a graceful stop (%s): debezium's confirmed_flush_lsn %s (%s)", time.Since(stopped).Round(100*time.Millisecond),
		harness.FormatLSN(afterStop), lsnPlace(afterStop, last, walEnd))

	recs, err := readCluster(ctx, k)
	if err != nil {
		t.Fatalf("reading debezium's cluster: %v", err)
	}
	if len(recs) == 0 {
		t.Fatal("debezium's cluster holds no records")
	}
	names, all, err := contextHeaders(recs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("__debezium.context.* headers on every record: %s (all headers of the last: %s)", strings.Join(names, ", "), strings.Join(all, ", "))
	return measured{pgVersion: pgVersion, events: len(recs), figures: map[string]string{
		"dbz-confirmed-at":        where,
		"dbz-confirmed-at-stop":   lsnPlace(afterStop, last, walEnd),
		"dbz-headers":             numberWord(len(names)),
		"dbz-header-names":        "`" + strings.Join(names, "`, `") + "`",
		"dbz-confirm-after-kafka": fmt.Sprintf("%.1f s", delay.Seconds()),
		"dbz-confirmed-lsn": fmt.Sprintf("%s (last transaction: first record %s, commit record %s–%s; pg_current_wal_lsn %s)",
			harness.FormatLSN(confirmed), harness.FormatLSN(last.first), harness.FormatLSN(last.commit), harness.FormatLSN(last.end), harness.FormatLSN(walEnd)),
	}}
}

// peekLastTxn reads every change of slot (pgoutput, without consuming it)
// and returns the last transaction's LSNs: the row of a BEGIN carries the
// transaction's first LSN and its final_lsn the start of the commit record;
// a COMMIT carries the commit record's start and end.
func peekLastTxn(ctx context.Context, conn *pgx.Conn, slot, publication string) (lastTxn, error) {
	rows, err := conn.Query(ctx, `SELECT lsn, data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2)`, slot, publication)
	if err != nil {
		return lastTxn{}, err
	}
	defer rows.Close()
	var last, cur lastTxn
	for rows.Next() {
		var lsnText string
		var data []byte
		if err := rows.Scan(&lsnText, &data); err != nil {
			return lastTxn{}, err
		}
		if len(data) == 0 || (data[0] != 'B' && data[0] != 'C') {
			continue
		}
		lsn, err := harness.ParseLSN(lsnText)
		if err != nil {
			return lastTxn{}, err
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return lastTxn{}, fmt.Errorf("pgoutput message at %s: %w", lsnText, err)
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			cur = lastTxn{first: lsn, commit: uint64(m.FinalLSN)}
		case *pglogrepl.CommitMessage:
			if uint64(m.CommitLSN) != cur.commit {
				return lastTxn{}, fmt.Errorf("COMMIT at %s does not close the BEGIN before it (final_lsn %s)", m.CommitLSN, harness.FormatLSN(cur.commit))
			}
			cur.end = uint64(m.TransactionEndLSN)
			last = cur
		}
	}
	if err := rows.Err(); err != nil {
		return lastTxn{}, err
	}
	if last.end == 0 {
		return lastTxn{}, fmt.Errorf("slot %s: no committed transaction to peek", slot)
	}
	return last, nil
}

func slotConfirmed(ctx context.Context, conn *pgx.Conn, slot string) (uint64, error) {
	s, err := harness.SlotInfo(ctx, conn, slot)
	return s.ConfirmedFlushLSN, err
}

// lsnPlace says where confirmed is relative to the last transaction, in the
// words docs/debezium.md uses.
func lsnPlace(confirmed uint64, t lastTxn, walEnd uint64) string {
	switch {
	case confirmed < t.first:
		return "before the last transaction"
	case confirmed == t.first:
		return "the start of the last transaction"
	case confirmed < t.commit:
		return "inside the last transaction"
	case confirmed == t.commit:
		return "the start of the last commit record"
	case confirmed < t.end:
		return "inside the last commit record"
	case confirmed == t.end:
		return "the end of the last commit record"
	case confirmed <= walEnd:
		return "past the end of the last commit record (within the WAL written by the corpus)"
	default:
		return "past the end of the last commit record (into the WAL written after the corpus)"
	}
}

// contextHeaders returns the sorted names of the __debezium.context.*
// headers, which must be the same on every record, and all header names of
// the last record.
func contextHeaders(recs []*kgo.Record) (names, all []string, err error) {
	var first string
	for i, r := range recs {
		var ns []string
		for _, h := range r.Headers {
			if strings.HasPrefix(h.Key, "__debezium.context.") {
				ns = append(ns, h.Key)
			}
		}
		sort.Strings(ns)
		joined := strings.Join(ns, ",")
		if i == 0 {
			first, names = joined, ns
		} else if joined != first {
			return nil, nil, fmt.Errorf("record %s[%d]@%d has __debezium.context.* headers %q, the first record %q", r.Topic, r.Partition, r.Offset, joined, first)
		}
	}
	if len(recs) > 0 {
		for _, h := range recs[len(recs)-1].Headers {
			all = append(all, h.Key)
		}
	}
	return names, all, nil
}

// secondsRange is "a–b s" from two "x s" figures, the smaller first.
func secondsRange(a, b string) string {
	var x, y float64
	fmt.Sscanf(a, "%f s", &x)
	fmt.Sscanf(b, "%f s", &y)
	if x > y {
		x, y = y, x
	}
	return fmt.Sprintf("%.0f–%.0f s", x, y)
}

func numberWord(n int) string {
	if w := []string{"none", "one", "two", "three", "four", "five", "six"}; n < len(w) {
		return w[n]
	}
	return fmt.Sprint(n)
}

// writeFacts writes the figures as results/debezium-facts-<date>.json.
func writeFacts(t *testing.T, started time.Time, pgVersion string, events int, figures map[string]string) {
	t.Helper()
	load := "?"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	var one float64
	fmt.Sscan(load, &one)
	f := &results.File{
		Name:    "debezium-facts-" + started.Format("2006-01-02"),
		Source:  "go test ./test/parity/ -run TestDebeziumFacts",
		Commit:  results.Commit(),
		Date:    started.Format(time.RFC3339),
		Machine: fmt.Sprintf("%d cores, %s, %s, Java (Kafka Connect 4.3.0)", runtime.NumCPU(), runtime.Version(), pgVersion),
		Load:    "load average " + load + " at the end; shared with other engineers' builds and tests",
		Busy:    one > 0.75*float64(runtime.NumCPU()),
		Settings: fmt.Sprintf("Debezium 3.6.1.Final PostgreSQL connector + Outbox Event Router (StringConverter) on Kafka Connect 4.3.0 standalone, offset.flush.interval.ms=%d, one Apache Kafka node; the parity corpus (%d events, full=%v)",
			factsFlushInterval.Milliseconds(), events, *full),
		Figures: figures,
		Notes: []string{
			"two runs, each on a database, slot and Kafka node of its own: -quiet writes nothing after the corpus; -heartbeats writes a non-transactional pg_logical_emit_message with outboxd's heartbeat prefix (which the connector excludes, message.prefix.exclude.list) every second after it, the WAL outboxd's heartbeats add beside Debezium",
			"dbz-confirmed-at: where Debezium's confirmed_flush_lsn was once it had not moved for 70 s, one more flush interval and 10 s (or, with heartbeats, as soon as it passed the corpus's last commit record), relative to the corpus's last transaction as pgoutput decodes it from the same WAL (dbz-confirmed-lsn: the LSNs)",
			"dbz-confirmed-at-stop: where confirmed_flush_lsn was after a graceful stop (SIGTERM: Connect commits its offsets once more) once the walsender had exited",
			"dbz-confirm-after-kafka: from the first poll (every 100 ms) that saw the last event in Kafka to the change of confirmed_flush_lsn that first reached the last transaction; it depends on where in the 60 s flush cycle the corpus ended: Connect's flush timer starts with the task and the corpus is written before Debezium starts, so here it is about 60 s less the time from the task's start to the last event in Kafka",
		},
	}
	p, err := results.Write(*resultsDir, f)
	if err != nil {
		t.Fatalf("results file: %v", err)
	}
	t.Logf("results file: %s", p)
}
