package kafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/sink"
	"github.com/outboxd/outboxd/wal"
)

// outboxd's own topics follow --create-topics (issue 26, item 14): with it
// false, a missing checkpoint or progress topic is not created (neither
// through the admin API nor by the broker's auto-creation, which would make
// it with the delete policy) and the error names the command that makes it
// compacted with one partition; once it exists, both go on. On main both
// topics were created whatever the flag said.
func TestOwnTopicsFollowCreateTopics(t *testing.T) {
	c, adm := fakeCluster(t)
	ctx := context.Background()
	s, err := New(Config{Brokers: c.ListenAddrs(), Transactional: &Transactional{Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cp := Checkpoints{Topic: "own.cp", Key: "7/s", TransactionalID: "outboxd.7.s"}
	for what, ensure := range map[string]func() error{
		"own.cp":       func() error { return s.InitTransactions(ctx, cp) },
		"own.progress": func() error { return s.EnsureProgressTopic(ctx, Progress{Topic: "own.progress", Key: "s"}) },
	} {
		err := ensure()
		var hold *TopicHoldError
		if !errors.As(err, &hold) || hold.Topic != what ||
			!strings.Contains(err.Error(), "kafka-topics.sh --bootstrap-server "+c.ListenAddrs()[0]+" --create --topic "+what+" --partitions 1 --config cleanup.policy=compact") {
			t.Fatalf("%s with --create-topics=false: %v, want a hold naming the command", what, err)
		}
		if td, err := adm.ListTopics(ctx, what); err != nil || td.Has(what) {
			t.Fatalf("%s was created (%v)", what, err)
		}
		if _, err := adm.CreateTopic(ctx, 1, 1, nil, what); err != nil {
			t.Fatal(err)
		}
		if err := ensure(); err != nil {
			t.Fatalf("%s once created: %v", what, err)
		}
	}

	// --create-topics (outboxd's default): created compacted, one partition.
	s2, err := New(Config{Brokers: c.ListenAddrs(), Topics: TopicConfig{Create: true}, Transactional: &Transactional{Timeout: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.InitTransactions(ctx, Checkpoints{Topic: "own.cp2", Key: "8/s", TransactionalID: "outboxd.8.s"}); err != nil {
		t.Fatal(err)
	}
	td, err := adm.ListTopics(ctx, "own.cp2")
	if err != nil || len(td["own.cp2"].Partitions) != 1 {
		t.Fatalf("own.cp2: %+v %v, want one partition", td["own.cp2"], err)
	}
	rc, err := adm.DescribeTopicConfigs(ctx, "own.cp2")
	if err != nil {
		t.Fatal(err)
	}
	if v, err := rc.On("own.cp2", nil); err != nil || !hasConfig(v.Configs, "cleanup.policy", "compact") {
		t.Fatalf("own.cp2 configs: %+v %v", v, err)
	}
}

// The transactional id names the PostgreSQL system, known only after the
// sink is built: Checkpoints.TransactionalID replaces the client's, and
// InitTransactions registers that one.
func TestDeferredTransactionalID(t *testing.T) {
	c := newCluster(t)
	s := newSink(t, c, Config{Transactional: &Transactional{Timeout: 10 * time.Second}})
	if got := s.cl().OptValue(kgo.TransactionalID); got != "" {
		t.Fatalf("transactional id before InitTransactions: %v", got)
	}
	id := TransactionalID(DefaultTransactionalIDPrefix, "7212345678901234567", "outboxd")
	if id != "outboxd.7212345678901234567.outboxd" {
		t.Fatalf("TransactionalID = %s", id)
	}
	if err := s.InitTransactions(context.Background(), Checkpoints{Topic: "cp", Key: "7212345678901234567/outboxd", TransactionalID: id}); err != nil {
		t.Fatal(err)
	}
	if got := s.cl().OptValue(kgo.TransactionalID); got != id || s.TransactionalID() != id {
		t.Fatalf("transactional id %v (%s), want %s", got, s.TransactionalID(), id)
	}
	commitCheckpoint(t, s, sinkCheckpoint(0x100))
	// A Reset keeps it.
	if err := s.Reset(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := s.cl().OptValue(kgo.TransactionalID); got != id {
		t.Fatalf("transactional id after Reset %v, want %s", got, id)
	}
}

func hasConfig(cfgs []kadm.Config, key, value string) bool {
	for _, c := range cfgs {
		if c.Key == key && c.Value != nil && *c.Value == value {
			return true
		}
	}
	return false
}

func sinkCheckpoint(lsn wal.LSN) sink.Checkpoint { return sink.Checkpoint{LSN: lsn} }
