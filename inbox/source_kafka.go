package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkaSource consumes Kafka with a consumer group: a lane per assigned
// partition, offsets marked after the database commit and committed by
// franz-go's autocommit of marks (and synchronously when a partition is
// revoked or the consumer stops).
type kafkaSource struct {
	c  *Consumer
	cl *kgo.Client
}

func (k *kafkaSource) run(ctx context.Context) error {
	c := k.c
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		// A new group starts at the oldest event: an event outboxd
		// published before the consumer first ran is still an effect due.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// outboxd --exactly-once writes in Kafka transactions; aborted
		// ones must never reach a handler. For a plain producer it is the
		// same as read_uncommitted.
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Offsets move only for marked records, and a record is marked
		// only after its database transaction committed.
		kgo.AutoCommitMarks(),
		kgo.AutoCommitInterval(time.Second),
		// A partition resumed after a backlog joins the next fetch to its
		// broker only once the one in flight returns; with franz-go's 5s
		// default, a fetch long-polling for idle partitions would hold it
		// that long (measured: 100-event batches slower than single events
		// on Apache Kafka). 250ms costs an idle consumer 4 fetches a second.
		kgo.FetchMaxWait(250 * time.Millisecond),
		kgo.OnPartitionsAssigned(k.assigned),
		kgo.OnPartitionsRevoked(k.revoked),
		kgo.OnPartitionsLost(k.lost),
		kgo.WithLogger(kgoLogger{c.log}),
	}, c.cfg.KafkaOpts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("inbox: kafka client: %w", err)
	}
	k.cl = cl
	if c.cfg.DeadLetterTopic != "" {
		c.s.deadLetter = k.deadLetter
	}
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("inbox: fetch error (franz-go retries)", "topic", topic, "partition", part, "error", err)
			}
		})
		fetches.EachPartition(k.dispatch)
		if fetches.NumRecords() == 0 && fetches.Err() != nil {
			// An error franz-go returns at once (an authorisation failure,
			// say) must not spin the loop.
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return k.shutdown()
}

// shutdown stops every partition after its current batch, commits the marked
// offsets and leaves the group.
func (k *kafkaSource) shutdown() error {
	k.c.stopAllLanes()
	cctx, cancel := context.WithTimeout(context.Background(), k.c.cfg.ShutdownTimeout)
	defer cancel()
	if err := k.cl.CommitMarkedOffsets(cctx); err != nil {
		k.c.log.Warn("inbox: committing offsets at shutdown failed; the next start replays the uncommitted events as duplicates", "error", err)
	}
	k.cl.Close()
	return nil
}

// assigned starts a lane per new partition.
func (k *kafkaSource) assigned(_ context.Context, cl *kgo.Client, assigned map[string][]int32) {
	for topic, parts := range assigned {
		for _, part := range parts {
			if k.c.lane(tp{topic, part}) != nil {
				continue
			}
			k.c.openLane(topic, part, func(ev *Event) { cl.MarkCommitRecords(ev.src.(*kgo.Record)) }, laneOpts{
				offsets: true,
				pause:   func() { cl.PauseFetchPartitions(map[string][]int32{topic: {part}}) },
				resume:  func() { cl.ResumeFetchPartitions(map[string][]int32{topic: {part}}) },
			})
		}
	}
	if len(assigned) > 0 {
		k.c.log.Info("inbox: partitions assigned", "partitions", fmtParts(assigned))
	}
}

// revoked runs inside the rebalance: the partitions' goroutines finish their
// current batch, their offsets are committed, and only then does the callback
// return and the group hand the partitions to another member, which resumes
// exactly after what this one applied.
func (k *kafkaSource) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	n := k.stop(revoked)
	if err := cl.CommitMarkedOffsets(ctx); err != nil {
		k.c.log.Warn("inbox: committing offsets of revoked partitions failed; their next owner replays the uncommitted events as duplicates", "error", err)
	}
	if n > 0 {
		k.c.log.Info("inbox: partitions revoked", "partitions", fmtParts(revoked))
	}
}

// lost: the group moved on without us (a session timeout), another member
// may be applying these partitions already. Stop without committing; the
// inbox rows dedupe whatever both of us applied.
func (k *kafkaSource) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	k.stop(lost)
	k.c.log.Warn("inbox: partitions lost (session timeout or fatal group error); their next owner replays the uncommitted events as duplicates", "partitions", fmtParts(lost))
}

func (k *kafkaSource) stop(m map[string][]int32) int {
	var keys []tp
	for topic, parts := range m {
		for _, part := range parts {
			if k.c.lane(tp{topic, part}) != nil {
				keys = append(keys, tp{topic, part})
			}
		}
	}
	if len(keys) > 0 {
		k.c.stopLanes(keys)
	}
	return len(keys)
}

// dispatch hands a fetched partition's records to its lane. Records of a
// partition no longer ours are dropped: nothing was marked for them, so
// their new owner fetches them from the committed offset.
func (k *kafkaSource) dispatch(fp kgo.FetchTopicPartition) {
	if len(fp.Records) == 0 {
		return
	}
	p := k.c.lane(tp{fp.Topic, fp.Partition})
	if p == nil {
		return
	}
	evs := make([]*Event, len(fp.Records))
	for i, r := range fp.Records {
		evs[i] = eventOf(r)
	}
	p.push(evs, fp.HighWatermark)
}

func eventOf(r *kgo.Record) *Event {
	ev := &Event{Key: r.Key, Value: r.Value, Headers: r.Headers, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp, src: r}
	fillIDs(ev)
	readCloudEvent(ev, ceKafka, headerValue(ev, "content-type"))
	return ev
}

// deadLetter produces a poison event to DeadLetterTopic and waits for the ack.
func (k *kafkaSource) deadLetter(ctx context.Context, ev *Event, attempts int, cause error) error {
	hdrs := append([]kgo.RecordHeader(nil), ev.Headers...)
	hdrs = append(hdrs,
		kgo.RecordHeader{Key: "inbox.error", Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: "inbox.attempts", Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: "inbox.source", Value: []byte(fmt.Sprintf("%s/%d/%d", ev.Topic, ev.Partition, ev.Offset))},
		kgo.RecordHeader{Key: "inbox.consumer", Value: []byte(k.c.cfg.Name)},
	)
	rec := &kgo.Record{Topic: k.c.cfg.DeadLetterTopic, Key: ev.Key, Value: ev.Value, Headers: hdrs}
	return k.cl.ProduceSync(ctx, rec).FirstErr()
}

func fmtParts(m map[string][]int32) string {
	s := ""
	for t, ps := range m {
		if s != "" {
			s += " "
		}
		s += fmt.Sprintf("%s%v", t, ps)
	}
	return s
}

// kgoLogger sends franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }
func (k kgoLogger) Log(level kgo.LogLevel, msg string, kv ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	k.l.Log(context.Background(), lv, "kafka: "+msg, kv...)
}
