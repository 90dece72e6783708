package nats

import (
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Durability. A PubAck means the stream's leader has written the message
// and, on a replicated stream, a quorum has; JetStream fsyncs its files
// only every sync_interval (2 minutes by default) unless the server runs
// with sync_interval: always. Jepsen's analysis of NATS 2.12 lost
// acknowledged writes of R3 streams after coordinated crashes with the
// default interval, and a stream with one replica loses them when its one
// machine crashes. What a client can see is the stream's replicas and
// storage (stream info); sync_interval is the server's configuration, in
// its monitoring endpoint (/varz) and the system account only, so outboxd
// warns on what it sees and docs/nats.md recommends sync_interval: always.

// SyncIntervalNote says what outboxd cannot check, for the startup log.
const SyncIntervalNote = "JetStream's sync_interval is not visible to clients: run nats-server with sync_interval: always (jetstream block), " +
	"or an acknowledged event can be lost when servers crash together (Jepsen, NATS 2.12: R3 streams with the default interval lost acknowledged writes); see docs/nats.md"

// StreamRisk says why a stream with configuration cfg can lose messages it
// acknowledged ("" if nothing a client can see says so).
func StreamRisk(cfg jetstream.StreamConfig) string {
	switch {
	case cfg.Storage == jetstream.MemoryStorage:
		return fmt.Sprintf("stream %s keeps its messages in memory (storage: memory): a server restart loses every acknowledged event; recreate it with file storage", cfg.Name)
	case cfg.Replicas <= 1:
		return fmt.Sprintf("stream %s has 1 replica (num_replicas): a PubAck means one server wrote the message, fsynced only every sync_interval (2 minutes by default) unless the server runs with sync_interval: always, "+
			"so a crash of that machine loses acknowledged events; on a cluster of three, use 3 replicas (nats stream edit %s --replicas 3; --nats-stream-replicas 3 for streams outboxd creates) and sync_interval: always", cfg.Name, cfg.Name)
	}
	return ""
}

// CreatedStreamsRisk says why streams outboxd creates with replicas
// replicas can lose acknowledged messages ("" if nothing says so).
func CreatedStreamsRisk(replicas int) string {
	if replicas > 1 {
		return ""
	}
	return "--nats-stream-replicas is 1: the streams outboxd creates have one replica, so a PubAck means one server wrote the message, fsynced only every sync_interval (2 minutes by default) unless the server runs with sync_interval: always; " +
		"on a cluster of three, use --nats-stream-replicas 3 and sync_interval: always"
}

// durability tells Config.Durability what is unsafe about a stream, once
// per lookup (the caller keeps the first of equal findings).
func (s *Sink) durability(cfg jetstream.StreamConfig) {
	if s.cfg.Durability == nil {
		return
	}
	if why := StreamRisk(cfg); why != "" {
		s.cfg.Durability("stream "+cfg.Name, why)
	}
}
