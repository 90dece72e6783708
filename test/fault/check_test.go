package fault

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// resolveCommits decides which transactions committed (committed_txns) and
// finds each one's commit record in the WAL (pg_walinspect, from startLSN,
// pinned by a physical slot). It returns the committed transactions in
// commit order and the problems found (writer outcome contradicting the
// table, a committed transaction without a commit record).
func resolveCommits(ctx context.Context, conn *pgx.Conn, startLSN uint64, txns []*txn) (committed []*txn, problems []string, err error) {
	xids := map[int64]uint32{}
	rows, err := conn.Query(ctx, `SELECT id, xid FROM committed_txns`)
	if err != nil {
		return nil, nil, fmt.Errorf("reading committed_txns: %w", err)
	}
	for rows.Next() {
		var id, xid int64
		if err := rows.Scan(&id, &xid); err != nil {
			return nil, nil, err
		}
		xids[id] = uint32(xid) // xid8 → xid: drop the epoch
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading committed_txns: %w", err)
	}

	type commitRec struct{ start, end uint64 }
	commits := map[uint32]commitRec{}
	rows, err = conn.Query(ctx, `SELECT start_lsn::text, end_lsn::text, xid::text
		FROM pg_get_wal_records_info_till_end_of_wal($1::pg_lsn)
		WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT'`, harness.FormatLSN(startLSN))
	if err != nil {
		return nil, nil, fmt.Errorf("reading commit records: %w", err)
	}
	for rows.Next() {
		var s, e, x string
		if err := rows.Scan(&s, &e, &x); err != nil {
			return nil, nil, err
		}
		start, err1 := harness.ParseLSN(s)
		end, err2 := harness.ParseLSN(e)
		xid, err3 := strconv.ParseUint(x, 10, 32)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, nil, fmt.Errorf("bad commit record %s %s %s", s, e, x)
		}
		commits[uint32(xid)] = commitRec{start, end}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading commit records: %w", err)
	}

	for _, t := range txns {
		xid, ok := xids[t.id]
		t.committed = ok
		switch {
		case ok && (t.outcome == outRolledBack || t.outcome == outFailed):
			problems = append(problems, fmt.Sprintf("txn %d (%s) is in committed_txns although the writer saw %s (%s)", t.id, t.kind, t.outcome, t.err))
		case !ok && t.outcome == outCommitted:
			problems = append(problems, fmt.Sprintf("txn %d (%s): COMMIT returned OK but it is not in committed_txns", t.id, t.kind))
		}
		if !ok {
			continue
		}
		c, found := commits[xid]
		if !found {
			problems = append(problems, fmt.Sprintf("txn %d (xid %d) has no commit record in the WAL", t.id, xid))
			continue
		}
		t.xid, t.commitStart, t.commitEnd = xid, c.start, c.end
		committed = append(committed, t)
	}
	sort.Slice(committed, func(i, j int) bool { return committed[i].commitStart < committed[j].commitStart })
	return committed, problems, nil
}

// maxCommitEnd is the end of the last commit record among committed txns.
func maxCommitEnd(committed []*txn) uint64 {
	var m uint64
	for _, t := range committed {
		m = max(m, t.commitEnd)
	}
	return m
}

// readTopics reads every partition of topics from the start up to ends
// (taken once outboxd stopped, so nothing is written any more).
func readTopics(ctx context.Context, opts []kgo.Opt, topics []string, partitions int, mode deliveryMode) ([]*kgo.Record, map[string]int64, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	adm := kadm.NewClient(cl)
	var listed kadm.ListedOffsets
	if mode.readCommitted() {
		listed, err = adm.ListCommittedOffsets(ctx, topics...)
	} else {
		listed, err = adm.ListEndOffsets(ctx, topics...)
	}
	cl.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("listing end offsets: %w", err)
	}
	ends := map[string]int64{}
	assign := map[string]map[int32]kgo.Offset{}
	for _, topic := range topics {
		assign[topic] = map[int32]kgo.Offset{}
		for p := range partitions {
			o, ok := listed.Lookup(topic, int32(p))
			if !ok || o.Err != nil {
				return nil, nil, fmt.Errorf("end offset of %s[%d]: %v", topic, p, o.Err)
			}
			ends[tpKey(topic, int32(p))] = o.Offset
			assign[topic][int32(p)] = kgo.NewOffset().AtStart()
		}
	}
	cl, err = kgo.NewClient(append(opts, kgo.ConsumePartitions(assign), kgo.FetchIsolationLevel(mode.isolation))...)
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	// next offset to read per partition: done when it reaches the end. Under
	// read_committed the last records before the end may be control records
	// that are never returned: stop after a quiet second there.
	next := map[string]int64{}
	done := func() bool {
		for k, end := range ends {
			if next[k] < end {
				return false
			}
		}
		return true
	}
	var recs []*kgo.Record
	lastNew := time.Now()
	for !done() {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fetches := cl.PollFetches(pctx)
		cancel()
		var ferr error
		fetches.EachError(func(t string, p int32, err error) {
			if ctx.Err() == nil && pctx.Err() == nil {
				ferr = fmt.Errorf("fetching %s[%d]: %w", t, p, err)
			}
		})
		n := 0
		fetches.EachRecord(func(r *kgo.Record) {
			recs = append(recs, r)
			next[tpKey(r.Topic, r.Partition)] = r.Offset + 1
			n++
		})
		if n > 0 {
			lastNew = time.Now()
		}
		if ctx.Err() != nil {
			return recs, ends, fmt.Errorf("reading topics: %w (got %d records; last fetch error: %v)", ctx.Err(), len(recs), ferr)
		}
		if mode.transactional && time.Since(lastNew) > 2*time.Second {
			break
		}
	}
	return recs, ends, nil
}

func tpKey(topic string, p int32) string { return topic + "[" + strconv.Itoa(int(p)) + "]" }

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// dupRec locates a duplicate delivery (not the first occurrence of its id).
type dupRec struct {
	pi     int // partition index
	offset int64
}

// report is the checker's verdict.
type report struct {
	txnsPlanned, txnsCommitted, txnsRolledBack, txnsUnknown, txnsUnknownCommitted, txnsFailed int
	insertDeleteCommitted                                                                     int
	eventsCommitted, eventsNotCommitted                                                       int
	records, distinct, duplicates                                                             int
	dupsByProducer                                                                            map[int64]int
	dupRecs                                                                                   []dupRec
	lost                                                                                      []string
	problems                                                                                  []string // everything else that is wrong
	pairs, violations                                                                         int
	firstViolation                                                                            string
}

func (r *report) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// check runs every assertion over what the writers did, what committed and
// what Kafka holds, plus the monitor's (C, E) pairs.
func check(txns, committed []*txn, events map[string]*event, recs []*kgo.Record, topics []string, partitions int, pairs []pair) *report {
	rep := &report{txnsPlanned: len(txns), dupsByProducer: map[int64]int{}}
	for _, t := range txns {
		switch {
		case t.committed:
			rep.txnsCommitted++
			rep.eventsCommitted += len(t.events)
			if t.kind == kindInsertDelete {
				rep.insertDeleteCommitted++
			}
			if t.outcome == outUnknown {
				rep.txnsUnknownCommitted++
			}
		default:
			rep.eventsNotCommitted += len(t.events)
			if t.outcome == outRolledBack {
				rep.txnsRolledBack++
			} else {
				rep.txnsFailed++
			}
		}
		if t.outcome == outUnknown {
			rep.txnsUnknown++
		}
	}

	topicIdx := map[string]int{}
	for i, t := range topics {
		topicIdx[t] = i
	}
	// Per event: occurrences and smallest offset; per (topic, key): first
	// occurrences in partition-offset order.
	sorted := append([]*kgo.Record(nil), recs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i], sorted[j]
		if a.Topic != b.Topic {
			return a.Topic < b.Topic
		}
		if a.Partition != b.Partition {
			return a.Partition < b.Partition
		}
		return a.Offset < b.Offset
	})
	occ := map[string]*occurrence{}
	gotOrder := map[string][]string{} // topic/key → ids, first occurrences
	keyPartition := map[string]int32{}
	rep.records = len(sorted)
	for _, r := range sorted {
		id, ok := header(r, "id")
		if !ok {
			rep.problem("record without id header at %s@%d", tpKey(r.Topic, r.Partition), r.Offset)
			continue
		}
		if s := occ[id]; s != nil {
			s.count++
			rep.duplicates++
			rep.dupsByProducer[r.ProducerID]++
			rep.dupRecs = append(rep.dupRecs, dupRec{topicIdx[r.Topic]*partitions + int(r.Partition), r.Offset})
			continue
		}
		e := events[id]
		if e == nil {
			rep.problem("record with unknown id %s at %s@%d", id, tpKey(r.Topic, r.Partition), r.Offset)
			continue
		}
		occ[id] = &occurrence{count: 1, partition: topicIdx[r.Topic]*partitions + int(r.Partition), offset: r.Offset}
		if !e.txn.committed {
			rep.problem("event %s of txn %d (%s, writer saw %s) is in Kafka but the transaction did not commit", id, e.txn.id, e.txn.kind, e.txn.outcome)
		}
		if want := "outbox.event." + e.aggType; r.Topic != want {
			rep.problem("event %s in topic %s, want %s", id, r.Topic, want)
		}
		if string(r.Key) != e.aggID {
			rep.problem("event %s has key %q, want %q", id, r.Key, e.aggID)
		}
		if typ, _ := header(r, "type"); typ != e.typ {
			rep.problem("event %s has type header %q, want %q", id, typ, e.typ)
		}
		var v struct {
			EID string `json:"eid"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil || v.EID != id {
			rep.problem("event %s: value is not its payload: %.200q", id, r.Value)
		}
		k := r.Topic + "/" + string(r.Key)
		if p, ok := keyPartition[k]; ok && p != r.Partition {
			rep.problem("aggregate %s is in partitions %d and %d", k, p, r.Partition)
		}
		keyPartition[k] = r.Partition
		gotOrder[k] = append(gotOrder[k], id)
	}
	rep.distinct = len(occ)

	// Lost events and the expected order, from commit order.
	wantOrder := map[string][]string{}
	for _, t := range committed {
		for _, e := range t.events {
			if occ[e.id] == nil {
				rep.lost = append(rep.lost, fmt.Sprintf("%s (txn %d, %s, commit %s)", e.id, t.id, t.kind, harness.FormatLSN(t.commitStart)))
			}
			k := "outbox.event." + e.aggType + "/" + e.aggID
			wantOrder[k] = append(wantOrder[k], e.id)
		}
	}
	var keys []string
	for k := range wantOrder {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		want, got := wantOrder[k], gotOrder[k]
		// Compare over events present (lost ones are reported separately).
		var present []string
		for _, id := range want {
			if occ[id] != nil {
				present = append(present, id)
			}
		}
		if i := firstDiff(present, got); i >= 0 {
			rep.problem("aggregate %s: first occurrences out of commit order at position %d: got %s, want %s",
				k, i, at(got, i), at(present, i))
		}
	}

	// Monitor invariant: for each (C, E), every event of a transaction whose
	// commit starts before C has its first offset below E.
	rep.pairs = len(pairs)
	np := len(topics) * partitions
	prefix := make([][]int64, len(committed)) // max first offset per partition over committed[0..i]
	cur := make([]int64, np)
	for i := range cur {
		cur[i] = -1
	}
	for i, t := range committed {
		for _, e := range t.events {
			s := occ[e.id]
			if s == nil {
				// Lost: it would sit at "infinity" in its key's partition.
				pi := topicIdx["outbox.event."+e.aggType]*partitions + partitionOf(keyPartition, e, partitions)
				cur[pi] = math.MaxInt64
				continue
			}
			cur[s.partition] = max(cur[s.partition], s.offset)
		}
		prefix[i] = append([]int64(nil), cur...)
	}
	for _, p := range pairs {
		n := sort.Search(len(committed), func(i int) bool { return committed[i].commitStart >= p.c })
		if n == 0 {
			continue
		}
		for pi := range np {
			if prefix[n-1][pi] < p.ends[pi] {
				continue
			}
			rep.violations++
			if rep.firstViolation == "" {
				rep.firstViolation = describeViolation(p, pi, committed[:n], occ, topics, partitions)
			}
			break
		}
	}
	return rep
}

// partitionOf guesses a lost event's partition from other events of its
// key; unknown keys count as partition 0 (the violation is real either way:
// the event is in no partition at all).
func partitionOf(keyPartition map[string]int32, e *event, partitions int) int {
	if p, ok := keyPartition["outbox.event."+e.aggType+"/"+e.aggID]; ok && int(p) < partitions {
		return int(p)
	}
	return 0
}

// occurrence is what Kafka holds of one event id.
type occurrence struct {
	count     int
	partition int // partition index (topic-major)
	offset    int64
}

// describeViolation names the first event behind a violating pair.
func describeViolation(p pair, pi int, txns []*txn, occ map[string]*occurrence, topics []string, partitions int) string {
	topic := topics[pi/partitions]
	for _, t := range txns {
		for _, e := range t.events {
			if "outbox.event."+e.aggType != topic {
				continue
			}
			o := occ[e.id]
			if o == nil {
				return fmt.Sprintf("at %s confirmed_flush_lsn %s passed txn %d (commit record %s..%s), but its event %s is not in Kafka at all",
					p.at.Format("15:04:05.000"), harness.FormatLSN(p.c), t.id, harness.FormatLSN(t.commitStart), harness.FormatLSN(t.commitEnd), e.id)
			}
			if o.partition == pi && o.offset >= p.ends[pi] {
				return fmt.Sprintf("at %s confirmed_flush_lsn %s passed txn %d (commit record %s..%s), but its event %s (first at %s@%d) was not in Kafka yet (end offset %d read after the confirmation)",
					p.at.Format("15:04:05.000"), harness.FormatLSN(p.c), t.id, harness.FormatLSN(t.commitStart), harness.FormatLSN(t.commitEnd),
					e.id, tpKey(topic, int32(pi%partitions)), o.offset, p.ends[pi])
			}
		}
	}
	return fmt.Sprintf("at %s confirmed_flush_lsn %s: partition index %d (unexplained)", p.at.Format("15:04:05.000"), harness.FormatLSN(p.c), pi)
}

func firstDiff(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(end)"
}

func (r *report) failures(mode deliveryMode) []string {
	var out []string
	if len(r.lost) > 0 {
		out = append(out, fmt.Sprintf("%d committed events lost, e.g. %s", len(r.lost), strings.Join(r.lost[:min(5, len(r.lost))], "; ")))
	}
	if r.violations > 0 {
		out = append(out, fmt.Sprintf("invariant violated in %d of %d monitor pairs; first: %s", r.violations, r.pairs, r.firstViolation))
	}
	if mode.maxDuplicates >= 0 && r.duplicates > mode.maxDuplicates {
		out = append(out, fmt.Sprintf("%d duplicates, mode %s allows %d", r.duplicates, mode.name, mode.maxDuplicates))
	}
	for i, p := range r.problems {
		if i == 20 {
			out = append(out, fmt.Sprintf("… and %d more problems", len(r.problems)-20))
			break
		}
		out = append(out, p)
	}
	return out
}

// stuckTransactions explains a read_committed read that stopped short: for
// each partition whose last stable offset lags its high watermark, the
// producers the leader lists with a transaction open there (producer id,
// epoch, first offset) and what the coordinators say of those producers'
// transactional ids. A transaction that a partition holds open and no
// coordinator knows (a hanging transaction) pins the partition's stable
// offset forever: every later record is invisible to read_committed readers.
func stuckTransactions(ctx context.Context, opts []kgo.Opt, topics []string) []string {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return []string{"stuck transactions: " + err.Error()}
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	lso, err := adm.ListCommittedOffsets(ctx, topics...)
	if err != nil {
		return []string{"stuck transactions: list stable offsets: " + err.Error()}
	}
	hwm, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return []string{"stuck transactions: list end offsets: " + err.Error()}
	}
	var out []string
	stuck := kadm.TopicsSet{}
	lso.Each(func(o kadm.ListedOffset) {
		if h, ok := hwm.Lookup(o.Topic, o.Partition); ok && o.Err == nil && h.Offset > o.Offset {
			stuck.Add(o.Topic, o.Partition)
			out = append(out, fmt.Sprintf("%s: stable offset %d, high watermark %d", tpKey(o.Topic, o.Partition), o.Offset, h.Offset))
		}
	})
	if len(stuck) == 0 {
		return nil
	}
	var pids []int64
	if d, err := adm.DescribeProducers(ctx, stuck); err != nil {
		out = append(out, "describe producers: "+err.Error())
	} else {
		d.EachProducer(func(p kadm.DescribedProducer) {
			if p.CurrentTxnStartOffset >= 0 {
				out = append(out, fmt.Sprintf("%s: producer %d epoch %d has a transaction open from offset %d (coordinator epoch %d, last sequence %d)",
					tpKey(p.Topic, p.Partition), p.ProducerID, p.ProducerEpoch, p.CurrentTxnStartOffset, p.CoordinatorEpoch, p.LastSequence))
				pids = append(pids, p.ProducerID)
			}
		})
	}
	if l, err := adm.ListTransactions(ctx, pids, nil); err != nil {
		out = append(out, "list transactions: "+err.Error())
	} else {
		l.Each(func(t kadm.ListedTransaction) {
			out = append(out, fmt.Sprintf("coordinator %d: transactional id %s, producer %d, state %s", t.Coordinator, t.TxnID, t.ProducerID, t.State))
		})
	}
	return out
}
