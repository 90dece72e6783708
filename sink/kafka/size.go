package kafka

import (
	"context"
	"fmt"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// batchOverhead is the size of a record batch (v2) holding no records, with
// the length prefix of the records array it travels in: base offset, batch
// length, leader epoch, magic, CRC, attributes, last offset delta, first and
// max timestamps, producer id and epoch, base sequence and the record count.
const batchOverhead = 4 + 8 + 4 + 4 + 1 + 4 + 2 + 4 + 8 + 8 + 8 + 2 + 4 + 4

// BatchSize is the size of a record batch carrying rec alone, uncompressed
// (the worst case), counted the strictest way the producer counts it against
// --max-message-bytes (a produce request of versions 3 to 8); the other
// request versions, and the broker's own check against max.message.bytes,
// count up to a few bytes less, so a record that passes here passes there.
// Header keys and counts are included: a record with many small headers can
// be far larger than its key and value.
func BatchSize(rec *router.Record) int {
	l := 1 + 1 + 1 + // attributes, timestamp delta 0, offset delta 0
		varintLen(len(rec.Key)) + len(rec.Key) +
		varintLen(len(rec.Value)) + len(rec.Value) +
		varintLen(len(rec.Headers))
	if rec.Key == nil {
		l = l - varintLen(0) + varintLen(-1)
	}
	if rec.Value == nil {
		l = l - varintLen(0) + varintLen(-1)
	}
	for _, h := range rec.Headers {
		l += varintLen(len(h.Key)) + len(h.Key) + varintLen(len(h.Value)) + len(h.Value)
	}
	return batchOverhead + varintLen(l) + l
}

// varintLen is the length of n as a zig-zag varint.
func varintLen(n int) int {
	u := uint64(n<<1) ^ uint64(n>>63)
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// Check says, before the record is produced, whether Kafka would refuse it:
// larger than the producer's batch limit (--max-message-bytes) or than the
// topic's max.message.bytes (topiclimit.go; uncompressed), or an
// explicit partition the topic does not have. The error is a sink.Error of
// kind Rejected, so the invalid-event policy applies before anything is sent.
func (s *Sink) Check(ctx context.Context, rec *router.Record) error {
	size := BatchSize(rec)
	if s.maxBatch > 0 && size > s.maxBatch {
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("the record batch is %d bytes, more than --max-message-bytes %d: raise it (and the topic's max.message.bytes)", size, s.maxBatch)}
	}
	if err := s.checkTopicLimit(ctx, rec.Topic, size, false); err != nil {
		return &sink.Error{Kind: sink.Rejected, Err: err}
	}
	if rec.Partition < 0 {
		return nil
	}
	n, err := s.partitions.count(ctx, s, rec.Topic, false)
	if err == nil && int(rec.Partition) >= n && n > 0 {
		n, err = s.partitions.count(ctx, s, rec.Topic, true) // partitions may have been added
	}
	if err != nil || n == 0 {
		return nil // unknown yet: the producer will fail the record if it must
	}
	if int(rec.Partition) >= n {
		return &sink.Error{Kind: sink.Rejected, Err: fmt.Errorf("partition %d does not exist: topic %s has %d partitions (0-%d); fix the row's partition column, or add partitions with kafka-topics.sh --alter --topic %s --partitions %d", rec.Partition, rec.Topic, n, n-1, rec.Topic, rec.Partition+1)}
	}
	return nil
}

// partitionCache remembers topics' partition counts for Check. A count only
// grows, so a cached count that allows a partition stays right; one that
// refuses is looked up again before the refusal.
type partitionCache struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *partitionCache) count(ctx context.Context, s *Sink, topic string, fresh bool) (int, error) {
	c.mu.Lock()
	n, ok := c.n[topic]
	c.mu.Unlock()
	if ok && !fresh {
		return n, nil
	}
	md, err := kadm.NewClient(s.cl()).Metadata(ctx, topic)
	if err != nil {
		return 0, err
	}
	td, ok := md.Topics[topic]
	if !ok || td.Err != nil {
		return 0, nil
	}
	n = len(td.Partitions)
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[topic] = n
	c.mu.Unlock()
	return n, nil
}

// prepareProbe readies the producer for a probe of rec, which must go out
// alone: a broker refuses whole batches, so a probe that shares its batch
// with other records answers for them too (issue 31: a 420-byte probe went
// out in a 1,472-byte batch and was refused with it). It reports answered when
// the probe is answered already: err the refusal (the topic's limit, read
// again from the broker, is smaller than the record), or nil without
// producing (below).
//
// At-least-once, records of the session before the probe may still be in
// the producer's buffer (or wait for their topic's check, topics.go), in
// the probe's partition: prepareProbe waits until every one has its
// answer, so the probe is the only record buffered (the
// relay produces nothing while it waits for the probe). With nothing in
// flight it is also where a client whose batch limit for the topic no
// longer matches the topic's limit (batchMax) is replaced.
//
// Exactly-once, the relay commits the open Kafka transaction before a probe
// (or holds, with nothing open), so nothing else is buffered; but the
// client may not be replaced: a new transactional producer fences, which
// only the slot's holder may do (a hold has no slot). A client that would
// refuse the record itself, from the topic's old, smaller limit, would
// keep a held event held after the operator raised the limit; since the
// limit just read admits the record, the probe reports it accepted without
// producing, and the next session's new producer (Reset) sizes batches by
// the new limit. Should the broker still refuse the record then, the
// record is refused and probed again, by that new producer.
func (s *Sink) prepareProbe(ctx context.Context, rec *router.Record) (answered bool, err error) {
	size := BatchSize(rec)
	if size > s.maxBatch {
		return true, s.Check(ctx, rec)
	}
	if err := s.checkTopicLimit(ctx, rec.Topic, size, true); err != nil {
		return true, &sink.Error{Kind: sink.Rejected, Err: err}
	}
	held, stale := s.staleCap(rec.Topic)
	if s.txn != nil {
		return stale && size > held, nil
	}
	err = s.topics.waitFlushed(ctx, rec.Topic)
	if err == nil {
		err = s.cl().Flush(ctx)
	}
	if err != nil {
		return true, classify(fmt.Errorf("kafka: waiting for the records before the probe: %w", err), false)
	}
	if stale {
		if err := s.renew(); err != nil {
			return true, &sink.Error{Kind: sink.Transient, Err: err}
		}
	}
	return false, nil
}

// renew replaces the client (at-least-once, nothing buffered): the new one
// loads every partition again, with batch limits from the topics' limits
// known now. A new client is a new idempotent producer id, so sequence
// numbers start over without a gap the broker would refuse.
func (s *Sink) renew() error {
	client, err := kgo.NewClient(s.opts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	s.caps.Clear()
	s.client.Swap(client).Close()
	return nil
}
