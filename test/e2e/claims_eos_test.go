package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// docs/exactly-once.md: the producer's transactional id is
// outboxd.<system identifier>.<slot>; a producer registering that id fences
// outboxd, which starts over (taking the id back) while nobody else holds the
// slot, and exits after three fencings in a row (a copy of the database
// streaming elsewhere); the checkpoint topic is created compacted with one
// partition.
func TestExactlyOnceTransactionalIDAndCheckpointTopic(t *testing.T) {
	f := newFixture(t)
	cp := "cp." + f.agg
	r := f.startRelay("--exactly-once", "--checkpoint-topic", cp)
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 30*time.Second)

	details, err := f.admin().ListTopics(f.ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := details[cp]; !ok || d.Err != nil || len(d.Partitions) != 1 {
		t.Fatalf("checkpoint topic %s: %+v, want one partition", cp, details[cp])
	}
	cfgs, err := f.admin().DescribeTopicConfigs(f.ctx, cp)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := cfgs.On(cp, nil)
	if err != nil || rc.Err != nil {
		t.Fatalf("describe %s: %v %v", cp, err, rc.Err)
	}
	policy := ""
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	if policy != "compact" {
		t.Fatalf("checkpoint topic cleanup.policy %q, want compact", policy)
	}

	// Another producer with outboxd's transactional id commits a
	// transaction: outboxd's producer epoch is fenced.
	id := "outboxd." + f.systemID() + "." + f.slot
	if !r.logged(f.ctx, "transactional_id="+id) {
		t.Fatalf("log does not name transactional_id=%s:\n%s", id, tailString(r.Log(), 3000))
	}
	opts, err := f.kafka.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	// intrude registers outboxd's transactional id (fencing it) and commits.
	intrude := func() {
		cl, err := kgo.NewClient(append(opts, kgo.TransactionalID(id), kgo.DefaultProduceTopic(f.topic()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(f.ctx, &kgo.Record{Key: []byte("intruder"), Value: []byte("{}")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(f.ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	// Fenced once or twice, outboxd starts over, takes the id back and
	// delivers the event.
	for n := 2; n <= 3; n++ {
		intrude()
		f.waitConfirmed(f.commit(event{n, "a", "E", `{}`}), 30*time.Second)
		if r.Exited() {
			t.Fatalf("outboxd exited after %d fencing(s):\n%s", n-1, tailString(r.Log(), 3000))
		}
	}
	// The third fencing in a row, with nobody else on the slot: it exits.
	intrude()
	f.commit(event{4, "a", "E", `{}`})
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	code, err := r.Wait(ctx)
	if err != nil {
		t.Fatalf("outboxd kept running after its transactional id %s was taken: %v", id, err)
	}
	if code == 0 || !strings.Contains(strings.ToLower(r.Log()), "fenced") {
		t.Fatalf("exit code %d; want non-zero, fenced:\n%s", code, tailString(r.Log(), 3000))
	}
}
