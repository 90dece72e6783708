package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxd/outboxd/test/harness"
)

// stopPostgresTimed stops the shared server with pg_ctl stop -m fast and
// returns how long the shutdown took; the test restarts it at the end.
func (f *fixture) stopPostgresTimed() time.Duration {
	f.t.Helper()
	f.conn.Close(f.ctx)
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	start := time.Now()
	if err := f.pg.Stop(ctx); err != nil {
		f.t.Fatal(err)
	}
	took := time.Since(start)
	f.t.Cleanup(func() {
		if err := f.pg.Start(context.Background()); err != nil {
			f.t.Errorf("restart postgres: %v", err)
		}
	})
	return took
}

func (f *fixture) reconnectPostgres() {
	f.t.Helper()
	if err := f.pg.Start(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	var err error
	if f.conn, err = f.pg.Connect(f.ctx, f.db); err != nil {
		f.t.Fatal(err)
	}
}

// While outboxd holds before an invalid row, a fast shutdown of PostgreSQL
// is not held up: outboxd holds without a replication connection.
func TestPostgresShutdownWhileHolding(t *testing.T) {
	if sharedPG.External() {
		t.Skip("stops the server: needs the throwaway cluster")
	}
	f := newFixture(t)
	r := f.startRelay()
	f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, '', 'bad', 'E', '{}')`, eventID(1))
	poll(t, 20*time.Second, "outboxd_blocked 1", func() bool { return r.metric(t, "outboxd_blocked") == 1 })
	if took := f.stopPostgresTimed(); took > 10*time.Second {
		t.Fatalf("pg_ctl stop -m fast took %s while outboxd held", took)
	}
	f.reconnectPostgres()
	if r.Exited() {
		t.Fatalf("outboxd exited\n%s", r.Log())
	}
	if v := r.metric(t, "outboxd_blocked"); v != 1 {
		t.Fatalf("outboxd_blocked = %v after the restart", v)
	}
}

// With Kafka down and the in-flight window full nothing is read from the
// stream, so outboxd cannot see a shutdown's requests for confirmation: it
// lets go of the replication connection after 5 s without acks, and a fast
// shutdown then completes. Nothing is lost once both are back.
func TestPostgresShutdownWithFullWindowAndKafkaDown(t *testing.T) {
	if sharedPG.External() {
		t.Skip("stops the server: needs the throwaway cluster")
	}
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("stops the broker: needs the embedded one")
	}
	f := newFixture(t, withKafka(k))
	r := f.startRelay("--max-inflight-events", "5")
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	var end uint64
	for i := 2; i <= 21; i++ {
		end = f.commit(event{i, "a", "E", `{}`})
	}
	poll(t, 20*time.Second, "the in-flight window full", func() bool { return r.metric(t, "outboxd_inflight_events") == 5 })
	if took := f.stopPostgresTimed(); took > 15*time.Second {
		t.Fatalf("pg_ctl stop -m fast took %s with the window full and Kafka down", took)
	}
	f.reconnectPostgres()
	if err := k.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 120*time.Second)
	first, _ := byID(t, f.records())
	if len(first) != 21 {
		t.Fatalf("%d distinct events delivered, want 21", len(first))
	}
}

// Exactly-once mode with the broker stopped (connections refused, not a
// proxy fault): the session ends, the reset of the transactional producer
// waits for Kafka instead of exiting, and everything arrives once.
func TestExactlyOnceSurvivesBrokerStopped(t *testing.T) {
	k := harness.KafkaForTest(t)
	if k.External() {
		t.Skip("stops the broker: needs the embedded one")
	}
	f := newFixture(t, withKafka(k))
	r := f.startRelay("--exactly-once", "--checkpoint-topic", "cp."+f.agg)
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	var end uint64
	for i := 2; i <= 50; i++ {
		end = f.commit(event{i, "a", "E", `{}`})
	}
	// A new session registers a fresh transactional producer, which fails
	// while the broker refuses connections: /status says so, and outboxd
	// waits instead of exiting.
	poll(t, 120*time.Second, "a failed transactional producer reset on /status", func() bool {
		_, body := r.get(t, "/status")
		return strings.Contains(body, "init transactional producer")
	})
	if r.Exited() {
		t.Fatalf("outboxd exited while Kafka was down\n%s", r.Log())
	}
	if err := k.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	f.waitConfirmed(end, 120*time.Second)
	first, dups := byID(t, f.readCommitted(50))
	if len(first) != 50 || dups != 0 {
		t.Fatalf("read_committed: %d distinct, %d duplicates; want 50 and 0", len(first), dups)
	}
}

// The broker refuses an event (the topic's max.message.bytes is too small).
// In fail mode outboxd holds before it, outboxd_blocked is 1 and /readyz
// names the table and event id; only that record is retried, with backoff,
// so the topic does not fill with re-sent events; raising the limit resumes
// delivery without a restart. In exactly-once mode the Kafka transaction
// holding the refused record is aborted, never committed past it.
func TestBrokerRejectionHoldsThenResumes(t *testing.T) {
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t)
			adm := f.admin()
			if _, err := adm.CreateTopic(f.ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, f.topic()); err != nil {
				t.Fatal(err)
			}
			var args []string
			if mode == "exactly-once" {
				args = []string{"--exactly-once", "--checkpoint-topic", "cp." + f.agg}
			}
			r := f.startRelay(args...)
			big := `{"pad": "` + strings.Repeat("x", 3000) + `"}`
			f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
			end := f.commit(event{2, "a", "E", `{}`}, event{3, "a", "E", big}, event{4, "a", "E", `{}`})
			poll(t, 20*time.Second, "outboxd_blocked 1", func() bool { return r.metric(t, "outboxd_blocked") == 1 })
			_, body := r.get(t, "/readyz")
			if !strings.Contains(body, "public.outbox") || !strings.Contains(body, eventID(3)) {
				t.Fatalf("/readyz does not name the table and event: %s", body)
			}
			// Held: over the next 5 s nothing more is published (before the
			// fix every event of the window was re-sent every 0.5 s). In
			// exactly-once mode the probes' aborted transactions leave
			// markers, so count what read_committed consumers see instead.
			before := f.topicCount(f.topic())
			time.Sleep(5 * time.Second) // a span of time is what is measured here
			if mode == "exactly-once" {
				ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
				recs, err := harness.ReadCommitted(ctx, f.kafka.Brokers(), []string{f.topic()})
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				// Event 2, before the held one, is committed on its own
				// (the Kafka transaction is split before the probe).
				if len(recs) != 2 {
					t.Fatalf("read_committed consumers see %d records while holding, want 2 (events 1 and 2)", len(recs))
				}
			} else if after := f.topicCount(f.topic()); after != before || before > 4 {
				t.Fatalf("topic grew %d → %d records while holding", before, after)
			}
			if s := f.slotState(); s.ConfirmedFlushLSN >= end {
				t.Fatal("slot confirmed past a rejected event")
			}
			if _, err := adm.AlterTopicConfigs(f.ctx, []kadmAlter{{Name: "max.message.bytes", Value: ptr("100000")}}, f.topic()); err != nil {
				t.Fatal(err)
			}
			f.waitConfirmed(end, 60*time.Second)
			if v := r.metric(t, "outboxd_blocked"); v != 0 {
				t.Fatalf("outboxd_blocked = %v after resuming", v)
			}
			if mode == "exactly-once" {
				recs := f.readCommitted(4)
				first, dups := byID(t, recs)
				if len(first) != 4 || dups != 0 {
					t.Fatalf("read_committed: %d distinct, %d duplicates; want 4 and 0", len(first), dups)
				}
				if got := perKey(t, recs)["a"]; strings.Join(got, ",") != strings.Join([]string{eventID(1), eventID(2), eventID(3), eventID(4)}, ",") {
					t.Fatalf("order %v", got)
				}
				return
			}
			got, _ := byID(t, f.records())
			if r := got[eventID(3)]; r == nil || string(r.Value) != big {
				t.Fatal("large event not delivered intact")
			}
			if len(got) != 4 {
				t.Fatalf("%d distinct events, want 4", len(got))
			}
		})
	}
}

// Exactly-once with --on-invalid dead-letter: the refused event goes to the
// dead-letter topic in order, and read_committed consumers see every other
// event once.
func TestExactlyOnceBrokerRejectionDeadLettered(t *testing.T) {
	f := newFixture(t)
	adm := f.admin()
	if _, err := adm.CreateTopic(f.ctx, 1, 1, map[string]*string{"max.message.bytes": ptr("1000")}, f.topic()); err != nil {
		t.Fatal(err)
	}
	r := f.startRelay("--exactly-once", "--checkpoint-topic", "cp."+f.agg, "--on-invalid", "dead-letter", "--dead-letter-topic", "dlq."+f.agg)
	big := `{"pad": "` + strings.Repeat("x", 3000) + `"}`
	end := f.commit(event{1, "a", "E", `{}`}, event{2, "a", "E", big}, event{3, "a", "E", `{}`})
	f.waitConfirmed(end, 60*time.Second)
	first, dups := byID(t, f.readCommitted(2))
	if len(first) != 2 || dups != 0 || first[eventID(1)] == nil || first[eventID(3)] == nil {
		t.Fatalf("read_committed: %d distinct, %d duplicates; want events 1 and 3 once", len(first), dups)
	}
	if v := r.metric(t, "outboxd_events_dead_lettered_total"); v != 1 {
		t.Fatalf("dead lettered %v", v)
	}
	// The dead-letter topic holds transaction markers too: read it as a
	// read_committed consumer, for the one record it must hold.
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	dl, err := harness.ReadAll(ctx, f.kafka.Brokers(), []string{"dlq." + f.agg}, 1, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	var n int
	for _, rec := range dl {
		if id, _ := header(rec, "id"); id == eventID(2) {
			n++
		}
	}
	if n != 1 {
		t.Fatal("refused event not dead-lettered")
	}
}
