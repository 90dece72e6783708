package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/router"
	"github.com/outboxd/outboxd/sink"
)

// Checkpoints makes the producer transactional (exactly-once mode): records
// are committed in Kafka transactions, and each transaction also writes the
// LSN it covers to a compacted checkpoint topic, atomically. After a crash,
// read_committed consumers see each event once: the aborted tail never
// becomes visible, and the next run resumes right after the checkpoint.
type Checkpoints struct {
	Topic string // compacted, one partition
	Key   string // the slot, qualified by the PostgreSQL system identifier
	// Check, when set, vets the checkpoint LoadCheckpoint found before it is
	// believed: a checkpoint skips events, so one the server cannot have
	// produced (beyond its WAL, say) must stop outboxd, not silence it.
	Check func(ctx context.Context, lsn string) error
	// MessagePrefix is --message-prefix: a split checkpoint (X/Y+N) counts
	// the transaction's events, and logical messages count as events only
	// under the prefix, so N means other events under another one. Each
	// checkpoint record carries it (header outboxd.message_prefix).
	MessagePrefix string
	// TransactionalID, when set, becomes the producer's transactional id
	// (TransactionalID: it names the PostgreSQL system, which is known only
	// once PostgreSQL answered).
	TransactionalID string
}

// DefaultTransactionalIDPrefix starts every transactional id outboxd uses
// (--transactional-id-prefix): the prefix a prefixed Kafka ACL names.
const DefaultTransactionalIDPrefix = "outboxd."

// TransactionalID is the producer's transactional id for a slot of one
// PostgreSQL system: prefix, system identifier, ".", slot
// (outboxd.7212345678901234567.outboxd). A second outboxd on the same slot
// of the same database fences the first, as it must; outboxd instances of
// other databases that use the same slot name (the default one, say) and
// share the Kafka cluster never fence each other. Earlier versions used
// outboxd.<slot>: docs/exactly-once.md says how to upgrade.
func TransactionalID(prefix, systemID, slot string) string {
	return prefix + systemID + "." + slot
}

// InitTransactions registers the transactional id with the coordinator now
// rather than at the first record: that aborts whatever a previous instance
// left open and fences it, before this instance streams anything.
//
// It also records where the checkpoints live, for Commit and LoadCheckpoint.
func (s *Sink) InitTransactions(ctx context.Context, cp Checkpoints) error {
	s.cp = cp
	if err := s.useTransactionalID(cp.TransactionalID); err != nil {
		return err
	}
	s.watch.bind(cp.Topic, s.TransactionalID())
	if err := s.ensureOwnTopic(ctx, cp.Topic, "checkpoint"); err != nil {
		return denied(err)
	}
	if _, _, err := s.cl().ProducerID(ctx); err != nil {
		return classify(fmt.Errorf("kafka: init transactional producer: %w", err), true)
	}
	return nil
}

// UseCheckpoints records where the checkpoints live without registering
// the transactional id (InitTransactions does both): for an instance that
// stands by, whose Reset registers it once it holds the slot.
func (s *Sink) UseCheckpoints(cp Checkpoints) error {
	s.cp = cp
	if err := s.useTransactionalID(cp.TransactionalID); err != nil {
		return err
	}
	s.watch.bind(cp.Topic, s.TransactionalID())
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
	s.spent.Store(false)
	s.probeOpen.Store(false)
	return untilKafkaAnswers(ctx, func() error {
		_, _, err := client.ProducerID(ctx)
		return classify(err, true)
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
		if k := sink.KindOf(err); ctx.Err() != nil || k == sink.Fenced || k == sink.Denied || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) ||
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

// errSpent is what a spent producer answers (spend).
var errSpent = &sink.Error{Kind: sink.Transient, Err: errors.New("kafka: the producer session failed; outboxd starts a new one once it holds the slot")}

// spend ends the client's producer session after a failure that may have
// left franz-go about to re-register the transactional id on its own: a
// commit or abort whose outcome is unknown (Kafka unreachable, an unknown
// server error), or a request refused for its producer id or epoch. franz-go
// recovers from those (KIP-360, KIP-588) with an InitProducerID carrying the
// old producer id and epoch, run by the next Begin, record or
// EndTransaction, abort included. That registration bumps the epoch and
// fences whoever streams under the transactional id, and this instance no
// longer knows whether it holds the slot: the failure may be the very
// takeover (a standby that found it silent for --replication-timeout,
// stopped or blocked on Kafka, took the slot and registered the id), and a
// coordinator that accepts the stale epoch (kfake does) then fences the
// slot's new holder. So a spent client makes no transactional request any
// more: Begin and Probe answer errSpent, Abort only fails what it buffers,
// and the coordinator aborts its open transaction when the next producer
// registers. Only Reset, which the relay runs once START_REPLICATION holds
// the slot, registers the id again (role.go).
func (s *Sink) spend() { s.spent.Store(true) }

// Begin opens a Kafka transaction.
func (s *Sink) Begin() error {
	if s.spent.Load() {
		return errSpent
	}
	s.failed.Store(0)
	s.begun.Store(time.Now().UnixNano())
	return classify(s.cl().BeginTransaction(), true)
}

// Commit waits for every record of the transaction, then writes the
// checkpoint and commits. If any record failed it aborts instead and returns
// ErrRecordsFailed. On any error the transaction is aborted; nothing of it is
// visible to read_committed consumers.
func (s *Sink) Commit(ctx context.Context, at sink.Checkpoint) error {
	// Records still waiting for their topic belong to this transaction.
	err := s.topics.waitFlushed(ctx)
	if err == nil {
		err = s.cl().Flush(ctx)
	}
	if err == nil && s.failed.Load() > 0 {
		err = &sink.Error{Kind: sink.Rejected, Err: sink.ErrRecordsFailed}
	}
	if err == nil {
		err = s.commit(ctx, at)
	}
	if err != nil {
		if !errors.Is(err, sink.ErrRecordsFailed) {
			// The commit's outcome is unknown (spend); a record's own
			// failure spends the client in classifyTxn if it must.
			s.spend()
		}
		err = s.classifyTxn(fmt.Errorf("kafka: commit transaction: %w", err))
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		s.Abort(actx)
		return err
	}
	return nil
}

func (s *Sink) commit(ctx context.Context, at sink.Checkpoint) error {
	rec := &kgo.Record{Topic: s.cp.Topic, Key: []byte(s.cp.Key), Value: []byte(at.String()),
		Headers: []kgo.RecordHeader{{Key: prefixHeader, Value: []byte(s.cp.MessagePrefix)}}}
	if at.Identified() {
		rec.Headers = append(rec.Headers,
			kgo.RecordHeader{Key: xidHeader, Value: strconv.AppendUint(nil, uint64(at.Xid), 10)},
			kgo.RecordHeader{Key: commitTimeHeader, Value: strconv.AppendInt(nil, at.CommitTime, 10)})
	}
	if err := s.produceWithin(ctx, ctx, rec, nil); err != nil {
		return err
	}
	return s.cl().EndTransaction(ctx, kgo.TryCommit)
}

// produceWithin produces rec and waits for its ack, but no longer than ctx:
// not ProduceSync, which ignores ctx for a record already sent to a stalled
// broker, while the callers' deadlines (commit, shutdown) must hold.
//
// The record is produced under rctx (ctx or one that outlives it); done,
// if not nil, is called once franz-go is done with the record.
func (s *Sink) produceWithin(ctx, rctx context.Context, rec *kgo.Record, done func()) error {
	acked := make(chan error, 1)
	s.cl().Produce(rctx, rec, func(_ *kgo.Record, err error) {
		acked <- err
		if done != nil {
			done()
		}
	})
	select {
	case err := <-acked:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Abort drops the open transaction and its buffered records. Should it not
// complete (Kafka unreachable), the caller resets the producer.
// A spent client (spend) sends nothing: the next producer's registration
// aborts its transaction.
func (s *Sink) Abort(ctx context.Context) {
	if err := s.abort(ctx); err != nil && s.txn != nil && !s.probeOpen.Load() {
		s.spend() // its outcome is unknown
	}
}

func (s *Sink) abort(ctx context.Context) error {
	s.topics.failPending(errors.New("kafka: transaction aborted"))
	if s.spent.Load() {
		return nil
	}
	err := s.cl().AbortBufferedRecords(ctx)
	if e := s.cl().EndTransaction(ctx, kgo.TryAbort); err == nil {
		err = e
	}
	return err
}

// LoadCheckpoint reads the checkpoint topic (as given to InitTransactions)
// with read_committed isolation and returns the last checkpoint committed for
// its key (zero if none).
func (s *Sink) LoadCheckpoint(ctx context.Context) (sink.Checkpoint, error) {
	rec, err := s.loadCheckpoint(ctx, s.cp)
	if err != nil || rec == nil || len(rec.Value) == 0 {
		return sink.Checkpoint{}, denied(err)
	}
	text := string(rec.Value)
	c, err := sink.ParseCheckpoint(text)
	if err == nil {
		c.Xid, c.CommitTime, err = checkpointTxn(rec)
	}
	if err != nil {
		return sink.Checkpoint{}, fmt.Errorf("kafka: checkpoint %q in %s: %w", text, s.cp.Topic, err)
	}
	if prefix, known := s.lastPrefix, s.lastPrefixKnown; c.Events > 0 && known && prefix != s.cp.MessagePrefix {
		// The count names other events now: skip none of the split
		// transaction's rather than the wrong ones (duplicates, never a
		// loss).
		if s.log != nil {
			s.log.Warn("exactly-once: the checkpoint splits a transaction, counting its events under another --message-prefix; its first events are sent again",
				"checkpoint", text, "checkpoint_message_prefix", prefix, "message_prefix", s.cp.MessagePrefix)
		}
		c.Events = 0
	}
	return c, nil
}

func (s *Sink) loadCheckpoint(ctx context.Context, cp Checkpoints) (*kgo.Record, error) {
	return s.readCheckpoint(ctx, cp, 0)
}

// maxFences bounds how often one load fences another transactional id and
// reads again (fenceOthers): each fencing ends that id's transaction, so a
// second round finds it over unless yet another instance keeps writing.
const maxFences = 2

func (s *Sink) readCheckpoint(ctx context.Context, cp Checkpoints, fences int) (*kgo.Record, error) {
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
		return nil, err
	}
	want := map[int32]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err == nil && o.Offset > 0 {
			want[o.Partition] = o.Offset
		}
	})
	if len(want) == 0 {
		return nil, nil
	}
	// Every checkpoint of this slot lies below those end offsets: its own
	// transactions are over (InitTransactions and Reset abort an open one,
	// and the coordinator writes the abort markers before it answers). The
	// topic is read uncommitted, markers included, and this slot's records
	// are believed at their producer's commit marker: a read_committed read
	// would wait for every transaction that began before this slot's newest
	// checkpoint to end, another slot's (on a topic shared by several) and a
	// hanging one (a transaction whose marker never reached the partition,
	// which Kafka can leave after a broker stops during a commit) included:
	// for as long as it stays open, or forever. Only this slot's own
	// transactional id writes its key, so a record of the key with no
	// marker after it is this slot's own hanging transaction: it is not
	// believed (at worst its events are sent again, never skipped) and it
	// is aborted, as kafka-transactions.sh abort does, so that
	// read_committed readers of the partition get past it too.
	opts := append([]kgo.Opt{
		kgo.ConsumeTopics(cp.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords(),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, s.conn...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	type open struct {
		rec    *kgo.Record
		part   int32
		offset int64
	}
	var last *kgo.Record
	pending, settled := map[int64]open{}, 0 // pending: producer id → this key's record in its open transaction
	waitLogged := false
	defer s.noteLoadWait(nil)
	for len(want) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("kafka: read checkpoint %s to offset %v: %w", cp.Topic, want, err)
		}
		if fetches.NumRecords() == 0 {
			// Compaction may have removed the tail's marker (a day after the
			// producer's last write, on a rolled segment). Once the stable
			// offset is past the end, everything left below it is decided
			// and returned at once: two empty polls then mean the end.
			if stable(ctx, adm, cp.Topic, want) {
				if settled++; settled >= 2 {
					break
				}
			} else if w, err := s.heldBy(ctx, adm, cp.Topic, want, true); err == nil && w != nil {
				// Say what it waits for, on /status and /readyz.
				if !waitLogged && s.log != nil {
					s.log.Warn("kafka: reading the checkpoint waits for a transaction on its partition", "wait", w.String())
				}
				waitLogged = true
				s.noteLoadWait(w)
			}
			continue
		}
		settled = 0
		fetches.EachRecord(func(r *kgo.Record) {
			switch {
			case r.Attrs.IsControl():
				if o, ok := pending[r.ProducerID]; ok && o.part == r.Partition {
					if isCommitMarker(r.Key) {
						last = o.rec
					}
					delete(pending, r.ProducerID)
				}
			case string(r.Key) != cp.Key:
			case r.Attrs.IsTransactional():
				pending[r.ProducerID] = open{rec: r, part: r.Partition, offset: r.Offset}
			default:
				last = r // an operator's record (a tombstone, say)
			}
			if end, ok := want[r.Partition]; ok && r.Offset >= end-1 {
				delete(want, r.Partition)
			}
		})
	}
	if fences < maxFences && (len(pending) > 0 || last != nil && last.ProducerID >= 0) {
		// The producers that wrote this key lately: of the newest record
		// believed, and of those with no marker yet.
		pids := make([]int64, 0, len(pending)+1)
		for pid := range pending {
			pids = append(pids, pid)
		}
		if last != nil && last.ProducerID >= 0 {
			pids = append(pids, last.ProducerID)
		}
		if fenced, err := s.fenceOthers(ctx, adm, pids); err != nil || fenced {
			if err != nil {
				return nil, err
			}
			return s.readCheckpoint(ctx, cp, fences+1)
		}
	}
	for pid, o := range pending {
		s.abortHanging(ctx, adm, cp.Topic, pid, o.part, o.offset)
	}
	if last == nil || len(last.Value) == 0 {
		return nil, nil
	}
	if cp.Check != nil {
		if err := cp.Check(ctx, string(last.Value)); err != nil {
			return nil, err
		}
	}
	prefix := header(last, prefixHeader)
	s.lastPrefix, s.lastPrefixKnown = string(prefix), prefix != nil
	return last, nil
}

// fenceOthers fences every other transactional id that, as its coordinator
// says (ListTransactions), holds one of the producers pids in an open
// transaction: the producers that wrote this slot's key lately (the newest
// committed record's, and those with a record and no marker after it).
// Only this database's outboxd writes the key (it names the system
// identifier), so such an id is this slot's too under another name: an
// earlier version's outboxd.<slot> during a rolling upgrade, or another
// --transactional-id-prefix, whose last commit may still be in flight.
// Taking its record for this id's own hanging transaction and aborting it
// on the checkpoint partition alone would let that commit go on to make
// its events visible with the checkpoint behind them: published twice. And
// a transaction that has not written its checkpoint record yet would add
// it after this load: the same. (A producer id stays with its
// transactional id across registrations, so the newest committed record's
// producer names the old id's current transaction too.)
// Registering the id instead (InitProducerID) bumps its epoch, so its
// holder is fenced, and its coordinator ends the transaction on every
// partition before it answers: committed if it was committing, aborted
// otherwise. The load then reads again and finds the record decided.
// Without Describe on the other id the coordinator names none, and the
// record is handled as a hanging one (abortHanging), as before.
func (s *Sink) fenceOthers(ctx context.Context, adm *kadm.Client, pids []int64) (bool, error) {
	l, err := adm.ListTransactions(ctx, pids, nil)
	if err != nil {
		return false, nil
	}
	own := s.TransactionalID()
	var ids []string
	l.Each(func(t kadm.ListedTransaction) {
		switch t.State {
		case "Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence":
			if t.TxnID != own && !slices.Contains(ids, t.TxnID) {
				ids = append(ids, t.TxnID)
			}
		}
	})
	for _, id := range ids {
		if s.log != nil {
			s.log.Warn("exactly-once: another transactional id has a transaction open with this slot's checkpoint (an earlier version's, during an upgrade?): fencing it so that the transaction ends on every partition before the checkpoint is read",
				"transactional_id", id, "own_transactional_id", own)
		}
		if err := s.fenceID(ctx, id); err != nil {
			return false, err
		}
	}
	return len(ids) > 0, nil
}

// fenceID registers the transactional id id with a producer of its own,
// as a new instance of it would, and drops that producer.
func (s *Sink) fenceID(ctx context.Context, id string) error {
	timeout := time.Minute
	if s.txn != nil && s.txn.Timeout > 0 {
		timeout = s.txn.Timeout
	}
	cl, err := kgo.NewClient(append(slices.Clone(s.conn), kgo.TransactionalID(id), kgo.TransactionTimeout(timeout))...)
	if err != nil {
		return fmt.Errorf("kafka: fence transactional id %s: %w", id, err)
	}
	defer cl.Close()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return classify(fmt.Errorf("kafka: fence transactional id %s, whose transaction holds this slot's checkpoint (fix: allow Write on it, or end its transaction with kafka-transactions.sh abort): %w", id, err), true)
	}
	return nil
}

// prefixHeader carries Checkpoints.MessagePrefix on each checkpoint record.
const prefixHeader = "outboxd.message_prefix"

// xidHeader and commitTimeHeader carry the identity of the transaction a
// checkpoint names (sink.Checkpoint: its xid, its commit time in
// microseconds since the Unix epoch, both decimal). Records of earlier
// versions have neither, and earlier versions ignore them.
const (
	xidHeader        = "outboxd.xid"
	commitTimeHeader = "outboxd.commit_time"
)

// checkpointTxn reads the transaction identity of a checkpoint record:
// zeros if it has none (sink.Checkpoint.Identified).
func checkpointTxn(r *kgo.Record) (xid uint32, commitTime int64, err error) {
	x, t := header(r, xidHeader), header(r, commitTimeHeader)
	if x == nil && t == nil {
		return 0, 0, nil
	}
	x64, err := strconv.ParseUint(string(x), 10, 32)
	if err == nil {
		commitTime, err = strconv.ParseInt(string(t), 10, 64)
	}
	if err != nil || commitTime == 0 {
		return 0, 0, fmt.Errorf("bad transaction headers %s=%q %s=%q", xidHeader, x, commitTimeHeader, t)
	}
	return uint32(x64), commitTime, nil
}

// header is the value of r's header key, nil if it has none.
func header(r *kgo.Record, key string) []byte {
	for _, h := range r.Headers {
		if h.Key == key {
			if h.Value == nil {
				return []byte{}
			}
			return h.Value
		}
	}
	return nil
}

// isCommitMarker reports whether a control record's key (version, type) is
// a commit marker; type 0 is an abort.
func isCommitMarker(key []byte) bool {
	return len(key) >= 4 && key[2] == 0 && key[3] == 1
}

// abortHanging aborts this slot's own hanging transaction on the checkpoint
// partition: a transaction of its transactional id that the coordinator no
// longer has open (InitTransactions and Reset ended every open one) but
// whose marker never reached the partition. It writes the abort marker
// through the admin API, as kafka-transactions.sh abort does; should that
// fail, it says how to do it by hand.
func (s *Sink) abortHanging(ctx context.Context, adm *kadm.Client, topic string, pid int64, part int32, offset int64) {
	manual := fmt.Sprintf("kafka-transactions.sh --bootstrap-server %s find-hanging --topic %s --partition %d; kafka-transactions.sh --bootstrap-server %s abort --topic %s --partition %d --start-offset %d",
		s.topics.bootstrap(), topic, part, s.topics.bootstrap(), topic, part, offset)
	err := abortTxn(ctx, adm, topic, part, func(p kadm.DescribedProducer) bool { return p.ProducerID == pid && p.CurrentTxnStartOffset >= 0 })
	if s.log == nil {
		return
	}
	if err != nil {
		s.log.Error("kafka: a hanging transaction of this slot's transactional id holds the checkpoint partition (its records are not believed); abort it by hand",
			"topic", topic, "partition", part, "producer_id", pid, "start_offset", offset, "err", err, "fix", manual)
		return
	}
	s.log.Warn("kafka: aborted a hanging transaction of this slot's transactional id on the checkpoint partition (its checkpoint is not believed: at worst its events are sent again)",
		"topic", topic, "partition", part, "producer_id", pid, "start_offset", offset)
}

// AbortTransaction aborts the open transaction that starts at startOffset
// of topic's partition by writing its abort marker through the admin API,
// as kafka-transactions.sh abort --start-offset does: the partition leader
// names the producer (DescribeProducers), and WriteTxnMarkers writes the
// marker with its producer id, epoch and coordinator epoch. It needs
// ClusterAction on the cluster. It ends a hanging transaction (one the
// coordinator no longer has open); one still open at its coordinator is
// aborted on the partition, and the coordinator's own markers later change
// nothing.
func AbortTransaction(ctx context.Context, adm *kadm.Client, topic string, partition int32, startOffset int64) error {
	return abortTxn(ctx, adm, topic, partition, func(p kadm.DescribedProducer) bool { return p.CurrentTxnStartOffset == startOffset })
}

func abortTxn(ctx context.Context, adm *kadm.Client, topic string, part int32, match func(kadm.DescribedProducer) bool) error {
	d, err := adm.DescribeProducers(ctx, kadm.TopicsSet{topic: {part: {}}})
	if err != nil {
		return fmt.Errorf("describe the producers of %s/%d: %w", topic, part, err)
	}
	var found *kadm.DescribedProducer
	d.EachProducer(func(p kadm.DescribedProducer) {
		if p.Partition == part && found == nil && match(p) {
			found = &p
		}
	})
	if found == nil {
		return fmt.Errorf("the leader of %s/%d lists no such open transaction", topic, part)
	}
	resp, err := adm.WriteTxnMarkers(ctx, kadm.TxnMarkers{ProducerID: found.ProducerID, ProducerEpoch: found.ProducerEpoch, CoordinatorEpoch: found.CoordinatorEpoch,
		Topics: kadm.TopicsSet{topic: {part: {}}}})
	if err != nil {
		return fmt.Errorf("write the abort marker on %s/%d: %w", topic, part, err)
	}
	resp.EachPartition(func(p kadm.TxnMarkersPartitionResponse) {
		if p.Err != nil && err == nil {
			err = fmt.Errorf("write the abort marker on %s/%d: %w", topic, part, p.Err)
		}
	})
	return err
}

// stable reports whether the last stable offset of every partition in want
// has reached the end offset recorded there: no transaction below it is open.
func stable(ctx context.Context, adm *kadm.Client, topic string, want map[int32]int64) bool {
	lso, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil || lso.Error() != nil {
		return false
	}
	for p, end := range want {
		o, ok := lso.Lookup(topic, p)
		if !ok || o.Offset < end {
			return false
		}
	}
	return true
}

func ptr(s string) *string { return &s }

// Probe produces rec and waits for Kafka's answer: whether a record the
// broker refused is accepted now. In exactly-once mode it does so inside a
// Kafka transaction that it aborts, so read_committed consumers never see
// the probe; the record is produced for real when the relay streams on.
func (s *Sink) Probe(ctx context.Context, rec *router.Record) error {
	if answered, err := s.prepareProbe(ctx, rec); answered {
		return err
	}
	if s.txn != nil {
		if s.spent.Load() {
			return errSpent
		}
		if s.probeOpen.Load() {
			if err := s.abort(ctx); err != nil {
				return classify(fmt.Errorf("kafka: abort the previous probe's transaction: %w", err), true)
			}
			s.probeOpen.Store(false)
		}
		if err := s.Begin(); err != nil {
			return err
		}
		defer func() {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := s.abort(actx); err != nil {
				// The client is still inside the transaction: every later
				// Begin would fail, and the hold would never end. The next
				// probe aborts it first. (Not a new producer: a hold has
				// no slot, and only the slot's holder may fence.)
				s.probeOpen.Store(true)
				if s.log != nil {
					s.log.Warn("kafka: the probe's transaction could not be aborted; the next probe aborts it first", "err", err)
				}
			}
		}()
	}
	done := make(chan error, 1)
	s.Produce(ctx, rec, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
