package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/test/harness"
)

// openTransaction starts a transactional producer under id, writes one
// record to partition 0 of topic inside a transaction, and drops the
// client without committing or aborting: the transaction stays open on the
// partition until its 10-minute timeout, longer than the test, holding the
// partition's last stable offset at the record (the state a hanging
// transaction leaves). It returns the record's offset.
func (f *fixture) openTransaction(id, topic string, key, value []byte) int64 {
	f.t.Helper()
	cl := f.txnClient(id)
	defer cl.Close() // Close ends no transaction: the coordinator keeps it open
	return f.beginWith(cl, &kgo.Record{Topic: topic, Key: key, Value: value})[0].Offset
}

// txnClient is a transactional producer under id whose records go to the
// partition they name (0 unless set), with a 10-minute transaction
// timeout: the coordinator keeps a transaction it opens for longer than
// the test.
func (f *fixture) txnClient(id string) *kgo.Client {
	f.t.Helper()
	opts, err := f.kafka.ClientOpts()
	if err != nil {
		f.t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(id), kgo.TransactionTimeout(10*time.Minute),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		f.t.Fatal(err)
	}
	return cl
}

// beginWith begins a transaction on cl and writes recs in it (acked, not
// committed), returning them with their offsets.
func (f *fixture) beginWith(cl *kgo.Client, recs ...*kgo.Record) []*kgo.Record {
	f.t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		f.t.Fatal(err)
	}
	res := cl.ProduceSync(f.ctx, recs...)
	if err := res.FirstErr(); err != nil {
		f.t.Fatal(err)
	}
	out := make([]*kgo.Record, len(res))
	for i, r := range res {
		out[i] = r.Record
	}
	return out
}

// systemID is the PostgreSQL server's system identifier, as outboxd names
// its checkpoint key and transactional id with it.
func (f *fixture) systemID() string {
	f.t.Helper()
	var sysid string
	if err := f.conn.QueryRow(f.ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysid); err != nil {
		f.t.Fatal(err)
	}
	return sysid
}

// events commits events from..to, one per transaction, keys k0..k2.
func (f *fixture) events(from, to int) uint64 {
	f.t.Helper()
	var end uint64
	for i := from; i <= to; i++ {
		end = f.commit(event{i, fmt.Sprintf("k%d", i%3), "E", fmt.Sprintf(`{"n": %d}`, i)})
	}
	return end
}

// exactlyOnce reads the test topic read_committed and wants events 1..n,
// each once, in order per key.
func (f *fixture) exactlyOnce(n int) {
	f.t.Helper()
	recs := f.readCommitted(n)
	first, dups := byID(f.t, recs)
	if len(first) != n || dups != 0 {
		f.t.Fatalf("read_committed: %d distinct events, %d duplicates; want %d and 0", len(first), dups, n)
	}
	for i := 1; i <= n; i++ {
		if first[eventID(i)] == nil {
			f.t.Fatalf("event %d missing", i)
		}
	}
	for key, ids := range perKey(f.t, recs) {
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				f.t.Fatalf("key %s out of order: %v", key, ids)
			}
		}
	}
}

// checkpointWait is /status's checkpoint_wait, nil if absent.
func checkpointWait(st map[string]any) map[string]any {
	w, _ := st["checkpoint_wait"].(map[string]any)
	return w
}

// Another transactional producer leaves a transaction open on outboxd's
// checkpoint partition (killed between its record and its commit): the
// partition's last stable offset stays below its end for the
// transaction's 10-minute timeout, and a hanging transaction would hold it
// forever (issue 22, item 5). outboxd must neither stall nor believe it:
// it goes on committing behind it, starts again (reading the checkpoint
// past it) without waiting, and delivers every event exactly once; /status
// names the transaction (producer id, transactional id, start offset) with
// the kafka-transactions.sh commands, and /readyz stays ready, as delivery
// goes on. Once the transaction is aborted through the admin API, as
// kafka-transactions.sh abort does, checkpoint_wait goes, and
// read_committed readers of the checkpoint topic reach its end. On main
// before f827c0a, the restart read the checkpoint read_committed and
// waited for the transaction ("read checkpoint … context deadline
// exceeded"). Runs on kfake and, with OUTBOXD_TEST_KAFKA_KIND=apache, on
// the Apache node.
func TestHangingForeignTransactionOnTheCheckpointPartition(t *testing.T) {
	f := newFixture(t)
	cp := "cp." + f.agg
	args := []string{"--exactly-once", "--checkpoint-topic", cp}
	r := f.startRelay(args...)
	f.waitConfirmed(f.events(1, 5), 60*time.Second)

	foreign := "foreign." + f.agg
	start := f.openTransaction(foreign, cp, []byte("other/slot"), []byte("0/1"))
	f.waitConfirmed(f.events(6, 10), 60*time.Second)

	var w map[string]any
	if err := harness.WaitStatus(f.ctx, r.Proc, r.http, "checkpoint_wait naming the foreign transaction", func(st map[string]any) bool {
		w = checkpointWait(st)
		return w != nil
	}); err != nil {
		t.Fatal(err)
	}
	hs, _ := w["holders"].([]any)
	if w["topic"] != cp || w["partition"] != 0.0 || w["last_stable_offset"] != float64(start) || w["outboxd_waits"] != false || len(hs) != 1 {
		t.Fatalf("checkpoint_wait %v; want %s/0 held from %d, outboxd not waiting, one holder", w, cp, start)
	}
	h := hs[0].(map[string]any)
	if h["transactional_id"] != foreign || h["coordinator_state"] != "Ongoing" || h["own"] != false || h["start_offset"] != float64(start) {
		t.Fatalf("holder %v; want %s, Ongoing, not own, from %d", h, foreign, start)
	}
	fix, _ := w["fix"].(string)
	for _, cmd := range []string{"find-hanging --broker-id ", fmt.Sprintf("abort --topic %s --partition 0 --start-offset %d", cp, start)} {
		if !strings.Contains(fix, cmd) {
			t.Fatalf("fix %q lacks %q", fix, cmd)
		}
	}
	if code, body := r.get(t, "/readyz"); code != 200 {
		t.Fatalf("/readyz %d %q while outboxd delivers past the transaction; want 200", code, body)
	}

	// A restart reads the checkpoint past the open transaction at once.
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)
	end := f.events(11, 15)
	began := time.Now()
	r = f.startRelay(args...)
	f.waitConfirmed(end, 60*time.Second)
	t.Logf("restart to confirmed behind the open transaction: %s", time.Since(began).Round(time.Millisecond))
	f.exactlyOnce(15)

	// Aborted as kafka-transactions.sh abort does: gone from /status, and
	// read_committed readers of the checkpoint topic get to its end.
	if err := kafka.AbortTransaction(f.ctx, f.admin(), cp, 0, start); err != nil {
		t.Fatal(err)
	}
	if err := harness.WaitStatus(f.ctx, r.Proc, r.http, "checkpoint_wait gone", func(st map[string]any) bool { return checkpointWait(st) == nil }); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(f.events(16, 20), 60*time.Second)
	f.exactlyOnce(20)
	poll(t, 30*time.Second, "the checkpoint partition's last stable offset at its end", func() bool {
		ends, err1 := f.admin().ListEndOffsets(f.ctx, cp)
		lso, err2 := f.admin().ListCommittedOffsets(f.ctx, cp)
		e, _ := ends.Lookup(cp, 0)
		l, _ := lso.Lookup(cp, 0)
		return err1 == nil && err2 == nil && l.Offset == e.Offset
	})
}

// A transaction of outboxd's own transactional id left open on the
// checkpoint partition while outboxd was down, holding a checkpoint record
// of outboxd's own key that would skip every event written meanwhile were
// it believed: outboxd recovers by itself. Registering its producer makes
// the coordinator abort the transaction, the load does not believe the
// record (it has no commit marker), and every event is delivered exactly
// once; nothing is left holding the checkpoint partition.
func TestHangingOwnTransactionOnTheCheckpointPartition(t *testing.T) {
	f := newFixture(t)
	cp := "cp." + f.agg
	args := []string{"--exactly-once", "--checkpoint-topic", cp}
	r := f.startRelay(args...)
	f.waitConfirmed(f.events(1, 5), 60*time.Second)
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)

	end := f.events(6, 10)
	sysid := f.systemID()
	id := kafka.TransactionalID(kafka.DefaultTransactionalIDPrefix, sysid, f.slot)
	skipAll := fmt.Sprintf("%X/%X", end>>32, uint32(end))
	f.openTransaction(id, cp, []byte(sysid+"/"+f.slot), []byte(skipAll))

	r = f.startRelay(args...)
	f.waitConfirmed(end, 60*time.Second)
	f.waitConfirmed(f.events(11, 12), 60*time.Second)
	f.exactlyOnce(12)
	if st, err := harness.Status(f.ctx, r.http); err != nil || checkpointWait(st) != nil {
		t.Fatalf("/status %v, %v: checkpoint_wait after outboxd's own transaction was aborted", st, err)
	}
}
