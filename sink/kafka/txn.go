package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Checkpoints makes the producer transactional (exactly-once mode): records
// are committed in Kafka transactions, and each transaction also writes the
// LSN it covers to a compacted checkpoint topic, atomically. After a crash,
// read_committed consumers see each event once: the aborted tail never
// becomes visible, and the next run resumes right after the checkpoint.
type Checkpoints struct {
	Topic string // compacted, one partition
	Key   string // the slot name
}

// TransactionalID derives the producer's transactional id from the slot, so
// a second outboxd on the same slot fences the first.
func TransactionalID(slot string) string { return "outboxd." + slot }

// ErrFenced means another producer with the same transactional id took over.
var ErrFenced = errors.New("kafka: fenced by another outboxd with the same transactional id")

// TxnOpts are the client options exactly-once mode adds.
func TxnOpts(slot string) []kgo.Opt {
	return []kgo.Opt{kgo.TransactionalID(TransactionalID(slot)), kgo.TransactionTimeout(60 * time.Second)}
}

// InitTransactions registers the transactional id with the coordinator now
// rather than at the first record: that aborts whatever a previous instance
// left open and fences it, before this instance streams anything.
func (s *Sink) InitTransactions(ctx context.Context, cp Checkpoints) error {
	adm := kadm.NewClient(s.cl())
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": ptr("compact")}, cp.Topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka: create checkpoint topic %s: %w", cp.Topic, err)
	}
	if _, _, err := s.cl().ProducerID(ctx); err != nil {
		return wrapFenced(fmt.Errorf("kafka: init transactional producer: %w", err))
	}
	return nil
}

// Reset replaces the producer with a new one under the same transactional
// id, after a transaction could not be committed or aborted cleanly (Kafka
// unreachable, say): the new producer id fences the old one, and the
// coordinator aborts whatever it left open. Buffered records of the old
// client fail. It blocks until Kafka answers or ctx ends.
func (s *Sink) Reset(ctx context.Context) error {
	client, err := kgo.NewClient(s.opts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	s.client.Swap(client).Close()
	s.topics.failPending(errors.New("kafka: producer reset; the transaction was aborted"))
	return untilKafkaAnswers(ctx, func() error {
		_, _, err := client.ProducerID(ctx)
		return wrapFenced(err)
	}, "kafka: init transactional producer")
}

// untilKafkaAnswers retries fn with backoff while it fails for reasons a
// wait can cure: brokers down or unreachable, no quorum, a coordinator
// moving. On a real cluster these outlast the client's own request retries
// (two of three brokers down, say), and giving up would end outboxd.
// Fencing and authorization errors, and the end of ctx, return at once.
func untilKafkaAnswers(ctx context.Context, fn func() error, what string) error {
	wait := 250 * time.Millisecond
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || errors.Is(err, ErrFenced) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
			errors.Is(err, kerr.ClusterAuthorizationFailed) || errors.Is(err, kerr.TopicAuthorizationFailed) {
			return fmt.Errorf("%s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Begin opens a Kafka transaction.
func (s *Sink) Begin() error { return wrapFenced(s.cl().BeginTransaction()) }

// Commit writes the checkpoint, waits for every record of the transaction
// and commits it. On error the transaction is aborted; nothing of it is
// visible to read_committed consumers.
func (s *Sink) Commit(ctx context.Context, cp Checkpoints, lsn string) error {
	// Records still waiting for their topic belong to this transaction.
	if err := s.topics.waitFlushed(ctx); err != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		s.Abort(actx)
		return fmt.Errorf("kafka: commit transaction: %w", err)
	}
	rec := &kgo.Record{Topic: cp.Topic, Key: []byte(cp.Key), Value: []byte(lsn)}
	// Not ProduceSync: a record already sent to a stalled broker ignores
	// ctx, and the caller's deadline must hold.
	acked := make(chan error, 1)
	s.cl().Produce(ctx, rec, func(_ *kgo.Record, err error) { acked <- err })
	var err error
	select {
	case err = <-acked:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err == nil {
		err = s.cl().Flush(ctx)
	}
	if err == nil {
		err = s.cl().EndTransaction(ctx, kgo.TryCommit)
	}
	if err != nil {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		s.Abort(actx)
		return wrapFenced(fmt.Errorf("kafka: commit transaction: %w", err))
	}
	return nil
}

// Abort drops the open transaction and its buffered records. Should it not
// complete (Kafka unreachable), the caller resets the producer.
func (s *Sink) Abort(ctx context.Context) {
	s.topics.failPending(errors.New("kafka: transaction aborted"))
	_ = s.cl().AbortBufferedRecords(ctx)
	_ = s.cl().EndTransaction(ctx, kgo.TryAbort)
}

// LoadCheckpoint reads the checkpoint topic with read_committed isolation and
// returns the last LSN committed for cp.Key ("" if none).
func (s *Sink) LoadCheckpoint(ctx context.Context, cp Checkpoints) (string, error) {
	adm := kadm.NewClient(s.cl())
	var ends kadm.ListedOffsets
	err := untilKafkaAnswers(ctx, func() error {
		var err error
		ends, err = adm.ListEndOffsets(ctx, cp.Topic)
		if err == nil {
			err = ends.Error()
		}
		return err
	}, "kafka: checkpoint end offsets")
	if err != nil {
		return "", err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return "", nil
	}
	opts := append([]kgo.Opt{
		kgo.ConsumeTopics(cp.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, s.conn...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return "", err
	}
	defer cl.Close()
	// read_committed skips aborted records and stops at the last stable
	// offset. A committed transaction ends with its checkpoint record just
	// before the commit marker (end-2); if the newest transaction was
	// aborted, that offset never shows, and a quiet second ends the read.
	last, seen, start := "", false, time.Now()
	for len(want) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("kafka: read checkpoint: %w", err)
		}
		n := 0
		fetches.EachRecord(func(r *kgo.Record) {
			n++
			if string(r.Key) == cp.Key {
				last = string(r.Value)
			}
			if end, ok := want[r.Partition]; ok && r.Offset >= end-2 {
				delete(want, r.Partition)
			}
		})
		if n == 0 && (seen || time.Since(start) > 10*time.Second) {
			break
		}
		seen = seen || n > 0
	}
	return last, nil
}

func wrapFenced(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) {
		return fmt.Errorf("%w: %v", ErrFenced, err)
	}
	return err
}

func ptr(s string) *string { return &s }
