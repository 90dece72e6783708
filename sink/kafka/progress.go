package kafka

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Progress is at-least-once mode's record of how far outboxd has confirmed
// each slot, on a compacted one-partition topic keyed by slot. It outlives
// the slot, which is the point: a slot that vanished (a failover to a
// standby without it) or a server that forgot WAL outboxd already published
// is recognised at startup instead of being silently papered over.
type Progress struct {
	Topic string
	// Key is "<system id>/<slot>" (sysid.Key), like the
	// checkpoint's: two clusters with the same slot name sharing the topic
	// keep separate records.
	Key string
	// Legacy is the key before it carried the system identifier (the slot
	// name alone), read once when Key has no record yet so that an upgrade
	// keeps its gap check; "" reads none.
	Legacy string
}

// ProgressStore is one slot's progress record on a sink, as the relay
// keeps it (outboxd.Config.ProgressStore).
type ProgressStore struct {
	Sink *Sink
	Progress
}

func (t ProgressStore) EnsureProgressTopic(ctx context.Context) error {
	return t.Sink.EnsureProgressTopic(ctx, t.Progress)
}
func (t ProgressStore) LoadProgress(ctx context.Context) ([]byte, error) {
	return t.Sink.LoadProgress(ctx, t.Progress)
}

// LoadLegacyProgress returns the latest record under the Legacy key (nil:
// none, or no Legacy key).
func (t ProgressStore) LoadLegacyProgress(ctx context.Context) ([]byte, error) {
	if t.Legacy == "" {
		return nil, nil
	}
	return t.Sink.LoadProgress(ctx, Progress{Topic: t.Topic, Key: t.Legacy})
}
func (t ProgressStore) WriteProgress(ctx context.Context, v []byte) error {
	return t.Sink.WriteProgress(ctx, t.Progress, v)
}

// String names the record, for logs and errors.
func (t ProgressStore) String() string { return "topic " + t.Topic + ", key " + t.Key }

// EnsureProgressTopic creates the compacted progress topic if it is missing
// and --create-topics allows it (ensureOwnTopic).
func (s *Sink) EnsureProgressTopic(ctx context.Context, p Progress) error {
	return s.ensureOwnTopic(ctx, p.Topic, "progress")
}

// progressRecordTimeout is how long a progress record whose writer gave up
// (ctx canceled, no deadline) may still wait in the producer.
const progressRecordTimeout = 30 * time.Second

// WriteProgress stores value as the slot's latest progress record.
func (s *Sink) WriteProgress(ctx context.Context, p Progress, value []byte) error {
	rec := &kgo.Record{Topic: p.Topic, Key: []byte(p.Key), Value: value}
	// The record itself does not end with ctx, only the wait for it does:
	// franz-go fails every record buffered behind a first one whose context
	// ended (on its partition, or while the topic's metadata loads), so a
	// write abandoned at shutdown (the writer goroutine's) would fail the
	// session's final write behind it, and the final confirmation would
	// stay behind the old record. It lives to ctx's deadline, if any, or
	// progressRecordTimeout.
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(progressRecordTimeout)
	}
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), dl)
	// Bounded: a shutdown waits for this writer (--shutdown-timeout).
	if err := s.produceWithin(ctx, rctx, rec, cancel); err != nil {
		return fmt.Errorf("kafka: write progress record to %s: %w", p.Topic, err)
	}
	return nil
}

// LoadProgress reads the progress topic to its end and returns the slot's
// latest record (nil if it has none).
func (s *Sink) LoadProgress(ctx context.Context, p Progress) ([]byte, error) {
	ends, err := kadm.NewClient(s.cl()).ListEndOffsets(ctx, p.Topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: progress end offsets: %w", err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil, nil
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.ConsumeTopics(p.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, s.conn...)...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var last []byte
	for len(want) > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka: read progress: %w", err)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if string(r.Key) == p.Key {
				last = r.Value
			}
			if end, ok := want[r.Partition]; ok && r.Offset >= end-1 {
				delete(want, r.Partition)
			}
		})
	}
	return last, nil
}
