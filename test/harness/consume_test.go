package harness

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadCommitted returns exactly what read_committed consumers see up to the
// last stable offset: committed records and records written outside any
// transaction, not an aborted transaction's, and not an open one's (it
// returns without waiting for it to end). A topic never written reads as
// empty.
func TestReadCommittedStopsAtTheStableOffset(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	txn := func(id string, end *kgo.TransactionEndTry, vals ...string) *kgo.Client {
		t.Helper()
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID(id), kgo.RecordPartitioner(kgo.ManualPartitioner()))
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if end != nil {
			if err := cl.EndTransaction(ctx, *end); err != nil {
				t.Fatal(err)
			}
		}
		return cl
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopic(ctx, 2, 1, nil, "t"); err != nil {
		t.Fatal(err)
	}
	commit, abort := kgo.TryCommit, kgo.TryAbort
	txn("a", &commit, "c1", "c2").Close()
	txn("b", &abort, "x1").Close()
	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DefaultProduceTopic("t"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Value: []byte("p1")}, &kgo.Record{Value: []byte("p2"), Partition: 1}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	open := txn("c", nil, "o1") // never ends within the test
	defer open.Close()
	if err := plain.ProduceSync(ctx, &kgo.Record{Value: []byte("after the open one")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadCommitted(ctx, c.ListenAddrs(), []string{"t"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, string(r.Value))
	}
	// Partition 0 in offset order, then partition 1 (or the other way).
	if s := strings.Join(got, ","); s != "c1,c2,p1,p2" && s != "p2,c1,c2,p1" {
		t.Fatalf("read %q, want c1,c2,p1 (partition 0) and p2 (partition 1)", got)
	}
	if recs, err := ReadCommitted(ctx, c.ListenAddrs(), []string{"never-written"}); err != nil || len(recs) != 0 {
		t.Fatalf("a topic never written: %d records, %v", len(recs), err)
	}
}
