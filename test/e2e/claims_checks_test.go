package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// README's troubleshooting table: a publication that publishes no INSERTs, a
// physical slot and a slot of another database are each refused with exit 1
// and the fix.
func TestStartupRefusesPublicationAndSlotKinds(t *testing.T) {
	f := newFixture(t)
	t.Run("publication without inserts", func(t *testing.T) {
		f.exec(`CREATE PUBLICATION no_inserts FOR TABLE outbox WITH (publish = 'update, delete')`)
		f.expectExit(t, 1, []string{`publication "no_inserts" does not publish INSERTs`,
			`ALTER PUBLICATION "no_inserts" SET (publish = 'insert');`}, "--publication", "no_inserts")
	})
	t.Run("physical slot", func(t *testing.T) {
		f.exec(`SELECT pg_create_physical_replication_slot($1)`, f.slot)
		f.expectExit(t, 1, []string{fmt.Sprintf(`replication slot %q is a physical slot; outboxd needs a logical pgoutput slot`, f.slot),
			fmt.Sprintf(`SELECT pg_drop_replication_slot('%s');`, f.slot)})
		f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot)
	})
	t.Run("slot of another database", func(t *testing.T) {
		other := f.db + "_other"
		if _, err := f.pg.NewDatabase(f.ctx, other); err != nil {
			t.Fatal(err)
		}
		if err := f.pg.Exec(f.ctx, other, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.pg.Exec(context.Background(), other, `SELECT pg_drop_replication_slot($1)`, f.slot) })
		f.expectExit(t, 1, []string{fmt.Sprintf(`replication slot %q belongs to database %q, but this connection is to %q`, f.slot, other, f.db),
			fmt.Sprintf(`connect --postgres to database "%s" or pick another --slot`, other)})
		if s := f.slotState(); s.Active {
			t.Fatalf("the other database's slot is in use after the refusal: %+v", s)
		}
	})
}

// A slot invalidated by max_slot_wal_keep_size (wal_status = lost) is
// refused with exit 1: its WAL is gone, so events were lost.
func TestStartupRefusesLostSlot(t *testing.T) {
	if sharedPG.External() {
		t.Skip("invalidates a slot with max_slot_wal_keep_size: needs a throwaway server")
	}
	pg := harness.PostgresForTest(t, harness.WithConf("max_slot_wal_keep_size", "1MB"))
	f := newFixture(t, withPostgres(pg))
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	f.exec(`CREATE TABLE filler (b text)`)
	poll(t, 60*time.Second, "the slot to be invalidated", func() bool {
		f.exec(`INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 100)`)
		f.exec(`SELECT pg_switch_wal()`)
		f.exec(`CHECKPOINT`)
		var st string
		if err := f.conn.QueryRow(f.ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&st); err != nil {
			t.Fatal(err)
		}
		return st == "lost"
	})
	f.expectExit(t, 1, []string{fmt.Sprintf(`replication slot %q was invalidated (wal_status = lost)`, f.slot),
		fmt.Sprintf(`SELECT pg_drop_replication_slot('%s');`, f.slot), "raise max_slot_wal_keep_size"})
}

// deploy/README: a role with LOGIN REPLICATION and SELECT on the outbox (no
// superuser, no slot made for it) is enough for outboxd to create its slot,
// stream, and write heartbeats on its ordinary connection.
func TestReplicationRoleAloneCreatesSlotAndHeartbeats(t *testing.T) {
	f := newFixture(t)
	const role = "r_claims_repl_only"
	f.exec(`DROP ROLE IF EXISTS ` + role)
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = f.conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	// migrations/004_role.sql.tmpl, as deploy/README prints it.
	for _, s := range []string{
		`CREATE ROLE ` + role + ` WITH LOGIN REPLICATION`,
		`GRANT CONNECT ON DATABASE ` + f.db + ` TO ` + role,
		`GRANT USAGE ON SCHEMA public TO ` + role,
		`GRANT SELECT ON public.outbox TO ` + role,
	} {
		f.exec(s)
	}
	if _, err := harness.SlotInfo(f.ctx, f.conn, f.slot); err == nil {
		t.Fatalf("slot %s exists before outboxd starts", f.slot)
	}
	f.dsn = strings.Replace(f.dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	if !strings.Contains(f.dsn, role) {
		t.Fatalf("could not rewrite the user of %q", f.dsn)
	}
	r := f.startRelay("--heartbeat-interval", "200ms")
	var plugin, db, user string
	if err := f.conn.QueryRow(f.ctx, `SELECT s.plugin::text, s.database::text, a.usename::text FROM pg_replication_slots s
		JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1`, f.slot).Scan(&plugin, &db, &user); err != nil {
		t.Fatal(err)
	}
	if plugin != "pgoutput" || db != f.db || user != role {
		t.Fatalf("slot plugin %q database %q streamed by %q; want pgoutput, %q, %q", plugin, db, user, f.db, role)
	}
	// Heartbeats written by the role come back through the slot: the delay
	// gauge is set (it stays 0 until the first arrives), and none failed.
	poll(t, 20*time.Second, "a heartbeat round trip", func() bool {
		return r.metric(t, "outboxd_replication_delay_seconds") > 0
	})
	if n := r.metric(t, "outboxd_heartbeat_errors_total"); n != 0 {
		t.Fatalf("outboxd_heartbeat_errors_total %v under the REPLICATION role", n)
	}
	end := f.commit(event{1, "order-1", "OrderCreated", `{"role": "replication only"}`})
	f.waitConfirmed(end, 20*time.Second)
	if recs := f.records(); len(recs) != 1 || string(recs[0].Value) != `{"role": "replication only"}` {
		t.Fatalf("records %v", recs)
	}
	r.stop(t, f.ctx)
}

// table.op.invalid.behavior fatal: an UPDATE of the outbox holds the slot
// before its transaction and reports it on /readyz, without exiting (no
// crash loop) and without sending what follows.
func TestInvalidOpFatalHolds(t *testing.T) {
	f := newFixture(t, withPublish("insert, update"))
	cfg := filepath.Join(t.TempDir(), "outboxd.yaml")
	if err := os.WriteFile(cfg, []byte("router:\n  table.op.invalid.behavior: fatal\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := f.startRelay("--config", cfg)
	first := f.commit(event{1, "a", "E", `{"n": 1}`})
	f.waitConfirmed(first, 20*time.Second)
	f.exec(`UPDATE outbox SET type = 'changed' WHERE id = $1`, eventID(1))
	updated := f.walLSN()
	f.commit(event{3, "a", "E", `{"n": 3}`})
	poll(t, 20*time.Second, "/readyz 503 naming the UPDATE", func() bool {
		code, body := r.get(t, "/readyz")
		return code == 503 && strings.Contains(body, "table.op.invalid.behavior is fatal")
	})
	// /readyz names the session's error as soon as the session ends;
	// outboxd_blocked is set when the relay holds, once the session's
	// records have settled: a moment later (make test once read 0 in
	// between).
	poll(t, 20*time.Second, "outboxd_blocked 1 while holding", func() bool { return r.metric(t, "outboxd_blocked") == 1 })
	// outboxd closed its replication connection before it held; the server
	// marks the slot inactive once its walsender has seen that and exited,
	// a moment later (make test saw /readyz's 503 first).
	poll(t, 20*time.Second, "the slot inactive once outboxd holds", func() bool { return !f.slotState().Active })
	// It holds: still running, the slot not past the UPDATE, event 3 unsent,
	// and no replication connection open, for the next 3 s.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r.Exited() {
			t.Fatalf("outboxd exited while holding:\n%s", tailString(r.Log(), 3000))
		}
		if s := f.slotState(); s.ConfirmedFlushLSN >= updated || s.Active {
			t.Fatalf("slot confirmed %s (the UPDATE's transaction ends at %s), active %v: it did not hold before the UPDATE",
				harness.FormatLSN(s.ConfirmedFlushLSN), harness.FormatLSN(updated), s.Active)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if recs := f.records(); len(recs) != 1 {
		t.Fatalf("%d records, want only event 1 (nothing past the UPDATE)", len(recs))
	}
}
