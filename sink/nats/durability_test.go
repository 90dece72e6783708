package nats_test

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	natssink "github.com/outboxd/outboxd/sink/nats"
)

// StreamRisk warns on what a client sees that can lose an acknowledged
// message: one replica, memory storage; replicated file streams pass
// (their sync_interval is not visible: SyncIntervalNote).
func TestStreamRisk(t *testing.T) {
	for _, c := range []struct {
		cfg  jetstream.StreamConfig
		want string // "" or a substring of the warning
	}{
		{jetstream.StreamConfig{Name: "s", Storage: jetstream.FileStorage, Replicas: 1}, "stream s has 1 replica (num_replicas)"},
		{jetstream.StreamConfig{Name: "s", Storage: jetstream.FileStorage, Replicas: 0}, "stream s has 1 replica"},
		{jetstream.StreamConfig{Name: "s", Storage: jetstream.MemoryStorage, Replicas: 3}, "storage: memory"},
		{jetstream.StreamConfig{Name: "s", Storage: jetstream.FileStorage, Replicas: 3}, ""},
		{jetstream.StreamConfig{Name: "s", Storage: jetstream.FileStorage, Replicas: 2}, ""},
	} {
		got := natssink.StreamRisk(c.cfg)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%+v: %q, want %q", c.cfg, got, c.want)
		}
	}
	if got := natssink.CreatedStreamsRisk(1); !strings.Contains(got, "--nats-stream-replicas is 1") {
		t.Errorf("CreatedStreamsRisk(1) = %q", got)
	}
	if got := natssink.CreatedStreamsRisk(3); got != "" {
		t.Errorf("CreatedStreamsRisk(3) = %q, want none", got)
	}
}
