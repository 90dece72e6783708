package parity

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// TestCutover: Debezium streams on slot "debezium" while events are
// written; it is stopped (gracefully, or killed); outboxd takes the same
// slot and publication while the writes go on, into the same Kafka. Nothing
// is lost; what is sent twice is what Debezium published past the slot's
// confirmed_flush_lsn at the handover. Debezium confirms the slot only when
// Connect commits its offsets: every offset.flush.interval.ms (60 s by
// default) and on a graceful stop.
func TestCutover(t *testing.T) {
	for _, mode := range []string{"stop", "kill"} {
		t.Run(mode, func(t *testing.T) { cutover(t, mode == "kill") })
	}
}

func cutover(t *testing.T, kill bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	bin, err := harness.BuildBinary(ctx, "./cmd/outboxd")
	if err != nil {
		t.Fatal(err)
	}
	pg := harness.PostgresForTest(t)
	kafka := harness.ApacheKafkaForTest(t, 1)
	dsn, err := pg.NewDatabase(ctx, "cutover")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "cutover")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{corpusTables[0].ddl, `CREATE PUBLICATION dbz FOR TABLE public.outbox`} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// Debezium creates the slot itself, as in production.
	d := harness.DebeziumForTest(t, harness.DebeziumOptions{DSN: dsn, Brokers: kafka.Brokers(), Slot: "debezium", Publication: "dbz",
		Connector: map[string]string{"transforms.outbox.table.fields.additional.placement": "type:header:type",
			"message.prefix.exclude.list": `outboxd\.heartbeat`}})

	w := startWriter(t, ctx, dsn)
	// Debezium publishes a while, then stops gracefully.
	if err := topicHas(ctx, kafka, "outbox.event.Order", 300, d.Alive); err != nil {
		t.Fatal(err)
	}
	stop := d.Stop
	if kill {
		stop = d.Kill
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := waitSlot(ctx, dsn, "debezium", "debezium to let go", func(s harness.SlotState) bool { return !s.Active }); err != nil {
		t.Fatal(err)
	}
	handover, err := harness.SlotInfo(ctx, conn, "debezium")
	if err != nil {
		t.Fatal(err)
	}
	fromDbz, err := readCluster(ctx, kafka)
	if err != nil {
		t.Fatal(err)
	}

	e := &env{dsn: dsn, bin: bin}
	cfg := []byte("router:\n  table.fields.additional.placement: type:header:type\n")
	od := startOutboxd(t, ctx, e, kafka.Brokers(), "debezium", "dbz", append(cfg, "lsn-headers: true\n"...))
	if err := waitSlot(ctx, dsn, "debezium", "outboxd to take the slot", func(s harness.SlotState) bool { return s.Active }); err != nil {
		t.Fatal(err)
	}
	// outboxd streams a while, then the writes stop.
	if err := topicHas(ctx, kafka, "outbox.event.Order", int64(len(fromDbz))+300, func() error {
		if od.Exited() {
			return fmt.Errorf("outboxd exited")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	committed := w.stop()
	if w.err != nil {
		t.Fatalf("writer: %v", w.err)
	}
	end, err := harness.CurrentWALLSN(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if err := waitSlot(ctx, dsn, "debezium", "outboxd to confirm every write", func(s harness.SlotState) bool {
		return s.ConfirmedFlushLSN >= end
	}); err != nil {
		t.Fatal(err)
	}
	all, err := readCluster(ctx, kafka)
	if err != nil {
		t.Fatal(err)
	}

	byDbz := map[string]bool{}
	for _, r := range fromDbz {
		id, _ := header(r, "id")
		byDbz[id] = true
	}
	byOd := map[string]*kgo.Record{}
	for _, r := range all {
		// outboxd's records carry its LSN headers (lsn-headers: true).
		if _, ok := header(r, "outboxd.commit_lsn"); !ok {
			continue
		}
		id, _ := header(r, "id")
		if _, dup := byOd[id]; dup {
			t.Errorf("outboxd published %s twice", id)
		}
		byOd[id] = r
	}
	if len(all) != len(fromDbz)+len(byOd) {
		t.Fatalf("kafka holds %d records: %d from Debezium before the handover, %d from outboxd", len(all), len(fromDbz), len(byOd))
	}
	lost := 0
	for _, id := range committed {
		if !byDbz[id] && byOd[id] == nil {
			lost++
		}
	}
	dups, dupsBelow := 0, 0
	var dupLSNs []string
	for id, r := range byOd {
		if byDbz[id] {
			dups++
			lsn, _ := header(r, "outboxd.commit_lsn")
			if l, err := harness.ParseLSN(lsn); err != nil || l < handover.ConfirmedFlushLSN {
				dupsBelow++
			}
			if len(dupLSNs) < 3 {
				dupLSNs = append(dupLSNs, lsn)
			}
		}
	}
	t.Logf("cutover (kill=%v): %d events committed; Debezium published %d, outboxd %d; the slot was confirmed to %s at the handover; %d events sent twice (commit LSNs %v…)",
		kill, len(committed), len(byDbz), len(byOd), harness.FormatLSN(handover.ConfirmedFlushLSN), dups, dupLSNs)
	if lost != 0 {
		t.Fatalf("%d of %d committed events are in Kafka neither from Debezium nor from outboxd", lost, len(committed))
	}
	if dupsBelow != 0 {
		t.Errorf("%d duplicates committed before the slot's confirmed_flush_lsn at the handover", dupsBelow)
	}
	// Nothing but the corpus, each event once per system.
	if n := len(byDbz) + len(byOd) - dups; n != len(committed) {
		t.Errorf("%d distinct events in Kafka, %d committed", n, len(committed))
	}
	switch {
	case kill && dups != len(byDbz):
		// No offset commit within 60 s of the start: nothing confirmed.
		t.Errorf("killed within its first offset flush interval, Debezium left %d of its %d events unconfirmed, want all", dups, len(byDbz))
	case !kill && dups > 1:
		// The graceful stop commits the offsets; Debezium confirms an LSN
		// inside its last transaction, which PostgreSQL sends again.
		t.Errorf("after a graceful stop %d events were sent twice, want at most 1 (the last transaction)", dups)
	}
}

// writer commits one event per transaction, as fast as it can be without
// hogging the shared CPU (a few hundred per second).
type writer struct {
	mu   sync.Mutex
	ids  []string
	quit chan struct{}
	once sync.Once
	done chan struct{}
	err  error
}

func startWriter(t *testing.T, ctx context.Context, dsn string) *writer {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	w := &writer{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer conn.Close(context.WithoutCancel(ctx))
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-w.quit:
				return
			case <-ctx.Done():
				w.err = ctx.Err()
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("00000000-0000-4000-9000-%012d", n)
			_, err := conn.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'Order', $2, 'OrderCreated', $3)`,
				id, fmt.Sprintf("order-%d", n%20), fmt.Sprintf(`{"n": %d}`, n))
			if err != nil {
				w.err = err
				return
			}
			w.mu.Lock()
			w.ids = append(w.ids, id)
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the writes and returns the ids committed (all of them: an
// insert in progress completes first).
func (w *writer) stop() []string {
	w.once.Do(func() { close(w.quit) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.ids...)
}
