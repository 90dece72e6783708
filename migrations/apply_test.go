package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/migrations"
	"github.com/outboxd/outboxd/test/harness"
)

func TestPublishedOps(t *testing.T) {
	if got := migrations.PublishedOps(false, true, false, true); got != "update, truncate" {
		t.Fatalf("PublishedOps = %q", got)
	}
	if got := migrations.PublishedOps(false, false, false, false); got != "" {
		t.Fatalf("PublishedOps of nothing = %q", got)
	}
	if (migrations.Objects{Headers: true}).TableScript() != migrations.OutboxHeadersTable || (migrations.Objects{}).TableScript() != migrations.OutboxTable {
		t.Fatal("TableScript")
	}
}

// Apply on a real PostgreSQL: the first run creates table, publication and
// role and says so; the second finds them and changes nothing; a
// publication that publishes more than inserts gets its fix named.
func TestApplyIsIdempotentAndSaysWhatItDid(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL (run without -short)")
	}
	pg := harness.PostgresForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := pg.NewDatabase(ctx, "apply"); err != nil {
		t.Fatal(err)
	}
	conn, err := pg.Connect(ctx, "apply")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	t.Cleanup(func() { _ = pg.Exec(context.Background(), "postgres", `DROP ROLE IF EXISTS outboxd_apply`) })
	o := migrations.Objects{Schema: "public", Table: "outbox", Publication: "outboxd", Role: "outboxd_apply"}
	apply := func() []string {
		var lines []string
		if err := migrations.Apply(ctx, conn, o, func(f string, a ...any) { lines = append(lines, fmt.Sprintf(f, a...)) }); err != nil {
			t.Fatal(err)
		}
		return lines
	}
	want := []string{
		"created table public.outbox",
		"created publication outboxd for public.outbox (publish = 'insert')",
		`created role outboxd_apply (LOGIN REPLICATION, SELECT on public.outbox, pg_read_all_stats); set its password: ALTER ROLE "outboxd_apply" PASSWORD '…';`,
	}
	if got := apply(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("first run said:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if _, err := conn.Exec(ctx, `ALTER PUBLICATION outboxd SET (publish = 'insert, update')`); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"table public.outbox already exists",
		"publication outboxd already includes public.outbox",
		`note: publication outboxd also publishes update; outboxd ignores them, but PostgreSQL still decodes and sends them (to publish INSERTs only: ALTER PUBLICATION "outboxd" SET (publish = 'insert');)`,
		"role outboxd_apply already exists (SELECT on public.outbox)",
	}
	if got := apply(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("second run said:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A role made by a setup that did not grant pg_read_all_stats gets it
	// on the next run.
	if _, err := conn.Exec(ctx, `REVOKE pg_read_all_stats FROM outboxd_apply`); err != nil {
		t.Fatal(err)
	}
	want = append(want, "granted role outboxd_apply pg_read_all_stats (a standby sees whether the active's client replies)")
	if got := apply(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("run after REVOKE pg_read_all_stats said:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Hardening revokes pg_logical_emit_message from PUBLIC: the role keeps
	// it for its heartbeats (granted to it by name).
	if _, err := conn.Exec(ctx, `DO $$ DECLARE f regprocedure; BEGIN
		FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message' LOOP
			EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
		END LOOP; END $$`); err != nil {
		t.Fatal(err)
	}
	var emit bool
	if err := conn.QueryRow(ctx, `SELECT bool_and(has_function_privilege('outboxd_apply', oid, 'EXECUTE')) FROM pg_proc WHERE proname = 'pg_logical_emit_message'`).Scan(&emit); err != nil || !emit {
		t.Fatalf("the role may not call pg_logical_emit_message once PUBLIC may not (err %v)", err)
	}
	t.Cleanup(func() { _ = pg.Exec(context.Background(), "apply", `DROP OWNED BY outboxd_apply`) })
	var cols int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox'`).Scan(&cols); err != nil || cols != 6 {
		t.Fatalf("%d columns (err %v), want Debezium's 6", cols, err)
	}
}

// Script is every statement Apply runs, in order, with the slot's when
// asked for; a name that would end the $outboxd$ blocks is refused whole.
func TestScript(t *testing.T) {
	sql, err := migrations.Script(migrations.Objects{Schema: "app", Table: "Outbox", Publication: "events_pub", Role: "outboxd_app"}, "relay1")
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for _, want := range []string{
		"-- The objects: table app.\"Outbox\", publication events_pub, role outboxd_app, slot relay1\n",
		"-- ---- 001_outbox.sql ----", `CREATE TABLE IF NOT EXISTS app."Outbox" (`,
		"-- ---- 003_publication.sql ----", `CREATE PUBLICATION "events_pub" FOR TABLE app."Outbox" WITH (publish = 'insert');`,
		"-- ---- 004_role.sql ----", `CREATE ROLE "outboxd_app" WITH LOGIN REPLICATION;`,
		"-- ---- replication slot ----", `SELECT pg_create_logical_replication_slot('relay1', 'pgoutput')`,
	} {
		i := strings.Index(sql, want)
		if i <= last {
			t.Fatalf("%q missing or out of order in:\n%s", want, sql)
		}
		last = i
	}
	sql, err = migrations.Script(migrations.Objects{Schema: "public", Table: "outbox", Publication: "outboxd", Headers: true}, "")
	if err != nil || strings.Contains(sql, "pg_create_logical_replication_slot") || !strings.Contains(sql, "002_outbox_headers.sql") || !strings.Contains(sql, "add --role NAME") {
		t.Fatalf("without role and slot (%v):\n%s", err, sql)
	}
	if sql, err := migrations.Script(migrations.Objects{Schema: "public", Table: "outbox", Publication: "p", Role: "x$outboxd$"}, ""); err == nil {
		t.Fatalf("a role ending the DO block accepted:\n%s", sql)
	}
}
