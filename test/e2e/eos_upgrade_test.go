package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/sink/kafka"
	"github.com/outboxd/outboxd/test/harness"
)

// A rolling upgrade to the transactional id that names the system
// identifier (issue 31 item 3), end to end: the earlier version, under
// outboxd.<slot>, published events 2 and 3 and this slot's checkpoint past
// them in its last Kafka transaction, whose commit is still to come (its
// pod shutting down, blocked on Kafka) when this version starts and loads
// the checkpoint. Loading must fence the old id (ListTransactions names it
// as the writer of the checkpoint key, InitProducerID bumps its epoch), so
// that its coordinator ends the transaction on every partition (aborted
// here: it was not committing yet) and the old commit is refused; this
// version then publishes events 2 and 3 itself, and a read_committed
// consumer sees events 1 to 3 exactly once. Without the fence the load
// aborted the checkpoint partition alone, the old commit went through and
// events 2 and 3 were there twice (seen on both brokers with fenceOthers
// disabled). Runs on kfake and, with OUTBOXD_TEST_KAFKA_KIND=apache (make
// test-apache), on the Apache Kafka node's transaction coordinator.
func TestExactlyOnceUpgradeFencesTheOldTransactionalID(t *testing.T) {
	f := newFixture(t)
	cp := "cp." + f.agg
	args := []string{"--exactly-once", "--checkpoint-topic", cp}
	r := f.startRelay(args...)
	f.waitConfirmed(f.events(1, 1), 60*time.Second)
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second)

	// The earlier version's last transaction: events 2 and 3 as outboxd
	// routes them, and the checkpoint (keyed as now, without the
	// transaction headers earlier versions did not write) at the WAL
	// position after them. Left open.
	end := f.events(2, 3)
	oldID := kafka.DefaultTransactionalIDPrefix + f.slot
	old := f.txnClient(oldID)
	defer old.Close()
	var recs []*kgo.Record
	for n := 2; n <= 3; n++ {
		recs = append(recs, &kgo.Record{Topic: f.topic(), Key: fmt.Appendf(nil, "k%d", n%3), Value: fmt.Appendf(nil, `{"n": %d}`, n),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(eventID(n))}, {Key: "type", Value: []byte("E")}}})
	}
	recs = append(recs, &kgo.Record{Topic: cp, Key: []byte(f.systemID() + "/" + f.slot),
		Value: []byte(harness.FormatLSN(end)), Headers: []kgo.RecordHeader{{Key: "outboxd.message_prefix"}}})
	f.beginWith(old, recs...)

	r = f.startRelay(args...)
	f.waitConfirmed(end, 60*time.Second)
	if err := old.EndTransaction(f.ctx, kgo.TryCommit); err == nil {
		t.Errorf("the old id's commit went through after this version loaded the checkpoint: %s was not fenced", oldID)
	} else {
		t.Logf("the old id's commit: %v", err)
	}
	f.exactlyOnce(3)
	if want := "exactly-once: another transactional id has a transaction open with this slot's checkpoint"; !r.logged(f.ctx, want) || !r.logged(f.ctx, "transactional_id="+oldID) {
		t.Errorf("the log does not say %q naming transactional_id=%s", want, oldID)
	}
}
