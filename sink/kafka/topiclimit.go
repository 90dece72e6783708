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

// topicLimits caches topics' max.message.bytes for Check. A record the
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
}

// unknownLimitRetry is how long an unknown limit (a topic not created yet,
// no DescribeConfigs permission, Kafka down) stays unknown before Check asks
// again.
const unknownLimitRetry = 30 * time.Second

// limit is topic's max.message.bytes, 0 if unknown. fresh describes it
// again (before a refusal: an operator may have raised it to release a
// held event).
func (l *topicLimits) limit(ctx context.Context, s *Sink, topic string, fresh bool) int {
	if m := l.m.Load(); m != nil && !fresh {
		if v, ok := (*m)[topic]; ok && (v.bytes > 0 || time.Since(v.at) < unknownLimitRetry) {
			return v.bytes
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	n, _ := describeMaxMessageBytes(dctx, kadm.NewClient(s.cl()), topic)
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]topicLimit{}
	if m := l.m.Load(); m != nil {
		for k, v := range *m {
			next[k] = v
		}
	}
	next[topic] = topicLimit{bytes: n, at: time.Now()}
	l.m.Store(&next)
	return n
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
// max.message.bytes. Only without compression: the broker counts the
// compressed batch, which Check cannot know.
func (s *Sink) checkTopicLimit(ctx context.Context, topic string, size int) error {
	if s.compressed || topic == "" {
		return nil
	}
	lim := s.limits.limit(ctx, s, topic, false)
	if lim <= 0 || size <= lim {
		return nil
	}
	if lim = s.limits.limit(ctx, s, topic, true); lim <= 0 || size <= lim {
		return nil
	}
	return &TopicLimitError{Topic: topic, Size: size, Limit: lim, bootstrap: s.topics.bootstrap()}
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
	return fmt.Sprintf("the record batch is %d bytes, more than topic %s's max.message.bytes %d: raise it (kafka-configs.sh --bootstrap-server %s --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d), or use --on-invalid dead-letter",
		e.Size, e.Topic, e.Limit, e.bootstrap, e.Topic, e.Size)
}

// Retryable reports that the broker may accept the record later.
func (e *TopicLimitError) Retryable() bool { return true }
