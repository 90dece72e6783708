package harness

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// What the fixtures of the end-to-end suites (test/e2e, test/brokers) share:
// a fresh outbox database, outboxd started for one test, and waits on the
// test's slot. Each takes the connection to use at the call, as a fixture
// may reconnect after a server restart.

// NewOutboxDatabase creates database db on pg with the Debezium-layout
// outbox table and the publication outboxd (publish = publish), and returns
// its DSN and a connection to it. The caller closes the connection (a
// fixture may replace it after a server restart: the one it holds at the
// end is the one to close).
func NewOutboxDatabase(ctx context.Context, t testing.TB, pg *Postgres, db, publish string) (dsn string, conn *pgx.Conn) {
	t.Helper()
	dsn, err := pg.NewDatabase(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := OutboxSchema("outboxd", publish)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err = pg.Connect(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, schema); err != nil {
		conn.Close(context.Background())
		t.Fatalf("%s: %v", schema, err)
	}
	return dsn, conn
}

// RestartPostgres restarts pg (pg_ctl restart -m mode: fast, immediate)
// under conn, a connection to database db, which it closes first, and
// returns a new connection to db.
func RestartPostgres(ctx context.Context, t testing.TB, pg *Postgres, mode, db string, conn *pgx.Conn) *pgx.Conn {
	t.Helper()
	conn.Close(ctx)
	if err := pg.Restart(ctx, mode); err != nil {
		t.Fatalf("pg_ctl restart -m %s: %v", mode, err)
	}
	conn, err := pg.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// StartOutboxd starts the outboxd binary bin with args (and env added to
// the environment), its output in logDir/outboxd.log, without waiting for
// anything. It is killed when the test ends, and a failed test's output
// gets the end of its log.
func StartOutboxd(ctx context.Context, t testing.TB, bin string, args, env []string, logDir string) *Proc {
	t.Helper()
	p, err := StartProc(ctx, "outboxd", bin, args, env, logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Kill()
		if t.Failed() {
			log := p.Log()
			if len(log) > 6000 {
				log = "…" + log[len(log)-6000:]
			}
			t.Logf("outboxd log (%s):\n%s", p.LogPath(), log)
		}
	})
	return p
}

// FreeAddr is an unused 127.0.0.1 address, host:port, for a listener of
// the process under test (outboxd's --http-addr).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// MustSlotInfo is SlotInfo failing the test on an error.
func MustSlotInfo(ctx context.Context, t testing.TB, conn *pgx.Conn, slot string) SlotState {
	t.Helper()
	s, err := SlotInfo(ctx, conn, slot)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// WaitConfirmed polls until slot's confirmed_flush_lsn reaches lsn, and
// fails the test if it has not within the given time.
func WaitConfirmed(ctx context.Context, t testing.TB, conn *pgx.Conn, slot string, lsn uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := MustSlotInfo(ctx, t, conn, slot)
		if s.ConfirmedFlushLSN >= lsn {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("confirmed_flush_lsn %s did not reach %s within %s", FormatLSN(s.ConfirmedFlushLSN), FormatLSN(lsn), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SlotHolds polls slot for the time given and fails the test as soon as
// its confirmed_flush_lsn passes lsn; while says what must keep it there
// ("with the broker down").
func SlotHolds(ctx context.Context, t testing.TB, conn *pgx.Conn, slot string, lsn uint64, d time.Duration, while string) {
	t.Helper()
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if s := MustSlotInfo(ctx, t, conn, slot); s.ConfirmedFlushLSN > lsn {
			t.Fatalf("confirmed_flush_lsn moved from %s to %s %s", FormatLSN(lsn), FormatLSN(s.ConfirmedFlushLSN), while)
		}
	}
}

// WaitSlotInactive polls until no walsender holds slot (the server notices
// a closed connection asynchronously) and returns its state; it fails the
// test if the slot is still active after the given time.
func WaitSlotInactive(ctx context.Context, t testing.TB, conn *pgx.Conn, slot string, within time.Duration) SlotState {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		s := MustSlotInfo(ctx, t, conn, slot)
		if !s.Active {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot still active (pid %d) %s after outboxd exited", s.ActivePID, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
