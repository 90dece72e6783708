package kafka

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/outboxd/outboxd/sink"
)

// stuckAfter is how long the checkpoint partition's last stable offset must
// stay put before CheckpointWait names what holds it: every outboxd
// sharing the topic commits within a fraction of a second, so a stable
// offset that does not move for this long belongs to a transaction that is
// long, stalled or hanging.
const stuckAfter = 5 * time.Second

// lsoWatch remembers, per checkpoint partition, the last stable offset seen
// and since when: CheckpointWait runs in the monitor's goroutine, the load
// in the relay's.
type lsoWatch struct {
	mu    sync.Mutex
	seen  map[int32]lsoSeen
	load  *sink.CheckpointWait // set while LoadCheckpoint waits for the stable offset
	stuck time.Duration        // stuckAfter; tests shorten it
	// topic and own (the transactional id) are set by InitTransactions
	// and UseCheckpoints, which may run while the monitor polls.
	topic, own string
}

// bind records the checkpoint topic and the transactional id.
func (w *lsoWatch) bind(topic, own string) {
	w.mu.Lock()
	w.topic, w.own = topic, own
	w.mu.Unlock()
}

type lsoSeen struct {
	lso   int64
	since time.Time
}

// CheckpointWait says what holds the checkpoint partition's last stable
// offset below its end, once it has not moved for stuckAfter: nil while
// nothing does. While LoadCheckpoint waits for it (the one case it must,
// see loadCheckpoint), it returns what the load saw, with Waiting set.
// The checkpoint topic has one partition; on one made with more, the
// first held partition is named.
func (s *Sink) CheckpointWait(ctx context.Context) (*sink.CheckpointWait, error) {
	s.watch.mu.Lock()
	w, topic := s.watch.load, s.watch.topic
	s.watch.mu.Unlock()
	if w != nil || topic == "" {
		return w, nil
	}
	adm := kadm.NewClient(s.cl())
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: checkpoint end offsets: %w", err)
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) { want[o.Partition] = o.Offset })
	return s.heldBy(ctx, adm, topic, want, false)
}

// heldBy compares the last stable offsets of topic's partitions with their
// end offsets (want) and describes the first partition whose stable offset
// has stayed below its end for stuckAfter.
func (s *Sink) heldBy(ctx context.Context, adm *kadm.Client, topic string, want map[int32]int64, waiting bool) (*sink.CheckpointWait, error) {
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = lso.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: checkpoint last stable offsets: %w", err)
	}
	parts := make([]int32, 0, len(want))
	for p := range want {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	now := time.Now()
	var held *sink.CheckpointWait
	s.watch.mu.Lock()
	if s.watch.seen == nil {
		s.watch.seen = map[int32]lsoSeen{}
	}
	stuck := s.watch.stuck
	if stuck == 0 {
		stuck = stuckAfter
	}
	for _, p := range parts {
		o, ok := lso.Lookup(topic, p)
		if !ok || o.Offset < 0 || o.Offset >= want[p] {
			delete(s.watch.seen, p)
			continue
		}
		seen, ok := s.watch.seen[p]
		if !ok || seen.lso != o.Offset {
			seen = lsoSeen{lso: o.Offset, since: now}
			s.watch.seen[p] = seen
		}
		if held == nil && now.Sub(seen.since) >= stuck {
			held = &sink.CheckpointWait{Topic: topic, Partition: p, StableOffset: o.Offset, EndOffset: want[p], Since: seen.since, Waiting: waiting, Leader: -1}
		}
	}
	s.watch.mu.Unlock()
	if held == nil {
		return nil, nil
	}
	s.describeHolders(ctx, adm, held)
	return held, nil
}

// describeHolders fills in the open transactions on w's partition: the
// partition leader lists its producers with an open transaction
// (DescribeProducers), the coordinators their transactional ids and states
// (ListTransactions). Either may be refused (Describe on the topic, on the
// transactional ids): what is known is shown.
func (s *Sink) describeHolders(ctx context.Context, adm *kadm.Client, w *sink.CheckpointWait) {
	start := w.StableOffset
	if d, err := adm.DescribeProducers(ctx, kadm.TopicsSet{w.Topic: {w.Partition: {}}}); err == nil {
		d.EachPartition(func(p kadm.DescribedProducersPartition) {
			if p.Partition != w.Partition || p.Err != nil {
				return
			}
			w.Leader = p.Leader
			for _, pr := range p.ActiveProducers {
				if pr.CurrentTxnStartOffset >= 0 {
					w.Holders = append(w.Holders, sink.TxnHolder{ProducerID: pr.ProducerID, ProducerEpoch: pr.ProducerEpoch, StartOffset: pr.CurrentTxnStartOffset})
				}
			}
		})
	}
	slices.SortFunc(w.Holders, func(a, b sink.TxnHolder) int { return int(a.StartOffset - b.StartOffset) })
	if len(w.Holders) > 0 {
		start = w.Holders[0].StartOffset
		pids := make([]int64, len(w.Holders))
		for i, h := range w.Holders {
			pids[i] = h.ProducerID
		}
		s.watch.mu.Lock()
		own := s.watch.own
		s.watch.mu.Unlock()
		if l, err := adm.ListTransactions(ctx, pids, nil); err == nil {
			l.Each(func(t kadm.ListedTransaction) {
				for i := range w.Holders {
					if h := &w.Holders[i]; h.ProducerID == t.ProducerID {
						h.TransactionalID, h.State = t.TxnID, t.State
						h.Own = own != "" && t.TxnID == own
					}
				}
			})
		}
	}
	b := s.topics.bootstrap()
	find := fmt.Sprintf("kafka-transactions.sh --bootstrap-server %s find-hanging --topic %s --partition %d", b, w.Topic, w.Partition)
	if w.Leader >= 0 {
		find = fmt.Sprintf("kafka-transactions.sh --bootstrap-server %s find-hanging --broker-id %d", b, w.Leader)
	}
	w.Fix = fmt.Sprintf("%s; kafka-transactions.sh --bootstrap-server %s abort --topic %s --partition %d --start-offset %d", find, b, w.Topic, w.Partition, start)
}

// noteLoadWait records what holds the stable offset the load waits for
// (nil clears it): CheckpointWait returns it meanwhile.
func (s *Sink) noteLoadWait(w *sink.CheckpointWait) {
	s.watch.mu.Lock()
	s.watch.load = w
	s.watch.mu.Unlock()
}

var _ sink.CheckpointWatcher = (*Sink)(nil)
