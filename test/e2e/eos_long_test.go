package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// longTxnRows makes the walsender decode for well over a second after the
// outbox INSERT: the rows go to a table outside the publication, so nothing
// but ticks (and keepalives) reaches outboxd meanwhile.
const longTxnRows = 1_000_000

// Exactly-once with --transaction-timeout 1s: one outbox INSERT, then a
// bulk change to another table in the same PostgreSQL transaction (issue
// 22, item 4's repro). The Kafka transaction holding the event must commit
// as a split (checkpoint X/Y+1) while the walsender decodes the rest,
// before the coordinator's 1 s timeout aborts it. On main the split was
// checked only after a produced event: the coordinator aborted the
// transaction, the INVALID_PRODUCER_EPOCH was taken for fencing, and
// outboxd exited, and exited again after every restart on the same
// transaction. Runs on kfake and, with OUTBOXD_TEST_KAFKA_KIND=apache, on
// the Apache node.
func TestExactlyOnceLongTransactionWithoutFurtherEvents(t *testing.T) {
	f := newFixture(t)
	f.exec(`CREATE TABLE filler (i int, pad text)`)
	cp := "cp." + f.agg
	r := f.startRelay("--exactly-once", "--transaction-timeout", "1s", "--checkpoint-topic", cp)

	tx, err := f.conn.Begin(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, insertSQL, eventID(1), f.agg, "a", "E", `{"n": 1}`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(f.ctx, `INSERT INTO filler SELECT g, 'x' FROM generate_series(1, $1::int) g`, longTxnRows); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(f.ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	end := f.commit(event{2, "a", "E", `{"n": 2}`})
	poll(t, 3*time.Minute, "the slot confirmed past both transactions, outboxd running", func() bool {
		if r.Exited() {
			t.Fatalf("outboxd exited:\n%s", tailString(r.Log(), 4000))
		}
		return f.slotState().ConfirmedFlushLSN >= end
	})
	t.Logf("confirmed %s after the long transaction's commit", time.Since(committed).Round(time.Millisecond))
	recs := f.readCommitted(2)
	first, dups := byID(t, recs)
	if len(first) != 2 || dups != 0 || first[eventID(1)] == nil || first[eventID(2)] == nil {
		t.Fatalf("read_committed: %d distinct, %d duplicates; want events 1 and 2 once", len(first), dups)
	}
	// The split: a checkpoint inside the long transaction, one event in.
	cps, err := harness.ReadAll(f.ctx, f.kafka.Brokers(), []string{cp}, 2, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	split := false
	var values []string
	for _, c := range cps {
		values = append(values, string(c.Value))
		split = split || strings.HasSuffix(string(c.Value), "+1")
	}
	if !split {
		t.Fatalf("checkpoints %v: no split X/Y+1 inside the long transaction", values)
	}
	if strings.Contains(strings.ToLower(r.Log()), "fenced") {
		t.Fatalf("outboxd logged fencing:\n%s", tailString(r.Log(), 4000))
	}
}
