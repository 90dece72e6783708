package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ReadAll reads the given topics from the start, without a consumer group,
// until at least want records were read or ctx ends. Records come back
// grouped as fetched, each partition in offset order; the last fetch may
// push the count past want. If ctx ends first, the records read so far are
// returned with an error stating got/want. With want <= 0 it reads until
// ctx ends and returns everything without error. opts are appended to the
// client options (SASL, TLS, isolation level, ...).
func ReadAll(ctx context.Context, brokers []string, topics []string, want int, opts ...kgo.Opt) ([]*kgo.Record, error) {
	return read(ctx, brokers, want, append([]kgo.Opt{kgo.ConsumeTopics(topics...)}, opts...))
}

// ReadMatching is ReadAll for every topic matching the regular expression
// pattern (e.g. `^outbox\..*`), including topics created while reading.
func ReadMatching(ctx context.Context, brokers []string, pattern string, want int, opts ...kgo.Opt) ([]*kgo.Record, error) {
	return read(ctx, brokers, want, append([]kgo.Opt{kgo.ConsumeTopics(pattern), kgo.ConsumeRegex()}, opts...))
}

func read(ctx context.Context, brokers []string, want int, opts []kgo.Opt) ([]*kgo.Record, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Notice new or not-yet-created topics quickly.
		kgo.MetadataMinAge(100 * time.Millisecond),
		kgo.MetadataMaxAge(time.Second),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("creating kafka client: %w", err)
	}
	defer cl.Close()

	var (
		recs    []*kgo.Record
		lastErr error // fetch errors are retried; the last one explains a timeout
	)
	for want <= 0 || len(recs) < want {
		fetches := cl.PollFetches(ctx)
		recs = append(recs, fetches.Records()...)
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				lastErr = fmt.Errorf("fetching %s[%d]: %w", topic, part, err)
			}
		})
		if ctx.Err() != nil {
			break
		}
	}
	if want > 0 && len(recs) < want {
		if lastErr != nil {
			return recs, fmt.Errorf("read %d of %d records: %w (last fetch error: %w)", len(recs), want, ctx.Err(), lastErr)
		}
		return recs, fmt.Errorf("read %d of %d records: %w", len(recs), want, ctx.Err())
	}
	return recs, nil
}

// ReadCommitted reads topics from the start as a read_committed consumer up
// to each partition's last stable offset as it stands when called: every
// transaction that ended by then is in (committed records) or out (aborted
// ones), and transactions still open hold the rest back. It ends on that
// condition, not on a quiet spell, so a loaded machine (a first fetch that
// takes seconds) makes it slower, never shorter; ctx only bounds the wait,
// and ending there is an error naming the partitions not read up to their
// stable offset. opts are appended to the client options (SASL, TLS).
//
// The consumer keeps control records to count the markers as read; they are
// not returned. A partition whose last offset below the stable offset is an
// aborted record whose marker lies above it (two producers' transactions
// interleaved) is read until ctx ends: the outboxd tests have one producer
// per partition at a time.
func ReadCommitted(ctx context.Context, brokers []string, topics []string, opts ...kgo.Opt) ([]*kgo.Record, error) {
	base := []kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("creating kafka client: %w", err)
	}
	defer cl.Close()
	stable, err := kadm.NewClient(cl).ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("listing the last stable offsets of %v: %w", topics, err)
	}
	type tp struct {
		topic string
		part  int32
	}
	left := map[tp]int64{} // until read up to its stable offset
	stable.Each(func(o kadm.ListedOffset) {
		switch {
		case errors.Is(o.Err, kerr.UnknownTopicOrPartition): // a topic never written: nothing to read
		case o.Err != nil && err == nil:
			err = fmt.Errorf("last stable offset of %s[%d]: %w", o.Topic, o.Partition, o.Err)
		case o.Offset > 0:
			left[tp{o.Topic, o.Partition}] = o.Offset
		}
	})
	if err != nil {
		return nil, err
	}
	var (
		recs    []*kgo.Record
		lastErr error
	)
	for len(left) > 0 {
		fetches := cl.PollFetches(ctx)
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				lastErr = fmt.Errorf("fetching %s[%d]: %w", topic, part, err)
			}
		})
		fetches.EachRecord(func(r *kgo.Record) {
			p := tp{r.Topic, r.Partition}
			end, ok := left[p]
			if !ok || r.Offset >= end {
				return // read up to it already, or past the stable offset listed at the start
			}
			if !r.Attrs.IsControl() {
				recs = append(recs, r)
			}
			if r.Offset == end-1 {
				delete(left, p)
			}
		})
		if len(left) > 0 && ctx.Err() != nil {
			if lastErr != nil {
				return recs, fmt.Errorf("read %d records; partitions not read up to their last stable offset %v: %w (last fetch error: %w)", len(recs), left, ctx.Err(), lastErr)
			}
			return recs, fmt.Errorf("read %d records; partitions not read up to their last stable offset %v: %w", len(recs), left, ctx.Err())
		}
	}
	return recs, nil
}
