package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// outboxdCLI runs one outboxd command to completion and returns its combined
// output and exit code. OUTBOXD_* settings of the test's own environment are
// left out, so only the arguments count.
func outboxdCLI(t *testing.T, ctx context.Context, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxdBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOXD_") || strings.HasPrefix(kv, "OUTBOXD_TEST_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &exit):
		return string(out), exit.ExitCode()
	default:
		t.Fatalf("outboxd %s: %v\n%s", strings.Join(args, " "), err, out)
		return "", -1
	}
}

// mustCLI runs outboxd and fails the test unless it exits 0.
func mustCLI(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, code := outboxdCLI(t, ctx, args...)
	if code != 0 {
		t.Fatalf("outboxd %s: exit %d\n%s", args[0], code, out)
	}
	return out
}

func wantLines(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// emptyDB is a fresh database with nothing in it, and a superuser connection.
func emptyDB(t *testing.T, name string) (context.Context, string, *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	dsn, err := sharedPG.NewDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := sharedPG.Connect(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return ctx, dsn, conn
}

// dropSlotAtEnd drops a test's slot so that it holds no WAL for later tests.
func dropSlotAtEnd(t *testing.T, conn *pgx.Conn, slot string) {
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, slot)
	})
}

// setupState is what setup creates, to show a second run changes nothing.
type setupState struct {
	tableOID, pubOID, pubRels        int64
	pubIns, pubUpd, pubDel, pubTrunc bool
	slot                             harness.SlotState
}

func readSetupState(t *testing.T, ctx context.Context, conn *pgx.Conn, slot string) setupState {
	t.Helper()
	var s setupState
	if err := conn.QueryRow(ctx, `SELECT 'public.outbox'::regclass::oid::bigint, p.oid::bigint, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
		(SELECT count(*) FROM pg_publication_rel r WHERE r.prpubid = p.oid)
		FROM pg_publication p WHERE p.pubname = 'outboxd'`).
		Scan(&s.tableOID, &s.pubOID, &s.pubIns, &s.pubUpd, &s.pubDel, &s.pubTrunc, &s.pubRels); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.slot, err = harness.SlotInfo(ctx, conn, slot); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestOpsSetupEmptyDatabase(t *testing.T) {
	ctx, dsn, conn := emptyDB(t, "db_ops_setup_empty")
	const slot = "s_ops_setup_empty"
	dropSlotAtEnd(t, conn, slot)

	out := mustCLI(t, ctx, "setup", "--postgres", dsn, "--slot", slot)
	t.Logf("outboxd setup (first run):\n%s", out)
	wantLines(t, out, "created table public.outbox\n", "created publication outboxd for public.outbox (publish = 'insert')\n",
		"created slot "+slot+" (pgoutput) at ")

	first := readSetupState(t, ctx, conn, slot)
	if !first.pubIns || first.pubUpd || first.pubDel || first.pubTrunc {
		t.Errorf("publication publishes insert=%v update=%v delete=%v truncate=%v, want insert only", first.pubIns, first.pubUpd, first.pubDel, first.pubTrunc)
	}
	if first.pubRels != 1 {
		t.Errorf("publication has %d tables, want 1", first.pubRels)
	}
	if first.slot.Plugin != "pgoutput" || first.slot.Database != "db_ops_setup_empty" {
		t.Errorf("slot %+v, want pgoutput in db_ops_setup_empty", first.slot)
	}
	// The table is Debezium's layout and takes an event with defaults.
	if _, err := conn.Exec(ctx, `INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) VALUES ('Order', '1', 'Created', '{}')`); err != nil {
		t.Fatal(err)
	}

	out = mustCLI(t, ctx, "setup", "--postgres", dsn, "--slot", slot)
	t.Logf("outboxd setup (second run):\n%s", out)
	wantLines(t, out, "table public.outbox already exists\n", "publication outboxd already includes public.outbox\n",
		fmt.Sprintf("slot %s exists (pgoutput, confirmed_flush_lsn %s)\n", slot, harness.FormatLSN(first.slot.ConfirmedFlushLSN)))
	if strings.Contains(out, "created") || strings.Contains(out, "added") {
		t.Errorf("second run changed something:\n%s", out)
	}
	if second := readSetupState(t, ctx, conn, slot); second != first {
		t.Errorf("state changed by the second run:\n before %+v\n after  %+v", first, second)
	}
}

// setup --print is the same SQL, runnable by psql: each script on its own.
func TestOpsSetupPrintSQL(t *testing.T) {
	ctx, dsn, conn := emptyDB(t, "db_ops_setup_print")
	const slot = "s_ops_setup_print"
	dropSlotAtEnd(t, conn, slot)
	sql := mustCLI(t, ctx, "setup", "--print", "--slot", slot)
	chunks := strings.Split(sql, "\n-- ---- ")
	if len(chunks) != 4 { // preamble, table, publication, slot
		t.Fatalf("--print has %d parts, want 4:\n%s", len(chunks), sql)
	}
	for _, c := range chunks[1:] {
		if _, err := conn.PgConn().Exec(ctx, "-- "+c).ReadAll(); err != nil {
			t.Fatalf("running printed SQL: %v\n%s", err, c)
		}
	}
	st := readSetupState(t, ctx, conn, slot)
	if st.slot.Plugin != "pgoutput" || !st.pubIns || st.pubUpd {
		t.Errorf("printed SQL made %+v", st)
	}
	out := mustCLI(t, ctx, "setup", "--postgres", dsn, "--slot", slot)
	wantLines(t, out, "table public.outbox already exists", "publication outboxd already includes public.outbox", "slot "+slot+" exists")
}

// setup --role makes a role with which outboxd streams and relays, and no more.
func TestOpsSetupRole(t *testing.T) {
	f := newFixture(t)
	const role = "r_ops_setup_role"
	f.exec(`DROP ROLE IF EXISTS ` + role)
	t.Cleanup(func() {
		// After the relay (registered later, so cleaned up first) is gone.
		ctx := context.Background()
		_, _ = f.conn.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = f.conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})

	out := mustCLI(t, f.ctx, "setup", "--postgres", f.dsn, "--slot", f.slot, "--role", role)
	t.Logf("outboxd setup --role:\n%s", out)
	wantLines(t, out, "table public.outbox already exists\n", "publication outboxd already includes public.outbox\n",
		"created role "+role+" (LOGIN REPLICATION, SELECT on public.outbox, pg_read_all_stats)", "created slot "+f.slot+" (pgoutput)")

	var repl, super, login, sel, ins bool
	if err := f.conn.QueryRow(f.ctx, `SELECT rolreplication, rolsuper, rolcanlogin,
		has_table_privilege(rolname, 'public.outbox', 'SELECT'), has_table_privilege(rolname, 'public.outbox', 'INSERT')
		FROM pg_roles WHERE rolname = $1`, role).Scan(&repl, &super, &login, &sel, &ins); err != nil {
		t.Fatal(err)
	}
	if !repl || !login || !sel || super || ins {
		t.Errorf("role: replication=%v login=%v select=%v superuser=%v insert=%v; want replication, login and select only", repl, login, sel, super, ins)
	}
	out = mustCLI(t, f.ctx, "setup", "--postgres", f.dsn, "--slot", f.slot, "--role", role)
	wantLines(t, out, "role "+role+" already exists (SELECT on public.outbox)\n")

	// outboxd under exactly that role (trust auth: no password).
	superDSN := f.dsn
	f.dsn = strings.Replace(f.dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	if f.dsn == superDSN {
		t.Fatalf("could not rewrite the user of %q", superDSN)
	}
	r := f.startRelay()
	var user string
	if err := f.conn.QueryRow(f.ctx, `SELECT a.usename::text FROM pg_replication_slots s JOIN pg_stat_activity a ON a.pid = s.active_pid
		WHERE s.slot_name = $1`, f.slot).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if user != role {
		t.Errorf("slot streamed by %q, want %q", user, role)
	}
	f.agg += strconv.FormatInt(time.Now().UnixNano(), 36) // a topic of its own, also under -count
	end := f.commit(event{1, "order-1", "OrderCreated", `{"by": "least privilege"}`})
	f.waitConfirmed(end, 20*time.Second)
	recs := f.records()
	if len(recs) != 1 || string(recs[0].Value) != `{"by": "least privilege"}` {
		t.Fatalf("got %d records, want the one event: %+v", len(recs), recs)
	}
	if id, _ := header(recs[0], "id"); id != eventID(1) {
		t.Errorf("id header %q, want %s", id, eventID(1))
	}
	r.stop(t, f.ctx)
}

var humanSize = `-?\d+(\.\d)?(B|KiB|MiB|GiB|TiB)`

func TestOpsStatus(t *testing.T) {
	f := newFixture(t)
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	f.commit(event{1, "a", "E", `{"n": 1}`}, event{2, "b", "E", `{"n": 2}`})

	out := mustCLI(t, f.ctx, "status", "--postgres", f.dsn, "--slot", f.slot)
	t.Logf("outboxd status (slot idle, events waiting):\n%s", out)
	row := regexp.MustCompile(`(?m)^\* ` + f.slot + `\s+pgoutput\s+no\s+-\s+[0-9A-F]+/[0-9A-F]+\s+(` + humanSize + `)\s+` + humanSize +
		`\s+(reserved|extended)\s+(unlimited|` + humanSize + `)\s+no$`) // FAILOVER: not a failover slot
	m := row.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no row for slot %s (idle, pgoutput, lag, retained, reserved) in:\n%s", f.slot, out)
	}
	if m[1] == "0B" {
		t.Errorf("lag %s with unrelayed events", m[1])
	}
	wantLines(t, out, "database "+f.db+" on PostgreSQL ", "SLOT", "LAG", "RETAINED WAL", "(* is --slot "+f.slot+")",
		"publication outboxd (publish insert)\n", "public.outbox  yes     no      no      no\n")

	out = mustCLI(t, f.ctx, "status", "--postgres", f.dsn, "--slot", f.slot, "--json")
	var js struct {
		CurrentWALLSN string           `json:"current_wal_lsn"`
		Slots         []map[string]any `json:"slots"`
		Publication   struct {
			Name   string   `json:"name"`
			Insert bool     `json:"insert"`
			Update bool     `json:"update"`
			Tables []string `json:"tables"`
		} `json:"publication"`
	}
	if err := json.Unmarshal([]byte(out), &js); err != nil {
		t.Fatalf("status --json: %v\n%s", err, out)
	}
	var slot map[string]any
	for _, s := range js.Slots {
		if s["slot_name"] == f.slot {
			slot = s
		}
	}
	if slot == nil {
		t.Fatalf("slot %s not in --json slots:\n%s", f.slot, out)
	}
	lag, ok := slot["lag_bytes"].(float64)
	if !ok || lag <= 0 {
		t.Errorf("lag_bytes = %#v, want a positive number", slot["lag_bytes"])
	}
	if _, ok := slot["retained_wal_bytes"].(float64); !ok {
		t.Errorf("retained_wal_bytes = %#v, want a number", slot["retained_wal_bytes"])
	}
	if lsn, _ := slot["confirmed_flush_lsn"].(string); !strings.Contains(lsn, "/") || slot["selected"] != true || slot["plugin"] != "pgoutput" {
		t.Errorf("slot in --json: %v", slot)
	}
	if js.Publication.Name != "outboxd" || !js.Publication.Insert || js.Publication.Update || len(js.Publication.Tables) != 1 || js.Publication.Tables[0] != "public.outbox" {
		t.Errorf("publication in --json: %+v", js.Publication)
	}

	// Streaming: the holder is shown, and the lag is gone.
	r := f.startRelay()
	end := f.commit(event{3, "a", "E", `{"n": 3}`})
	f.waitConfirmed(end, 20*time.Second)
	pid := f.slotState().ActivePID
	out = mustCLI(t, f.ctx, "status", "--postgres", f.dsn, "--slot", f.slot)
	t.Logf("outboxd status (outboxd streaming):\n%s", out)
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^\* %s\s+pgoutput\s+yes\s+PID %d \(outboxd[,)]`, f.slot, pid)).MatchString(out) {
		t.Errorf("no active row naming PID %d and outboxd:\n%s", pid, out)
	}
	r.stop(t, f.ctx)
}

func TestOpsSlotDrop(t *testing.T) {
	f := newFixture(t)
	drop := func(extra ...string) (string, int) {
		return outboxdCLI(t, f.ctx, append([]string{"slot", "drop", "--postgres", f.dsn, "--slot", f.slot}, extra...)...)
	}
	gone := func() bool {
		_, err := harness.SlotInfo(f.ctx, f.conn, f.slot)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		return err != nil
	}

	// Inactive: dropped.
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	out, code := drop()
	if code != 0 || !strings.Contains(out, "dropped slot "+f.slot+" (pgoutput, confirmed_flush_lsn ") || !strings.Contains(out, "start outboxd once\nwith --accept-gap") || !gone() {
		t.Fatalf("drop of an inactive slot: exit %d, gone %v\n%s", code, gone(), out)
	}
	if out, code = drop(); code != 1 || !strings.Contains(out, fmt.Sprintf("replication slot %q does not exist", f.slot)) {
		t.Errorf("drop of a missing slot: exit %d\n%s", code, out)
	}

	// Active: refused, naming the holder; --force terminates it and drops.
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	pid, _ := f.holdSlot()
	out, code = drop()
	t.Logf("outboxd slot drop (active):\n%s", out)
	if code != 1 || !strings.Contains(out, fmt.Sprintf("replication slot %q is active for PID %d (intruder", f.slot, pid)) ||
		!strings.Contains(out, "--force") || gone() {
		t.Fatalf("drop of an active slot without --force: exit %d, gone %v\n%s", code, gone(), out)
	}
	out, code = drop("--force")
	t.Logf("outboxd slot drop --force:\n%s", out)
	if code != 0 || !gone() {
		t.Fatalf("drop --force: exit %d, gone %v\n%s", code, gone(), out)
	}
	wantLines(t, out, fmt.Sprintf("terminated PID %d (intruder", pid), "which held slot "+f.slot+"\n", "dropped slot "+f.slot)
}

// An existing publication is extended, never altered otherwise; what is off
// about it is said.
func TestOpsSetupExistingPublication(t *testing.T) {
	f := newFixture(t, withPublish("insert, update"))
	f.exec(`CREATE PUBLICATION empty_pub`)

	out := mustCLI(t, f.ctx, "setup", "--postgres", f.dsn, "--no-slot")
	wantLines(t, out, "publication outboxd already includes public.outbox\n",
		`note: publication outboxd also publishes update; outboxd ignores them`, `ALTER PUBLICATION "outboxd" SET (publish = 'insert');`)
	out = mustCLI(t, f.ctx, "setup", "--postgres", f.dsn, "--no-slot", "--publication", "empty_pub")
	wantLines(t, out, "added public.outbox to publication empty_pub\n")
	if strings.Contains(out, "slot") {
		t.Errorf("--no-slot output mentions a slot:\n%s", out)
	}
	var n int
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'empty_pub' AND schemaname = 'public' AND tablename = 'outbox'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("empty_pub has public.outbox %d times (%v)", n, err)
	}
	if err := f.conn.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1`, f.db).Scan(&n); err != nil || n != 0 {
		t.Errorf("--no-slot left %d slots (%v)", n, err)
	}
}

// wal_level = replica: setup checks every prerequisite before it changes
// anything, so it fails with the fix and leaves neither table nor
// publication nor role behind.
func TestOpsSetupWALLevel(t *testing.T) {
	if sharedPG.External() {
		t.Skip("needs a throwaway cluster with wal_level=replica")
	}
	pg := harness.PostgresForTest(t, harness.WithConf("wal_level", "replica"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, code := outboxdCLI(t, ctx, "setup", "--postgres", pg.DSN("postgres"), "--role", "r_setup_wal_level")
	t.Logf("outboxd setup with wal_level=replica:\n%s", out)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, out)
	}
	wantLines(t, out, "setup: nothing was changed", `wal_level is "replica"; logical decoding needs wal_level = logical`, "ALTER SYSTEM SET wal_level = logical;")
	conn, err := pg.Connect(ctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var table, pub, role bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('public.outbox') IS NOT NULL, EXISTS (SELECT 1 FROM pg_publication),
		EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'r_setup_wal_level')`).Scan(&table, &pub, &role); err != nil {
		t.Fatal(err)
	}
	if table || pub || role {
		t.Fatalf("setup changed the server before failing: table %v, publication %v, role %v", table, pub, role)
	}
}
