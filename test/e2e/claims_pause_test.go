package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxd/outboxd/test/harness"
)

// docs/operations.md's memory bound: while the in-flight window is full, reading pauses
// but status updates keep flowing, so PostgreSQL does not time out the
// connection. With wal_sender_timeout 1s (set per connection in the DSN)
// and the broker frozen, the same walsender keeps the slot for 3 s with the
// window full (outboxd lets go only after 5 s without an ack); thawed, the
// events are delivered without a reconnection. A subtest of TestFrozenBroker.
func statusUpdatesDuringFullWindow(t *testing.T, k *harness.Kafka) {
	f := newFixture(t, withKafka(k))
	f.dsn += "&wal_sender_timeout=1s"
	// The setting reaches a walsender through the DSN.
	rc, err := pgconn.Connect(f.ctx, f.dsn+"&replication=database")
	if err != nil {
		t.Fatal(err)
	}
	res, err := rc.Exec(f.ctx, "SHOW wal_sender_timeout").ReadAll()
	rc.Close(context.Background())
	if err != nil || len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "1s" {
		t.Fatalf("wal_sender_timeout on a replication connection: %v %v", res, err)
	}

	r := f.startRelay("--max-inflight-events", "5", "--status-interval", "300ms", "--replication-timeout", "5s")
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	walsender := f.slotState().ActivePID
	end, resume := freezeAndCommit(t, f, k)
	poll(t, 10*time.Second, "the window full (5 in flight)", func() bool { return r.metric(t, "outboxd_inflight_events") == 5 })
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if s := f.slotState(); !s.Active || s.ActivePID != walsender {
			t.Fatalf("walsender %d gone with the window full (slot active %v, pid %d): status updates stopped", walsender, s.Active, s.ActivePID)
		}
		time.Sleep(100 * time.Millisecond)
	}
	resume()
	f.waitConfirmed(end, 60*time.Second)
	if s := f.slotState(); s.ActivePID != walsender {
		t.Fatalf("walsender changed %d → %d", walsender, s.ActivePID)
	}
	if v := r.metric(t, `outboxd_reconnects_total{target="postgres"}`); v != 0 {
		t.Fatalf("%v reconnections to PostgreSQL", v)
	}
	if first, _ := byID(t, f.records()); len(first) != 20 {
		t.Fatalf("%d distinct events, want 20", len(first))
	}
	r.stop(t, f.ctx)
}

// freezeAndCommit freezes the broker (SIGSTOP) and commits events 2..20,
// returning the WAL position after the last and the thaw, which fails the
// test if the broker does not resume; the broker is thawed at the end of the
// test in any case.
func freezeAndCommit(t *testing.T, f *fixture, k *harness.Kafka) (end uint64, resume func()) {
	t.Helper()
	if err := k.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = k.Resume()
		}
	})
	for i := 2; i <= 20; i++ {
		end = f.commit(event{i, "a", "E", `{}`})
	}
	return end, func() {
		t.Helper()
		if err := k.Resume(); err != nil {
			t.Fatal(err)
		}
		resumed = true
	}
}
