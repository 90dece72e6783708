package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Missing topics. A production broker runs with auto.create.topics.enable
// off, so a produce to a topic nobody created only ever gets
// UNKNOWN_TOPIC_OR_PARTITION. Like Kafka Connect's topic.creation.default.*
// for Debezium, outboxd creates a topic through the admin API before its
// first record. Where it may not (creation turned off, no CREATE ACL, a
// policy refusal) it holds that topic's records, unsent and unacked, so the
// slot is never confirmed past them; it says once, naming the topic and the
// command that fixes it, and looks again every few seconds: once an
// operator has created the topic, the records go out in their order.

// TopicConfig is how the sink creates missing topics.
type TopicConfig struct {
	// Create: create missing topics (--create-topics), outboxd's own
	// compacted checkpoint and progress topics included (with Create
	// false, those must exist: outboxd says how to create them).
	Create            bool
	Partitions        int32             // -1: the broker's num.partitions
	ReplicationFactor int16             // -1: the broker's default.replication.factor
	Configs           map[string]string // configs of created topics (--topic-config)
	// OnHold hears that a topic cannot be used (err != nil, a *TopicHoldError)
	// and, later, that it can (err == nil). It must not block.
	OnHold func(topic string, err error)
	// Durability, if set, hears each topic that can lose records it
	// acknowledged (durability.go), checked once when the topic is first
	// found usable.
	Durability func(dest, warning string)
}

// TopicHoldError says why records for a topic are held and how to fix it.
type TopicHoldError struct {
	Topic  string
	Reason string
	Fix    string
}

func (e *TopicHoldError) Error() string {
	return fmt.Sprintf("kafka topic %q is missing and %s; its events are held (nothing past them is confirmed): %s", e.Topic, e.Reason, e.Fix)
}

// holdRecheck is how often a held topic is looked at again.
const holdRecheck = 5 * time.Second

// topics is the create-once cache: every topic is checked (and created if
// need be) before its first record; records that arrive meanwhile wait in
// Produce order.
type topics struct {
	cfg     TopicConfig
	log     *slog.Logger
	client  func() *kgo.Client
	brokers []string

	ready sync.Map // topic → struct{}: usable, produce directly
	// found runs once a topic is usable, before its waiting records are
	// handed to the producer (the sink reads its max.message.bytes, which
	// the producer's batch limit for it comes from: topiclimit.go).
	found   func(ctx context.Context, topic string)
	mu      sync.Mutex
	pending map[string][]pendingRecord // topics being checked, their waiting records
	drained *sync.Cond                 // signalled when pending shrinks
	ctx     context.Context            // ends with Close
	stop    context.CancelFunc
}

type pendingRecord struct {
	ctx  context.Context
	rec  *kgo.Record
	done func(*kgo.Record, error)
}

func newTopics(cfg TopicConfig, log *slog.Logger, brokers []string, client func() *kgo.Client) *topics {
	if cfg.Partitions == 0 {
		cfg.Partitions = -1
	}
	if cfg.ReplicationFactor == 0 {
		cfg.ReplicationFactor = -1
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &topics{cfg: cfg, log: log, client: client, brokers: brokers, pending: map[string][]pendingRecord{}}
	t.drained = sync.NewCond(&t.mu)
	t.ctx, t.stop = context.WithCancel(context.Background())
	return t
}

// admit queues rec if its topic has not been found usable yet, and reports
// whether it did; the caller produces an admitted-false record itself.
func (t *topics) admit(ctx context.Context, rec *kgo.Record, done func(*kgo.Record, error)) bool {
	if _, ok := t.ready.Load(rec.Topic); ok {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.ready.Load(rec.Topic); ok {
		return false // became ready meanwhile; everything before rec was handed on
	}
	if t.ctx.Err() != nil {
		go done(rec, errors.New("kafka: sink closed"))
		return true
	}
	q, checking := t.pending[rec.Topic]
	t.pending[rec.Topic] = append(q, pendingRecord{ctx: ctx, rec: rec, done: done})
	if !checking {
		go t.ensure(rec.Topic)
	}
	return true
}

// ensure checks (and creates) topic until it is usable, then hands its
// waiting records to the producer in order.
func (t *topics) ensure(topic string) {
	held := false
	wait := 250 * time.Millisecond
	for {
		err := t.check(t.ctx, topic)
		if t.ctx.Err() != nil {
			return
		}
		if err == nil {
			if t.found != nil {
				t.found(t.ctx, topic)
			}
			t.mu.Lock()
			for _, p := range t.pending[topic] {
				t.client().Produce(p.ctx, p.rec, p.done)
			}
			delete(t.pending, topic)
			t.ready.Store(topic, struct{}{})
			t.drained.Broadcast()
			t.mu.Unlock()
			if t.cfg.Durability != nil {
				t.checkDurability(topic) // on ensure's goroutine: the records are on their way
			}
			if held {
				t.log.Info("kafka topic is there now; its held events are sent", "topic", topic)
				if t.cfg.OnHold != nil {
					t.cfg.OnHold(topic, nil)
				}
			}
			return
		}
		var hold *TopicHoldError
		if errors.As(err, &hold) {
			if !held {
				held = true
				t.log.Error("kafka topic missing; holding its events", "topic", topic, "err", err)
				if t.cfg.OnHold != nil {
					t.cfg.OnHold(topic, err)
				}
			}
			wait = holdRecheck
		} else {
			t.log.Debug("kafka topic check failed; retrying", "topic", topic, "err", err)
			wait = min(wait*2, holdRecheck)
		}
		select {
		case <-t.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// check returns nil once topic exists, a *TopicHoldError when it is missing
// and outboxd may not create it, and any other error for what a retry can
// fix (a broker down, a controller moving).
func (t *topics) check(ctx context.Context, topic string) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cl := t.client()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	// Without --create-topics the broker's own auto-creation still applies.
	req.AllowAutoTopicCreation = !t.cfg.Create
	resp, err := req.RequestWith(cctx, cl)
	if err != nil {
		return fmt.Errorf("metadata for %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("metadata for %s: %d topics in the response", topic, len(resp.Topics))
	}
	md := resp.Topics[0]
	switch err := kerr.ErrorForCode(md.ErrorCode); {
	case err == nil && len(md.Partitions) > 0:
		return nil
	case err == nil, errors.Is(err, kerr.LeaderNotAvailable):
		return fmt.Errorf("topic %s has no partitions with leaders yet", topic)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return &TopicHoldError{Topic: topic, Reason: "outboxd's principal may not describe it (TOPIC_AUTHORIZATION_FAILED)",
			Fix: "grant it: " + t.aclCommand(topic, "Describe --operation Write --operation Create")}
	case errors.Is(err, kerr.InvalidTopicException):
		return &TopicHoldError{Topic: topic, Reason: "the broker calls the name invalid (INVALID_TOPIC_EXCEPTION)",
			Fix: "route such events to a valid topic name (route.topic.replacement)"}
	case !errors.Is(err, kerr.UnknownTopicOrPartition):
		return fmt.Errorf("metadata for %s: %w", topic, err)
	}
	if !t.cfg.Create {
		return &TopicHoldError{Topic: topic, Reason: "--create-topics is false and the broker does not auto-create topics",
			Fix: "create it: " + t.createCommand(topic) + " (or run outboxd with --create-topics)"}
	}
	return t.create(cctx, cl, topic)
}

// create issues CreateTopics; success means "look again" (nil is only
// returned by check once metadata shows the topic).
func (t *topics) create(ctx context.Context, cl *kgo.Client, topic string) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 10000
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = topic, t.cfg.Partitions, t.cfg.ReplicationFactor
	for _, k := range sortedKeys(t.cfg.Configs) {
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = k, kmsg.StringPtr(t.cfg.Configs[k])
		ct.Configs = append(ct.Configs, c)
	}
	req.Topics = append(req.Topics, ct)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("creating topic %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return fmt.Errorf("creating topic %s: %d topics in the response", topic, len(resp.Topics))
	}
	r := resp.Topics[0]
	err = kerr.ErrorForCode(r.ErrorCode)
	msg := ""
	if r.ErrorMessage != nil {
		msg = ": " + *r.ErrorMessage
	}
	switch {
	case err == nil:
		t.log.Info("created kafka topic", "topic", topic, "partitions", r.NumPartitions, "replication_factor", r.ReplicationFactor)
		return fmt.Errorf("topic %s created; waiting for it in metadata", topic)
	case errors.Is(err, kerr.TopicAlreadyExists):
		return fmt.Errorf("topic %s exists; waiting for it in metadata", topic)
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return &TopicHoldError{Topic: topic, Reason: fmt.Sprintf("outboxd's principal may not create topics (%s%s)", errName(err), msg),
			Fix: "create it: " + t.createCommand(topic) + ", or grant CREATE: " + t.aclCommand(topic, "Create")}
	case errors.Is(err, kerr.PolicyViolation), errors.Is(err, kerr.InvalidReplicationFactor),
		errors.Is(err, kerr.InvalidPartitions), errors.Is(err, kerr.InvalidConfig), errors.Is(err, kerr.InvalidReplicaAssignment),
		errors.Is(err, kerr.InvalidRequest), errors.Is(err, kerr.InvalidTopicException):
		return &TopicHoldError{Topic: topic, Reason: fmt.Sprintf("the broker refused to create it (%s%s)", errName(err), msg),
			Fix: "fix --topic-partitions, --topic-replication-factor or --topic-config, or create it: " + t.createCommand(topic)}
	}
	return fmt.Errorf("creating topic %s: %w%s", topic, err, msg)
}

func (t *topics) createCommand(topic string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka-topics.sh --bootstrap-server %s --create --topic %s", t.bootstrap(), topic)
	if t.cfg.Partitions > 0 {
		fmt.Fprintf(&b, " --partitions %d", t.cfg.Partitions)
	}
	if t.cfg.ReplicationFactor > 0 {
		fmt.Fprintf(&b, " --replication-factor %d", t.cfg.ReplicationFactor)
	}
	for _, k := range sortedKeys(t.cfg.Configs) {
		fmt.Fprintf(&b, " --config %s=%s", k, t.cfg.Configs[k])
	}
	return b.String()
}

func (t *topics) aclCommand(topic, ops string) string {
	return fmt.Sprintf("kafka-acls.sh --bootstrap-server %s --add --allow-principal User:<outboxd's user> --operation %s --topic %s", t.bootstrap(), ops, topic)
}

func (t *topics) bootstrap() string {
	if len(t.brokers) == 0 {
		return "<broker>"
	}
	return t.brokers[0]
}

// waitFlushed blocks until no record waits for a topic check, or ctx ends:
// a Kafka transaction must not commit while some of its records have not
// reached the producer. With only, it waits for those topics' records
// alone (a probe: records of other topics never share its batch, and one
// held topic must not hold up a probe of another).
func (t *topics) waitFlushed(ctx context.Context, only ...string) error {
	stop := context.AfterFunc(ctx, func() {
		t.mu.Lock()
		t.drained.Broadcast()
		t.mu.Unlock()
	})
	defer stop()
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		var waiting []string
		for n, q := range t.pending {
			if len(q) > 0 && (len(only) == 0 || slices.Contains(only, n)) {
				waiting = append(waiting, n)
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		if err := ctx.Err(); err != nil {
			sort.Strings(waiting)
			return fmt.Errorf("kafka: records wait for topic(s) %s: %w", strings.Join(waiting, ", "), err)
		}
		t.drained.Wait()
	}
}

// failPending fails every waiting record (the transaction they belong to
// is aborted, or the sink closes); the checks go on.
func (t *topics) failPending(err error) {
	t.mu.Lock()
	var failed []pendingRecord
	for topic, q := range t.pending {
		failed = append(failed, q...)
		t.pending[topic] = q[:0:0]
	}
	t.mu.Unlock()
	for _, p := range failed {
		p.done(p.rec, err)
	}
}

// close ends the checks and fails what waits.
func (t *topics) close() {
	t.stop()
	t.failPending(errors.New("kafka: sink closed"))
}

func errName(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return err.Error()
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
