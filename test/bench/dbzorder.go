package bench

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// Per-aggregate order in the dbzserver case: what each relay wrote to the
// stream or queue, read back by a consumer after its drain, against the
// order PostgreSQL committed the backlog in. The backlog is written from
// several connections at once, so an aggregate's events are not committed
// in their sequence order: the reference is the WAL itself, read through a
// test_decoding slot created with the relays' slots before the backlog.

// OrderRun is what a consumer read back after one relay's run.
type OrderRun struct {
	Read       int64 // messages read
	Lost       int64 // committed events never read
	Dups       int64 // messages whose event was read before
	Violations int64 // messages read before an event of the same aggregate committed earlier
}

func (o OrderRun) add(p OrderRun) OrderRun {
	return OrderRun{o.Read + p.Read, o.Lost + p.Lost, o.Dups + p.Dups, o.Violations + p.Violations}
}

// orderRef is an event's place in the commit order: its aggregate and its
// index among all the backlog's inserts.
type orderRef struct {
	agg string
	idx int
}

// seqRE finds the backlog's sequence number in a payload: verbatim JSON
// (outboxd, test_decoding) or a JSON string holding it (Debezium Server's
// JSON converter writes the jsonb column as a string: \"seq\": 1).
var seqRE = regexp.MustCompile(`"seq\\?"\s*:\s*(\d+)`)

var aggRE = regexp.MustCompile(`aggregateid\[[^\]]*\]:'([^']*)'`)

// seqOf is the sequence number in a message body or a test_decoding line.
func seqOf(b []byte) (int64, bool) {
	m := seqRE.FindSubmatch(b)
	if m == nil {
		return 0, false
	}
	n, err := strconv.ParseInt(string(m[1]), 10, 64)
	return n, err == nil
}

// parseCommitOrder maps each event's sequence number to its aggregate and
// commit index, from test_decoding's INSERT lines in WAL order.
func parseCommitOrder(lines []string) (map[int64]orderRef, error) {
	ref := make(map[int64]orderRef, len(lines))
	for i, l := range lines {
		seq, ok := seqOf([]byte(l))
		agg := aggRE.FindStringSubmatch(l)
		if !ok || agg == nil {
			return nil, fmt.Errorf("test_decoding line %d has no seq or aggregateid: %.200s", i, l)
		}
		ref[seq] = orderRef{agg: agg[1], idx: i}
	}
	return ref, nil
}

// checkOrder compares the sequence numbers a consumer read, in its order,
// with the commit order: an event read after a later-committed event of
// its aggregate is a violation; a repeat is a duplicate (not also judged
// for order: a redelivery after a restart comes late by design).
func checkOrder(ref map[int64]orderRef, read []int64) (OrderRun, error) {
	r := OrderRun{Read: int64(len(read))}
	seen := make(map[int64]bool, len(read))
	last := map[string]int{} // aggregate → highest commit index read
	for _, seq := range read {
		o, ok := ref[seq]
		if !ok {
			return r, fmt.Errorf("read event seq %d, which the backlog does not hold", seq)
		}
		if seen[seq] {
			r.Dups++
			continue
		}
		seen[seq] = true
		if l, ok := last[o.agg]; ok && o.idx < l {
			r.Violations++
		} else {
			last[o.agg] = o.idx
		}
	}
	r.Lost = int64(len(ref) - len(seen))
	return r, nil
}

// createDecodingSlot creates a test_decoding slot at the current WAL
// position (dropped with w).
func (w *world) createDecodingSlot(ctx context.Context, slot string) error {
	if _, err := w.conn.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, slot); err != nil {
		return fmt.Errorf("creating slot %s: %w", slot, err)
	}
	w.slots = append(w.slots, slot)
	return nil
}

// commitOrder reads the backlog's inserts from the test_decoding slot, in
// commit order.
func (w *world) commitOrder(ctx context.Context, slot string) (map[int64]orderRef, error) {
	rows, err := w.conn.Query(ctx, `SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL) WHERE data LIKE 'table public.outbox: INSERT:%'`, slot)
	if err != nil {
		return nil, fmt.Errorf("reading the commit order from slot %s: %w", slot, err)
	}
	var lines []string
	for rows.Next() {
		var l string
		if err := rows.Scan(&l); err != nil {
			rows.Close()
			return nil, err
		}
		lines = append(lines, l)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return parseCommitOrder(lines)
}

// readBack consumes w's stream or queue from its start until want
// messages arrived, then for quiet more (duplicates beyond want), and
// returns their sequence numbers in the consumer's order. On RabbitMQ it
// empties the queue.
func (e *Env) readBack(ctx context.Context, w *world, want int64, quiet time.Duration) ([]int64, error) {
	var mu sync.Mutex
	var seqs []int64
	var bad []byte
	lastAt := time.Now()
	stop, err := e.mq.consume(ctx, w, func(_, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		if s, ok := seqOf(body); ok {
			seqs = append(seqs, s)
		} else if bad == nil {
			bad = append([]byte{}, body...)
		}
		lastAt = time.Now()
	})
	if err != nil {
		return nil, fmt.Errorf("%s consumer: %w", e.mq.brokerIs(), err)
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		mu.Lock()
		n, idle, b := int64(len(seqs)), time.Since(lastAt), bad
		mu.Unlock()
		if b != nil {
			stop()
			return nil, fmt.Errorf("a message without the backlog's seq: %.200q", b)
		}
		if n >= want && idle >= quiet {
			break
		}
		select {
		case <-ctx.Done():
			stop()
			return nil, fmt.Errorf("reading back %d messages: %d read: %w", want, n, ctx.Err())
		case <-tick.C:
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	return append([]int64(nil), seqs...), nil
}

// orderOf reads back what a relay wrote to w (want events) and checks it
// against ref.
func (e *Env) orderOf(ctx context.Context, w *world, ref map[int64]orderRef, want int64) (OrderRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	seqs, err := e.readBack(ctx, w, want, 500*time.Millisecond)
	if err != nil {
		return OrderRun{}, err
	}
	return checkOrder(ref, seqs)
}

// orderCell is an OrderRun in a report cell.
func orderCell(o OrderRun) string {
	return fmt.Sprintf("%d violations, %d lost, %d duplicates in %s read", o.Violations, o.Lost, o.Dups, commas(o.Read))
}
