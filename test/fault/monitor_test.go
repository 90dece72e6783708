package fault

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// The invariant monitor checks the one promise that makes at-least-once
// delivery safe: the slot's confirmed_flush_lsn never passes an event Kafka
// does not hold. PostgreSQL skips, on the next START_REPLICATION, every
// transaction whose commit record starts before confirmed_flush_lsn
// (SnapBuildXactNeedsSkip: commit start < start_decoding_at), so the
// invariant is:
//
//	for every poll with confirmed_flush_lsn = C, every event of every
//	committed transaction T with commitStart(T) < C was in Kafka.
//
// Why this way round, and why it is sound:
//
//   - Two pollers share a logical clock (an atomic counter). The LSN poller
//     reads C (every ~20 ms, own connection, reconnecting across restarts)
//     and takes a tick after the query returned. The Kafka poller takes a
//     tick before asking the broker for every partition's end offset E_p
//     (high watermark; last stable offset under read_committed). Each C is
//     paired with the first E snapshot whose tick is larger, so E was read
//     after C: anything Kafka held when C was observed sits below E_p.
//   - Kafka never loses an acknowledged record here (clean broker stops
//     only; kfake writes segments at once), and an event goes to one
//     partition (key hash), so after the run each event's smallest offset
//     o_e is known from the full read. "e was in Kafka at E" is o_e < E_p.
//   - Exact commit positions come from the WAL itself: every writer
//     transaction stores its xid in committed_txns, and pg_walinspect lists
//     each COMMIT record's start/end LSN and xid (a physical slot created
//     before the load pins that WAL). No upper bounds such as
//     pg_current_wal_lsn() after COMMIT are involved, so there are neither
//     false alarms nor blind spots between a commit and the next one.
//
// A violation is thus certain: an event of a transaction PostgreSQL would
// no longer send was not in Kafka even after the confirmation was seen. A
// pair proves nothing when the Kafka read comes long after C (e.g. while
// the broker is down); that only weakens the check, never breaks it.

type lsnSample struct {
	tick int64
	c    uint64
	at   time.Time
}

type endSnapshot struct {
	tick int64
	at   time.Time
	ends []int64 // per partition index (topic-major)
}

type backstep struct {
	at       time.Time
	from, to uint64
}

type monitor struct {
	pgDSN      string
	slot       string
	kafkaOpts  []kgo.Opt
	topics     []string
	partitions int
	committed  bool // read_committed: compare with the last stable offset
	// visibilityGrace: pair C only with end offsets read at least this long
	// after it. Apache Kafka answers EndTxn once the commit decision is
	// durable in the transaction log and writes the commit markers to the
	// data partitions afterwards; only then does the last stable offset
	// pass the transaction's records. The decision is final (a new
	// coordinator completes it after a crash), so confirming at EndTxn
	// loses nothing, but the LSO read right after C may not show it yet.
	// An aborted transaction never becomes visible, so a C past one is
	// still caught; the final read_committed read proves every event
	// became visible. Zero on kfake, which writes markers before it answers.
	visibilityGrace time.Duration

	clock atomic.Int64

	mu         sync.Mutex
	samples    []lsnSample
	snaps      []endSnapshot
	maxLag     uint64
	lastLag    uint64
	maxLagAt   time.Time
	lastC      uint64
	backwards  []backstep
	pgErrs     int
	kafkaErrs  int
	startedAt  time.Time
	lastSample time.Time

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (m *monitor) start(ctx context.Context) {
	ctx, m.cancel = context.WithCancel(ctx)
	m.startedAt = time.Now()
	m.wg.Add(2)
	go m.pollLSN(ctx)
	go m.pollKafka(ctx)
}

func (m *monitor) stop() {
	m.cancel()
	m.wg.Wait()
}

func (m *monitor) pollLSN(ctx context.Context) {
	defer m.wg.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if conn == nil || conn.IsClosed() {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pgx.Connect(cctx, m.pgDSN)
			cancel()
			if err != nil {
				m.countErr(&m.pgErrs)
				continue
			}
			conn = c
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var confirmed, current *string
		err := conn.QueryRow(qctx, `SELECT confirmed_flush_lsn::text, pg_current_wal_lsn()::text
			FROM pg_replication_slots WHERE slot_name = $1`, m.slot).Scan(&confirmed, &current)
		cancel()
		if err != nil || confirmed == nil || current == nil {
			if err != nil {
				m.countErr(&m.pgErrs)
				conn.Close(context.Background())
				conn = nil
			}
			continue
		}
		tk := m.clock.Add(1)
		c, err1 := harness.ParseLSN(*confirmed)
		cur, err2 := harness.ParseLSN(*current)
		if err1 != nil || err2 != nil {
			continue
		}
		now := time.Now()
		m.mu.Lock()
		m.samples = append(m.samples, lsnSample{tick: tk, c: c, at: now})
		if c < m.lastC {
			m.backwards = append(m.backwards, backstep{now, m.lastC, c})
		}
		m.lastC, m.lastSample = c, now
		m.lastLag = 0
		if cur > c {
			m.lastLag = cur - c
		}
		if m.lastLag > m.maxLag {
			m.maxLag, m.maxLagAt = m.lastLag, now
		}
		m.mu.Unlock()
	}
}

func (m *monitor) countErr(n *int) {
	m.mu.Lock()
	*n++
	m.mu.Unlock()
}

func (m *monitor) pollKafka(ctx context.Context) {
	defer m.wg.Done()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.RetryTimeout(time.Second)}, m.kafkaOpts...)...)
	if err != nil {
		m.countErr(&m.kafkaErrs)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	for ctx.Err() == nil {
		tk := m.clock.Add(1)
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		var listed kadm.ListedOffsets
		if m.committed {
			listed, err = adm.ListCommittedOffsets(qctx, m.topics...)
		} else {
			listed, err = adm.ListEndOffsets(qctx, m.topics...)
		}
		cancel()
		ends, ok := m.complete(listed, err)
		if !ok {
			m.countErr(&m.kafkaErrs)
			sleepCtx(ctx, 50*time.Millisecond)
			continue
		}
		m.mu.Lock()
		m.snaps = append(m.snaps, endSnapshot{tick: tk, at: time.Now(), ends: ends})
		m.mu.Unlock()
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// complete turns a listing into per-partition ends, or reports that some
// partition is missing or failed (then the snapshot is useless).
func (m *monitor) complete(listed kadm.ListedOffsets, err error) ([]int64, bool) {
	if err != nil {
		return nil, false
	}
	ends := make([]int64, len(m.topics)*m.partitions)
	for ti, topic := range m.topics {
		for p := range m.partitions {
			o, ok := listed.Lookup(topic, int32(p))
			if !ok || o.Err != nil {
				return nil, false
			}
			ends[ti*m.partitions+p] = o.Offset
		}
	}
	return ends, true
}

// lag is the slot lag at the last poll.
func (m *monitor) lag() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastLag
}

// latestC is the last confirmed_flush_lsn read.
func (m *monitor) latestC() (uint64, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastC, m.lastSample
}

// pair is a confirmed LSN with end offsets read after it.
type pair struct {
	c    uint64
	at   time.Time
	ends []int64
}

// pairs matches each LSN sample with the first later end snapshot. Samples
// with no later snapshot are dropped; consecutive samples with the same C
// and snapshot are collapsed.
func (m *monitor) pairs() (out []pair, samples, snaps int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j := 0
	for _, s := range m.samples {
		for j < len(m.snaps) && (m.snaps[j].tick < s.tick || m.snaps[j].at.Before(s.at.Add(m.visibilityGrace))) {
			j++
		}
		if j == len(m.snaps) {
			break
		}
		if n := len(out); n > 0 && out[n-1].c == s.c && &out[n-1].ends[0] == &m.snaps[j].ends[0] {
			continue
		}
		out = append(out, pair{c: s.c, at: s.at, ends: m.snaps[j].ends})
	}
	return out, len(m.samples), len(m.snaps)
}

func (m *monitor) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := fmt.Sprintf("%d LSN polls, %d Kafka snapshots, %d PG poll errors, %d Kafka poll errors; confirmed_flush_lsn went backwards %d times",
		len(m.samples), len(m.snaps), m.pgErrs, m.kafkaErrs, len(m.backwards))
	for i, b := range m.backwards {
		if i == 5 {
			s += " …"
			break
		}
		s += fmt.Sprintf(" [%s %s→%s]", b.at.Format("15:04:05.000"), harness.FormatLSN(b.from), harness.FormatLSN(b.to))
	}
	return s
}

// appendedBy returns when the record at offset of partition index pi was
// first seen below an end offset (an upper bound of its append time), or
// the zero time if no snapshot shows it.
func (m *monitor) appendedBy(pi int, offset int64) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := sort.Search(len(m.snaps), func(i int) bool { return m.snaps[i].ends[pi] > offset })
	if i == len(m.snaps) {
		return time.Time{}
	}
	return m.snaps[i].at
}
