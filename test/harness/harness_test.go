package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

func testCtx(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLSN(t *testing.T) {
	for _, s := range []string{"0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF"} {
		lsn, err := ParseLSN(s)
		if err != nil {
			t.Fatalf("ParseLSN(%q): %v", s, err)
		}
		if got := FormatLSN(lsn); got != s {
			t.Errorf("FormatLSN(ParseLSN(%q)) = %q", s, got)
		}
	}
	if lsn, _ := ParseLSN("1/2"); lsn != 1<<32|2 {
		t.Errorf("ParseLSN(1/2) = %d", lsn)
	}
	for _, bad := range []string{"", "12", "x/1", "1/100000000"} {
		if _, err := ParseLSN(bad); err == nil {
			t.Errorf("ParseLSN(%q) succeeded", bad)
		}
	}
}

func TestPostgres(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	pg := PostgresForTest(t)

	if _, err := pg.NewDatabase(ctx, "harness"); err != nil {
		t.Fatal(err)
	}
	conn := mustConnect(ctx, t, pg, "harness")
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil || walLevel != "logical" {
		t.Fatalf("wal_level = %q, %v; want logical", walLevel, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('s1', 'pgoutput')"); err != nil {
		t.Fatal(err)
	}
	slot, err := SlotInfo(ctx, conn, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if slot.Plugin != "pgoutput" || slot.Database != "harness" || slot.Active || slot.ConfirmedFlushLSN == 0 || slot.RestartLSN == 0 {
		t.Fatalf("unexpected slot state %+v", slot)
	}
	wal, err := CurrentWALLSN(ctx, conn)
	if err != nil || wal < slot.ConfirmedFlushLSN {
		t.Fatalf("current WAL LSN %s (err %v) before slot's %s", FormatLSN(wal), err, FormatLSN(slot.ConfirmedFlushLSN))
	}
	if _, err := SlotInfo(ctx, conn, "missing"); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("SlotInfo(missing) = %v, want pgx.ErrNoRows", err)
	}
	port := pg.Port()
	if pg.External() {
		return // no lifecycle control
	}

	for _, mode := range []string{"fast", "immediate"} {
		if err := pg.Restart(ctx, mode); err != nil {
			t.Fatalf("restart %s: %v", mode, err)
		}
		if pg.Port() != port {
			t.Fatalf("port changed from %d to %d", port, pg.Port())
		}
		conn = mustConnect(ctx, t, pg, "harness")
		if got, err := SlotInfo(ctx, conn, "s1"); err != nil || got.ConfirmedFlushLSN != slot.ConfirmedFlushLSN {
			t.Fatalf("after %s restart: slot %+v, %v", mode, got, err)
		}
	}

	// Stop is idempotent and Start brings the same server back.
	for range 2 {
		if err := pg.Stop(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}

	// Recreating a database drops its slots even while a connection is open.
	mustConnect(ctx, t, pg, "harness") // held open until the test's cleanup
	if _, err := pg.NewDatabase(ctx, "harness"); err != nil {
		t.Fatal(err)
	}
	if err := pg.Exec(ctx, "harness", "CREATE TABLE t (id int)"); err != nil {
		t.Fatal(err)
	}
	admin := mustConnect(ctx, t, pg, "postgres")
	if _, err := SlotInfo(ctx, admin, "s1"); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("slot survived NewDatabase: %v", err)
	}
}

func TestPostgresWithConf(t *testing.T) {
	if os.Getenv(EnvPostgres) != "" {
		t.Skip("needs a harness-started server")
	}
	ctx := testCtx(t, 3*time.Minute)
	pg := PostgresForTest(t, WithConf("wal_level", "replica"))
	conn := mustConnect(ctx, t, pg, "postgres")
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil || walLevel != "replica" {
		t.Fatalf("wal_level = %q, %v; want replica", walLevel, err)
	}
	_, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot('s1', 'pgoutput')")
	if err == nil || !strings.Contains(err.Error(), "wal_level") {
		t.Fatalf("creating a logical slot with wal_level=replica: %v", err)
	}
}

func mustConnect(ctx context.Context, t *testing.T, pg *Postgres, db string) *pgx.Conn {
	t.Helper()
	conn, err := pg.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestKafkaPersistence(t *testing.T) {
	if os.Getenv(EnvKafka) != "" {
		t.Skip("needs a harness-started broker")
	}
	ctx := testCtx(t, 5*time.Minute)
	k := KafkaForTest(t)
	brokers := k.Brokers()

	var want []string
	produce := func(n int) {
		t.Helper()
		for range n {
			want = append(want, fmt.Sprintf("value-%02d", len(want)))
		}
		// One key puts every record on one partition, so order is defined.
		mustProduce(ctx, t, k, "t", "k", want[len(want)-n:]...)
	}
	check := func(when string) {
		t.Helper()
		recs, err := ReadAll(ctx, k.Brokers(), []string{"t"}, len(want))
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if got := values(recs); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%s: read %v, want %v", when, got, want)
		}
	}

	produce(10)
	if err := k.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := k.Brokers(); got[0] != brokers[0] {
		t.Fatalf("broker moved from %v to %v", brokers, got)
	}
	check("after clean restart")

	// Records are written to the segment files when produced, so they
	// survive SIGKILL too.
	produce(5)
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := k.Start(ctx); err != nil {
		t.Fatal(err)
	}
	check("after kill and restart")

	mustProduce(ctx, t, k, "outbox.a", "", "a")
	mustProduce(ctx, t, k, "outbox.b", "", "b")
	recs, err := ReadMatching(ctx, k.Brokers(), `^outbox\..*`, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sorted(values(recs)), ","); got != "a,b" {
		t.Fatalf("ReadMatching read %s, want a,b", got)
	}
}

func TestKafkaSASLTLS(t *testing.T) {
	if os.Getenv(EnvKafka) != "" {
		t.Skip("needs a harness-started broker")
	}
	ctx := testCtx(t, 5*time.Minute)
	cert, key, err := SelfSignedCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	k := KafkaForTest(t, WithSASL("SCRAM-SHA-256", "alice", "secret"), WithTLS(cert, key), WithPartitions(1))
	mustProduce(ctx, t, k, "secure", "", "hello")
	opts, err := k.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	recs, err := ReadAll(ctx, k.Brokers(), []string{"secure"}, 1, opts...)
	if err != nil || len(recs) != 1 || string(recs[0].Value) != "hello" {
		t.Fatalf("read %v, %v; want hello", values(recs), err)
	}

	// A client without credentials gets nothing.
	short := testCtx(t, 2*time.Second)
	if recs, err := ReadAll(short, k.Brokers(), []string{"secure"}, 1); err == nil {
		t.Fatalf("unauthenticated read succeeded: %v", values(recs))
	}
}

func mustProduce(ctx context.Context, t *testing.T, k *Kafka, topic, key string, vals ...string) {
	t.Helper()
	opts, err := k.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	// Apache brokers run with auto.create.topics.enable=false.
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, -1, -1, nil, topic); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatalf("creating %s: %v", topic, err)
	}
	var recs []*kgo.Record
	for _, v := range vals {
		r := &kgo.Record{Topic: topic, Value: []byte(v)}
		if key != "" {
			r.Key = []byte(key)
		}
		recs = append(recs, r)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("producing to %s: %v", topic, err)
	}
}

func values(recs []*kgo.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, string(r.Value))
	}
	return out
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

func TestProc(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	dir := t.TempDir()

	p, err := StartProc(ctx, "sleeper", "/bin/sh", []string{"-c", `echo "ready $GREETING"; exec sleep 60`}, []string{"GREETING=hi"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitLog(ctx, "ready hi"); err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(ctx); err != nil || code != 128+int(syscall.SIGKILL) {
		t.Fatalf("Wait = %d, %v; want %d", code, err, 128+int(syscall.SIGKILL))
	}

	p, err = StartProc(ctx, "exiter", "/bin/sh", []string{"-c", "echo bye >&2; exit 3"}, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(ctx); err != nil || code != 3 {
		t.Fatalf("Wait = %d, %v; want 3", code, err)
	}
	if err := p.WaitLog(ctx, "never printed"); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitLog on an exited process: %v", err)
	}
	if !strings.Contains(p.Log(), "bye") {
		t.Fatalf("log %q lacks stderr output", p.Log())
	}
}

func TestExternalPostgres(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	pg := PostgresForTest(t)
	for _, dsn := range []string{
		pg.DSN("postgres"),
		fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", pg.Port()),
	} {
		t.Setenv(EnvPostgres, dsn)
		ext, err := StartPostgres(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !ext.External() || ext.Port() != pg.Port() || ext.Dir() != "" {
			t.Fatalf("external server: external=%v port=%d dir=%q", ext.External(), ext.Port(), ext.Dir())
		}
		if err := ext.Stop(ctx); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Fatalf("Stop on external server: %v", err)
		}
		if _, err := ext.NewDatabase(ctx, "ext db"); err != nil {
			t.Fatal(err)
		}
		conn := mustConnect(ctx, t, ext, "ext db")
		var db string
		if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "ext db" {
			t.Fatalf("connected to %q, %v; want %q (DSN %s)", db, err, "ext db", ext.DSN("ext db"))
		}
		ext.Close() // must leave the server running
	}
	mustConnect(ctx, t, pg, "postgres")
}

func TestExternalKafka(t *testing.T) {
	ctx := testCtx(t, 5*time.Minute)
	k := KafkaForTest(t)
	t.Setenv(EnvKafka, " "+k.Brokers()[0]+", ")
	ext := KafkaForTest(t)
	if !ext.External() || strings.Join(ext.Brokers(), ",") != k.Brokers()[0] {
		t.Fatalf("external brokers %q, want %q", ext.Brokers(), k.Brokers())
	}
	if err := ext.Stop(); err == nil || !strings.Contains(err.Error(), "not supported") {
		t.Fatalf("Stop on external cluster: %v", err)
	}
	mustProduce(ctx, t, ext, "ext", "", "x")
	if _, err := ReadAll(ctx, ext.Brokers(), []string{"ext"}, 1); err != nil {
		t.Fatal(err)
	}
}

// TestProcFreeze: Freeze returns only once the process is stopped, so a
// busy process (a shell spinning on a core) shows no running thread right
// after it; SIGCONT lets it run again.
func TestProcFreeze(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	p, err := StartProc(ctx, "spinner", "/bin/sh", []string{"-c", `echo spinning; while :; do :; done`}, nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	if err := p.WaitLog(ctx, "spinning"); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if err := p.Freeze(); err != nil {
			t.Fatal(err)
		}
		if n, err := runningThreads(p.Pid()); err != nil || n != 0 {
			t.Fatalf("round %d: %d threads running after Freeze (%v)", i, n, err)
		}
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		for { // running again before the next round
			n, err := runningThreads(p.Pid())
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}
