package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

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
