package nats

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ProgressStore is at-least-once mode's progress record (how far outboxd
// has confirmed a slot, on which server) in a JetStream key-value bucket:
// it outlives the slot, so a lost slot or a server behind what was
// published is recognised at startup (outboxd.Config.ProgressStore).
type ProgressStore struct {
	Sink     *Sink
	Bucket   string // default "outboxd_progress"
	Key      string // "<system identifier>/<slot>"
	Replicas int    // of the bucket, if outboxd creates it (default 1)
}

func (p ProgressStore) bucket() string {
	if p.Bucket == "" {
		return "outboxd_progress"
	}
	return p.Bucket
}

// EnsureProgressTopic creates the bucket if it is missing (one value per
// key kept, file storage).
func (p ProgressStore) EnsureProgressTopic(ctx context.Context) error {
	_, err := p.Sink.js.KeyValue(ctx, p.bucket())
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = p.Sink.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: p.bucket(), Description: "outboxd's progress records (one per slot)",
			History: 1, Storage: jetstream.FileStorage, Replicas: max(p.Replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("nats: progress bucket %s: %w", p.bucket(), err)
	}
	return nil
}

// LoadProgress returns the record (nil: none yet).
func (p ProgressStore) LoadProgress(ctx context.Context) ([]byte, error) {
	kv, err := p.Sink.js.KeyValue(ctx, p.bucket())
	if err != nil {
		return nil, fmt.Errorf("nats: progress bucket %s: %w", p.bucket(), err)
	}
	e, err := kv.Get(ctx, p.Key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nats: read progress %s: %w", p, err)
	}
	return e.Value(), nil
}

// WriteProgress stores value as the slot's latest record.
func (p ProgressStore) WriteProgress(ctx context.Context, value []byte) error {
	kv, err := p.Sink.js.KeyValue(ctx, p.bucket())
	if err == nil {
		_, err = kv.Put(ctx, p.Key, value)
	}
	if err != nil {
		return fmt.Errorf("nats: write progress %s: %w", p, err)
	}
	return nil
}

// String names the record, for logs and errors.
func (p ProgressStore) String() string { return "bucket " + p.bucket() + ", key " + p.Key }
