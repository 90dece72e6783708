package kafka

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// TopicRisks: unclean leader election always; min.insync.replicas below 2
// only with 3 or more replicas (with fewer, 2 would stop producing at the
// first broker down).
func TestTopicRisks(t *testing.T) {
	for _, c := range []struct {
		rf   int
		cfg  map[string]string
		want []string // substrings, one per warning
	}{
		{3, map[string]string{"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}, nil},
		{3, map[string]string{"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}, []string{"min.insync.replicas=1 with 3 replicas"}},
		{5, map[string]string{"min.insync.replicas": "1"}, []string{"min.insync.replicas=1 with 5 replicas"}},
		{2, map[string]string{"min.insync.replicas": "1"}, nil},
		{1, map[string]string{"min.insync.replicas": "1"}, nil},
		{1, map[string]string{"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}, []string{"unclean.leader.election.enable=true"}},
		{3, map[string]string{"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}, []string{"unclean.leader.election.enable=true", "min.insync.replicas=1"}},
		{3, map[string]string{}, nil}, // not readable: nothing is claimed
	} {
		got := TopicRisks("t", c.rf, c.cfg)
		if len(got) != len(c.want) {
			t.Errorf("rf %d %v: %q, want %q", c.rf, c.cfg, got, c.want)
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(got[i], "topic t has ") || !strings.Contains(got[i], w) || !strings.Contains(got[i], "kafka-configs.sh") {
				t.Errorf("rf %d %v: warning %d %q, want %q", c.rf, c.cfg, i, got[i], w)
			}
		}
	}
}

// On three brokers, the topic outboxd creates with replication factor 3
// and min.insync.replicas=1 is reported once, when its first record goes
// out; a topic with min.insync.replicas=2 is checked and not reported.
func TestTopicDurabilityChecked(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 3, map[string]*string{"min.insync.replicas": kadm.StringPtr("2")}, "safe"); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		found []string
		logs  harness.SyncBuffer
	)
	s, err := New(Config{Brokers: c.ListenAddrs(), Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Topics: TopicConfig{Create: true, ReplicationFactor: 3, Configs: map[string]string{"min.insync.replicas": "1"},
			Durability: func(dest, why string) { mu.Lock(); found = append(found, dest+": "+why); mu.Unlock() }}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, topic := range []string{"unsafe", "safe", "unsafe"} {
		if err := wait(t, produceAsync(s, topic, "k"), 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(logs.String(), "checked the topic's durability settings") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the two topics were not checked:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(found) != 1 || !strings.HasPrefix(found[0], "topic unsafe: topic unsafe has min.insync.replicas=1 with 3 replicas") {
		t.Fatalf("reported %q, want the unsafe topic once", found)
	}
	if !slices.ContainsFunc(strings.Split(logs.String(), "\n"), func(l string) bool {
		return strings.Contains(l, "topic=safe") && strings.Contains(l, "replication_factor=3") && strings.Contains(l, "min_insync_replicas=2")
	}) {
		t.Fatalf("the safe topic's check did not read rf 3, min.insync.replicas 2:\n%s", logs.String())
	}
}
