package e2e

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxd/outboxd/test/harness"
)

// failoverWriter commits ten events per transaction, ids counting up, on a
// multi-host DSN: it rides through the failover, reconnecting to whichever
// server accepts writes. A transaction whose COMMIT failed may or may not
// exist; the promoted server's outbox table is the truth.
type failoverWriter struct {
	next atomic.Int64 // the id of the next event
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func startFailoverWriter(ctx context.Context, dsn, agg string) *failoverWriter {
	w := &failoverWriter{stop: make(chan struct{}), done: make(chan struct{})}
	w.next.Store(1)
	go func() {
		defer close(w.done)
		var conn *pgx.Conn
		defer func() {
			if conn != nil {
				conn.Close(context.Background())
			}
		}()
		for {
			select {
			case <-w.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			if conn == nil {
				c, err := pgx.Connect(ctx, dsn)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				conn = c
			}
			first := int(w.next.Add(10)) - 10
			err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				for n := first; n < first+10; n++ {
					if _, err := tx.Exec(ctx, insertSQL, eventID(n), agg, fmt.Sprintf("k%d", n%5), "E", fmt.Sprintf(`{"n": %d}`, n)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				conn.Close(context.Background())
				conn = nil
			}
		}
	}()
	return w
}

func (w *failoverWriter) finish() {
	w.once.Do(func() { close(w.stop) })
	<-w.done
}

// multiHostDSN lists both servers; target_session_attrs=read-write makes
// every connection (replication ones included) land on the primary.
func multiHostDSN(db string, servers ...*harness.Postgres) string {
	var hosts []string
	for _, s := range servers {
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", s.Port()))
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2", strings.Join(hosts, ","), db)
}

// slotSynced reports whether the standby holds a synchronized, persistent
// copy of the slot (a temporary one is dropped, not used, at promotion).
func slotSynced(ctx context.Context, standby *pgx.Conn, slot string) bool {
	var ok bool
	err := standby.QueryRow(ctx, `SELECT coalesce(bool_and(synced AND NOT temporary), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&ok)
	return err == nil && ok
}

// PostgreSQL failover under load: a primary and a streaming standby, outboxd
// on a multi-host DSN; the primary crashes (-m immediate) and the standby is
// promoted. On PostgreSQL 17+ the failover slot (synchronized_standby_slots
// naming the standby) carries on: nothing lost, nothing published that the
// promoted server does not have, duplicates counted.
func TestPGFailover(t *testing.T) {
	primary := harness.PostgresForTest(t)
	if primary.External() {
		t.Skip("needs a harness-started server it may crash (" + harness.EnvPostgres + " is set)")
	}
	f := newFixture(t, withPostgres(primary))
	version, err := harness.ServerVersionNum(f.ctx, f.conn)
	if err != nil {
		t.Fatal(err)
	}
	if version < 170000 {
		testFailoverGap(t, f, primary)
		return
	}
	role := f.asSetupRole()
	standby := primary.StandbyForTest(t, "standby1")
	f.dsn = strings.Replace(multiHostDSN(f.db, primary, standby), "postgres://postgres@", "postgres://"+role+"@", 1)
	r := f.startRelay("--replication-timeout", "5s", "--poll-interval", "200ms")
	if st := r.statusDoc(t); st["failover"] != true {
		t.Fatalf("/status failover = %v, want true", st["failover"])
	}
	// The standby is not in synchronized_standby_slots yet: outboxd warns.
	poll(t, 10*time.Second, "outboxd_unprotected_standbys 1", func() bool { return r.metric(t, "outboxd_unprotected_standbys") == 1 })
	if w, _ := r.statusDoc(t)["warning"].(string); !strings.Contains(w, "standby1") {
		t.Errorf("/status warning %q does not name standby1", w)
	}
	if !r.logged(f.ctx, "synchronized_standby_slots does not name") {
		t.Errorf("no warning in the log")
	}
	f.exec(`ALTER SYSTEM SET synchronized_standby_slots = 'standby1'`)
	f.exec(`SELECT pg_reload_conf()`)
	poll(t, 10*time.Second, "outboxd_unprotected_standbys 0", func() bool { return r.metric(t, "outboxd_unprotected_standbys") == 0 })
	sconn, err := standby.Connect(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())

	w := startFailoverWriter(f.ctx, strings.Replace(f.dsn, "postgres://"+role+"@", "postgres://postgres@", 1), f.agg)
	defer w.finish()
	poll(t, 30*time.Second, "events relayed before the failover", func() bool { return f.topicCount(f.topic()) >= 2000 })
	// A standby snapshot record lets the slot sync worker copy the slot now
	// rather than at the next checkpoint's (up to 30 s on an idle server).
	poll(t, 30*time.Second, "slot synchronized to the standby", func() bool {
		_, _ = f.conn.Exec(f.ctx, `SELECT pg_log_standby_snapshot()`)
		return slotSynced(f.ctx, sconn, f.slot)
	})
	// outboxd status on the standby shows the synchronized copy.
	out := mustCLI(t, f.ctx, "status", "--postgres", standby.DSN(f.db), "--slot", f.slot)
	if !regexp.MustCompile(`(?m)^\* `+f.slot+`\s.*\syes\s+yes$`).MatchString(out) || !strings.Contains(out, "FAILOVER  SYNCED") {
		t.Errorf("outboxd status on the standby does not show the slot as failover and synced:\n%s", out)
	}
	if err := primary.Kill(f.ctx); err != nil {
		t.Fatal(err)
	}
	atFailover := w.next.Load()
	failedAt := time.Now()
	if err := standby.Promote(f.ctx); err != nil {
		t.Fatal(err)
	}
	promoted := time.Since(failedAt)
	poll(t, 60*time.Second, "outboxd streaming from the promoted server", func() bool {
		var active bool
		err := sconn.QueryRow(f.ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&active)
		return err == nil && active && r.role(t) == "active"
	})
	resumed := time.Since(failedAt)
	poll(t, 60*time.Second, "writes on the promoted server", func() bool { return w.next.Load() > atFailover+1000 })
	w.finish()
	dups := checkAfterFailover(t, f, sconn)
	t.Logf("PostgreSQL %d: promotion took %s; outboxd streamed from the promoted server %s after the crash",
		version/10000, promoted.Round(time.Millisecond), resumed.Round(time.Millisecond))
	// The promoted server replayed the old timeline past what outboxd had
	// acked (synchronized_standby_slots names the standby), so it resumes
	// from there, not from the synchronized slot, which lags by up to the
	// sync interval (hundreds to thousands of duplicates before). What is
	// left: the events of a transaction whose COMMIT had not arrived when
	// the connection broke (the writer's transactions hold 10).
	log, err := os.ReadFile(r.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	// Either the synchronized slot lagged and outboxd resumed past it from
	// the promoted server's timeline history, or the slot had been synced
	// up to what was acked and the next session starts right there.
	if !strings.Contains(string(log), "the server is a later timeline of the previous one") && !resumedWhereItEnded(string(log)) {
		t.Errorf("outboxd did not resume from its acked position on the promoted server")
	}
	if dups > 10 {
		t.Errorf("%d duplicates after the failover, want at most 10 (one writer transaction cut by the crash)", dups)
	}
}

// checkAfterFailover waits until the promoted server's slot confirms its
// current WAL, then compares Kafka with its outbox table: every row
// published (0 lost), no record without a row (0 phantom).
func checkAfterFailover(t *testing.T, f *fixture, sconn *pgx.Conn) (dups int) {
	t.Helper()
	var end string
	if err := sconn.QueryRow(f.ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, "slot confirmed on the promoted server", func() bool {
		var ok bool
		err := sconn.QueryRow(f.ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, f.slot, end).Scan(&ok)
		return err == nil && ok
	})
	rows, err := sconn.Query(f.ctx, `SELECT id::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	first, dups := byID(t, f.records())
	lost := 0
	for _, id := range ids {
		if _, ok := first[id]; !ok {
			lost++
		} else {
			delete(first, id)
		}
	}
	phantom := len(first)
	t.Logf("after the failover: %d events in the promoted server's outbox, %d lost, %d phantom, %d duplicates", len(ids), lost, phantom, dups)
	if lost != 0 || phantom != 0 {
		t.Errorf("%d events lost, %d phantom events (in Kafka, not in the promoted server)", lost, phantom)
	}
	return dups
}

// resumedWhereItEnded reports whether outboxd's log shows the session after
// the last one that ended streaming from that session's resume position.
func resumedWhereItEnded(log string) bool {
	i := strings.LastIndex(log, " resume_lsn=")
	if i < 0 {
		return false
	}
	lsn, _, _ := strings.Cut(log[i+len(" resume_lsn="):], "\n")
	lsn, _, _ = strings.Cut(lsn, " ")
	return strings.Contains(log[i:], "msg=streaming") && strings.Contains(log[i:], " from_lsn="+lsn+" ")
}
