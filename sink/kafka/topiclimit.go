package kafka

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// topicLimits caches topics' max.message.bytes for Check and for the
// producer's batch size (batchMax). A record the
// topic is too small for must be refused before it is produced, not by
// the broker: franz-go then fails the partition's whole buffer, but a
// record handed to it right after starts a new buffer and is written, and
// the relay learns of the failure only from the failed record's callback,
// which runs later, behind others. Kafka would hold the aggregate's later
// events before the refused one, which the relay delivers once it is
// accepted (issue 22, item 8d): out of order for every consumer. franz-go
// gives no synchronous signal to stop at, and waiting for each record's
// ack before the next would end pipelining; so Check keeps the one
// record-specific refusal that can be foreseen from happening at all.
//
// Check runs for every record: the map is copy-on-write, read with one
// atomic load; writers (a topic's first record, a refresh) take mu.
type topicLimits struct {
	m  atomic.Pointer[map[string]topicLimit]
	mu sync.Mutex
}

type topicLimit struct {
	bytes int       // 0: unknown (not described yet, or refused)
	at    time.Time // when it was described
	stale bool      // the broker refused a batch as too large since: ask again (forget)
}

// unknownLimitRetry is how long an unknown limit (a topic not created yet,
// no DescribeConfigs permission, Kafka down) stays unknown before Check asks
// again.
const unknownLimitRetry = 30 * time.Second

// limit is topic's max.message.bytes, 0 if unknown. fresh describes it
// again (before a refusal: an operator may have raised it to release a
// held event). A failed description keeps the limit last known: it says
// nothing of the limit, and forgetting it would size the topic's batches by
// --max-message-bytes again (batchMax).
func (l *topicLimits) limit(ctx context.Context, s *Sink, topic string, fresh bool) int {
	var old topicLimit
	if m := l.m.Load(); m != nil {
		v, ok := (*m)[topic]
		if ok && !fresh && !v.stale && (v.bytes > 0 || time.Since(v.at) < unknownLimitRetry) {
			return v.bytes
		}
		old = v
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, err := describeMaxMessageBytes(dctx, kadm.NewClient(s.cl()), topic)
	if err != nil {
		n = old.bytes
	}
	l.set(topic, topicLimit{bytes: n, at: time.Now()})
	return n
}

// set stores topic's entry (copy on write).
func (l *topicLimits) set(topic string, v topicLimit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]topicLimit{}
	if m := l.m.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	next[topic] = v
	l.m.Store(&next)
}

// forget marks topic's limit stale: the next limit call asks the broker. A
// broker refused a batch as too large: its limit may have been lowered
// since it was described. Called from produce callbacks, so it never waits
// for the broker.
func (l *topicLimits) forget(topic string) {
	if m := l.m.Load(); m != nil {
		if v, ok := (*m)[topic]; ok && !v.stale {
			v.stale = true
			l.set(topic, v)
		}
	}
}

// cached is topic's limit as last described, without asking (0: unknown).
func (l *topicLimits) cached(topic string) int {
	if m := l.m.Load(); m != nil {
		return (*m)[topic].bytes
	}
	return 0
}

func describeMaxMessageBytes(ctx context.Context, adm *kadm.Client, topic string) (int, error) {
	rc, err := adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return 0, err
	}
	c, err := rc.On(topic, nil)
	if err != nil {
		return 0, err
	}
	if c.Err != nil {
		return 0, c.Err
	}
	for _, kv := range c.Configs {
		if kv.Key == "max.message.bytes" && kv.Value != nil {
			return strconv.Atoi(*kv.Value)
		}
	}
	return 0, fmt.Errorf("topic %s: no max.message.bytes", topic)
}

// checkTopicLimit refuses a record whose batch is larger than its topic's
// max.message.bytes, counted uncompressed even when --compression is on:
// the producer sizes its batches by the limit before compressing them
// (batchMax), so it would refuse such a record itself, after Check, on the
// asynchronous path that can reorder. fresh asks the broker first.
func (s *Sink) checkTopicLimit(ctx context.Context, topic string, size int, fresh bool) error {
	if topic == "" {
		return nil
	}
	lim := s.limits.limit(ctx, s, topic, fresh)
	if lim <= 0 || size <= lim {
		return nil
	}
	if !fresh {
		if lim = s.limits.limit(ctx, s, topic, true); lim <= 0 || size <= lim {
			return nil
		}
	}
	return &TopicLimitError{Topic: topic, Size: size, Limit: lim, bootstrap: s.topics.bootstrap()}
}

// batchMax is the producer's record batch limit for topic
// (kgo.ProducerBatchMaxBytesFn): --max-message-bytes, or the topic's
// max.message.bytes if smaller.
//
// franz-go packs a partition's records into one batch up to this size, and
// the broker checks the whole batch against the topic's max.message.bytes.
// A single global cap (--max-message-bytes, 1,000,012 by default) lets
// records that each fit a topic with a smaller limit travel together in a
// batch the broker refuses as a whole (issue 31, item 2): the refusal is
// asynchronous, so the relay's refusal path runs for events that were
// valid, and can write a later event of an aggregate before an earlier one.
// A global cap lowered to the smallest limit among the destination topics
// would shrink every topic's batches for one small topic, and which topics
// a relay writes to is known only as events arrive; waiting for each
// record's ack would end pipelining. A cap per topic costs nothing per
// record: franz-go asks once per partition, when it first loads the
// partition's metadata, which is after Check described the topic (Check
// runs before a topic's first record is produced).
//
// Counted before compression, the cap is exact without compression and
// conservative with it: a compressed batch is smaller (franz-go sends a
// batch uncompressed if compressing grows it), so it passes the broker's
// check too; in exchange a record must fit the topic's limit uncompressed,
// as it must fit --max-message-bytes. The producer counts a batch 4 bytes
// larger than the broker does (the records array's length prefix, as
// BatchSize counts it), so a batch at the cap passes the broker's check.
//
// franz-go keeps the cap for the life of the partition's buffer: a limit
// changed later is picked up by a new client. A broker's refusal forgets
// the topic's limit (Produce's callback); exactly-once's next producer
// session (Reset) builds a new client anyway, and at-least-once rebuilds it
// before a probe (prepareProbe), when nothing is in flight. Until then a
// raised limit only leaves batches smaller than they could be. A limit not
// known (no DescribeConfigs permission) leaves --max-message-bytes; a
// topic created after Check asked is described again before its records
// reach the producer (topicFound). franz-go refuses caps below 512 bytes; a
// topic whose limit is lower gets 512.
func (s *Sink) batchMax(topic string) int32 {
	n := s.capFor(topic)
	if topic != "" {
		s.caps.Store(topic, n) // what the client now holds (staleCap)
	}
	return int32(n)
}

// capFor is batchMax's value for topic from the limits known now.
func (s *Sink) capFor(topic string) int {
	n := s.maxBatch
	if lim := s.limits.cached(topic); topic != "" && lim > 0 && lim < n {
		n = max(lim, 512)
	}
	return n
}

// topicFound reads the limit of a topic that had none known when its
// first record was checked (it did not exist yet: outboxd or the broker
// creates it), before the producer loads its partitions and asks batchMax.
func (s *Sink) topicFound(ctx context.Context, topic string) {
	if s.limits.cached(topic) == 0 {
		s.limits.limit(ctx, s, topic, true)
	}
}

// staleCap reports the batch limit the client holds for topic if it is no
// longer the one the topic's known limit gives (ok false: it holds the
// right one, or has not loaded the topic yet).
func (s *Sink) staleCap(topic string) (held int, ok bool) {
	v, loaded := s.caps.Load(topic)
	if !loaded || v.(int) == s.capFor(topic) {
		return 0, false
	}
	return v.(int), true
}

// TopicLimitError is Check's refusal of a record larger than its topic's
// max.message.bytes. Unlike --max-message-bytes, the limit is the broker's
// to change: Retryable tells the relay to retry the held event with
// backoff, as it does one the broker refused, rather than hold it until a
// restart.
type TopicLimitError struct {
	Topic       string
	Size, Limit int
	bootstrap   string
}

func (e *TopicLimitError) Error() string {
	return fmt.Sprintf("the record batch is %d bytes, more than topic %s's max.message.bytes %d: raise it (kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d)",
		e.Size, e.Topic, e.Limit, e.bootstrap, e.Topic, e.Size)
}

// Retryable reports that the broker may accept the record later.
func (e *TopicLimitError) Retryable() bool { return true }
