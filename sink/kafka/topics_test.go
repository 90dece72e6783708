package kafka

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
)

// fakeCluster is an in-process kfake cluster that, like production
// brokers, does not auto-create topics.
func fakeCluster(t *testing.T) (*kfake.Cluster, *kadm.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c, kadm.NewClient(cl)
}

func produceAsync(s *Sink, topic, key string) <-chan error {
	ch := make(chan error, 1)
	s.Produce(context.Background(), &router.Record{Topic: topic, Key: []byte(key), Value: []byte("v"), Partition: -1}, func(err error) { ch <- err })
	return ch
}

func wait(t *testing.T, ch <-chan error, within time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(within):
		t.Fatalf("no ack within %v", within)
		return nil
	}
}

func TestMissingTopicIsCreatedOnceWithOptions(t *testing.T) {
	c, adm := fakeCluster(t)
	s, err := New(Config{Brokers: c.ListenAddrs(), Topics: TopicConfig{Create: true, Partitions: 2, Configs: map[string]string{"retention.ms": "1000"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var acks []<-chan error
	for _, k := range []string{"a", "b", "a"} {
		acks = append(acks, produceAsync(s, "t1", k))
	}
	for _, ch := range acks {
		if err := wait(t, ch, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	md, err := adm.Metadata(context.Background(), "t1")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(md.Topics["t1"].Partitions); n != 2 {
		t.Fatalf("%d partitions, want 2", n)
	}
	if _, ok := s.topics.ready.Load("t1"); !ok {
		t.Fatal("t1 not cached as ready")
	}
}

func TestMissingTopicIsHeldUntilCreated(t *testing.T) {
	c, adm := fakeCluster(t)
	var mu sync.Mutex
	var holds []error
	s, err := New(Config{Brokers: c.ListenAddrs(), Topics: TopicConfig{OnHold: func(topic string, err error) {
		mu.Lock()
		holds = append(holds, err)
		mu.Unlock()
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ack := produceAsync(s, "t2", "k")
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(holds)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no hold reported")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var he *TopicHoldError
	if !errors.As(holds[0], &he) || he.Topic != "t2" || !strings.Contains(he.Error(), "kafka-topics.sh --bootstrap-server "+c.ListenAddrs()[0]+" --create --topic t2") {
		t.Fatalf("hold error %v", holds[0])
	}
	select {
	case err := <-ack:
		t.Fatalf("held record acked: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// Commit of a transaction with a held record gives up at its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	err = s.topics.waitFlushed(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "t2") {
		t.Fatalf("waitFlushed: %v", err)
	}
	if _, err := adm.CreateTopic(context.Background(), 1, 1, nil, "t2"); err != nil {
		t.Fatal(err)
	}
	if err := wait(t, ack, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	// The release is reported after the records are handed to the producer
	// (and the topic's durability is checked): their ack can come first.
	deadline = time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		got := slices.Clone(holds)
		mu.Unlock()
		if len(got) == 2 && got[1] == nil {
			break
		}
		if len(got) > 2 || time.Now().After(deadline) {
			t.Fatalf("holds %v, want the hold then its release", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestHeldRecordsFailOnAbort(t *testing.T) {
	c, _ := fakeCluster(t)
	s, err := New(Config{Brokers: c.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ack := produceAsync(s, "t3", "k")
	s.topics.failPending(errors.New("aborted"))
	if err := wait(t, ack, 5*time.Second); err == nil || err.Error() != "aborted" {
		t.Fatalf("ack %v, want the abort", err)
	}
}
