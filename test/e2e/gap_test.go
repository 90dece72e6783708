package e2e

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// testFailoverGap is TestPGFailover on PostgreSQL ≤ 16, which has no
// failover slots: the promoted standby lacks the slot. outboxd must not
// create a new one there (it would silently skip what the old slot had not
// delivered): it reports the gap and exits, again after a restart (the
// progress topic outlives the slot), and continues only with --accept-gap.
// Two instances run, as the `setup --role` role, started 0.2 s apart as
// pods are: the standby one read the progress record before the active
// wrote any, and must still refuse to create the slot after the failover.
func testFailoverGap(t *testing.T, f *fixture, primary *harness.Postgres) {
	role := f.asSetupRole()
	standby := primary.StandbyForTest(t, "standby1")
	f.dsn = strings.Replace(multiHostDSN(f.db, primary, standby), "postgres://postgres@", "postgres://"+role+"@", 1)
	p, r := f.spawn("--replication-timeout", haTimeout.String())
	time.Sleep(200 * time.Millisecond) // the second pod starts a moment later, not once the first streams
	pb, rb := f.spawn("--replication-timeout", haTimeout.String())
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd did not stream: %v", err)
	}
	rb.waitRole(t, "standby", 20*time.Second)
	w := startFailoverWriter(f.ctx, strings.Replace(f.dsn, "postgres://"+role+"@", "postgres://postgres@", 1), f.agg)
	defer w.finish()
	poll(t, 30*time.Second, "events relayed before the failover", func() bool { return f.topicCount(f.topic()) >= 2000 })
	if err := primary.Kill(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(f.ctx); err != nil {
		t.Fatal(err)
	}
	const want = `outboxd run: gap: replication slot "`
	exitsWithGap := func(p *harness.Proc, what string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
		defer cancel()
		code, err := p.Wait(wctx)
		if err != nil || code != 1 {
			t.Fatalf("%s: outboxd exit %d, err %v; want exit 1 with a gap\n%s", what, code, err, tailString(p.Log(), 4000))
		}
		if !strings.Contains(p.Log(), want) || !strings.Contains(p.Log(), "does not exist, but outboxd has confirmed it up to LSN") {
			t.Fatalf("%s: no gap message in the log:\n%s", what, tailString(p.Log(), 4000))
		}
	}
	exitsWithGap(p, "after the failover")
	exitsWithGap(pb, "the standby instance, after the failover")
	w.finish()
	sconn, err := standby.Connect(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer sconn.Close(context.Background())
	var n int
	if err := sconn.QueryRow(f.ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&n); err != nil || n != 0 {
		t.Fatalf("slot on the promoted server: %d (err %v), want none: outboxd must not create it", n, err)
	}
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.Contains(line, want) {
			t.Logf("the gap, as outboxd logs it:\n%s", line)
		}
	}

	// A restart reads the progress topic: the same refusal.
	p2, _ := f.spawn()
	exitsWithGap(p2, "restarted")

	// Accepted: a new slot, and new events flow.
	p3, r3 := f.spawn("--accept-gap")
	if err := r3.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd --accept-gap did not stream: %v\n%s", err, tailString(p3.Log(), 4000))
	}
	if !strings.Contains(p3.Log(), "gap accepted") {
		t.Errorf("no \"gap accepted\" warning:\n%s", tailString(p3.Log(), 4000))
	}
	before := f.topicCount(f.topic())
	f.conn.Close(context.Background())
	if f.conn, err = standby.Connect(f.ctx, f.db); err != nil {
		t.Fatal(err)
	}
	end := f.commit(event{900001, "k1", "E", `{"after": "gap"}`}, event{900002, "k2", "E", `{"after": "gap"}`})
	poll(t, 30*time.Second, "new events after the accepted gap", func() bool { return f.topicCount(f.topic()) >= before+2 })
	_ = end
}

// Two databases on two clusters, each with the default-style slot name
// (the same) and the default progress topic, on one Kafka, as the `setup
// --role` role: the normal deployment of many services. Each keeps its own
// progress record ("<system id>/<slot>"), so neither reads the other's as
// "another cluster": both stream, and each restarts cleanly after the other
// ran, relaying exactly its own events.
func TestGapAnotherCluster(t *testing.T) {
	f := newFixture(t)
	role := f.asSetupRole()
	r := f.startRelay()
	end := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)
	r.stop(t, f.ctx) // leaves the progress record

	other := harness.PostgresForTest(t)
	if other.External() {
		t.Skip("needs a second, harness-started cluster (" + harness.EnvPostgres + " is set)")
	}
	superB, err := other.NewDatabase(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := harness.OutboxSchema("outboxd", "insert")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Exec(f.ctx, f.db, schema); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, f.ctx, "setup", "--postgres", superB, "--no-slot", "--role", role)
	dsnA, dsnB := f.dsn, strings.Replace(superB, "postgres://postgres@", "postgres://"+role+"@", 1)
	connB, err := other.Connect(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer connB.Close(context.Background())
	f.dsn = dsnB
	rb := f.startRelay()
	if _, err := connB.Exec(f.ctx, insertSQL, eventID(2), f.agg, "b", "E", `{}`); err != nil {
		t.Fatal(err)
	}
	poll(t, 20*time.Second, "cluster B's event relayed", func() bool { return f.topicCount(f.topic()) == 2 })
	rb.stop(t, f.ctx)

	f.dsn = dsnA
	ra := f.startRelay()
	f.waitConfirmed(f.commit(event{3, "a", "E", `{}`}), 20*time.Second)
	ra.stop(t, f.ctx)
	f.dsn = dsnB
	f.startRelay().stop(t, f.ctx)
	first, dups := byID(t, f.records())
	if len(first) != 3 || dups != 0 {
		t.Fatalf("%d distinct events, %d duplicates; want events 1-3 once each", len(first), dups)
	}
	for _, p := range []*relay{r, rb, ra} {
		if strings.Contains(p.Log(), "another cluster") {
			t.Fatalf("a cluster read the other's progress record:\n%s", tailString(p.Log(), 3000))
		}
	}
}

// A promoted standby that lagged (here: stopped while the primary went on,
// with synchronized_standby_slots unset) has a synchronized slot, but its
// timeline forked before what outboxd already published: Kafka holds events
// the new primary never had. outboxd reports that gap instead of streaming
// on, even once the promoted server's new WAL has passed the published
// position before outboxd gets in (the timeline history's switch point, not
// the WAL end, decides).
func TestGapPromotedStandbyBehind(t *testing.T) {
	if v := sharedVersion(t); v < 170000 {
		t.Skipf("needs failover slots (PostgreSQL 17+, server %d): on older servers the promoted standby has no slot at all, which TestPGFailover covers", v)
	}
	primary := harness.PostgresForTest(t)
	if primary.External() {
		t.Skip("needs a harness-started server it may crash (" + harness.EnvPostgres + " is set)")
	}
	f := newFixture(t, withPostgres(primary))
	role := f.asSetupRole()
	standby := primary.StandbyForTest(t, "standby1")
	f.dsn = strings.Replace(multiHostDSN(f.db, primary, standby), "postgres://postgres@", "postgres://"+role+"@", 1)
	p, r := f.spawn("--replication-timeout", "5s")
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd did not stream: %v", err)
	}
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	sconn, err := standby.Connect(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "slot synchronized to the standby", func() bool {
		_, _ = f.conn.Exec(f.ctx, `SELECT pg_log_standby_snapshot()`)
		return slotSynced(f.ctx, sconn, f.slot)
	})
	f.exec(`CREATE TABLE pad (x text)`) // not in the publication
	poll(t, 30*time.Second, "the standby replayed the pad table", func() bool {
		var n int
		return sconn.QueryRow(f.ctx, `SELECT count(*) FROM pg_class WHERE relname = 'pad'`).Scan(&n) == nil && n == 1
	})
	sconn.Close(context.Background())
	if err := standby.Stop(f.ctx); err != nil {
		t.Fatal(err)
	}
	// The primary goes on without it; outboxd publishes and confirms.
	var evs []event
	for n := 2; n <= 300; n++ {
		evs = append(evs, event{n, "a", "E", `{"pad": "` + strings.Repeat("x", 200) + `"}`})
	}
	published := f.commit(evs...)
	f.waitConfirmed(published, 20*time.Second)
	if err := primary.Kill(f.ctx); err != nil {
		t.Fatal(err)
	}
	// Keep outboxd out of the promoted server until its new WAL has passed
	// what was published (frozen: a replication connection ignores the
	// role's CONNECTION LIMIT).
	thaw := freeze(t, p)
	if err := standby.Start(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(f.ctx); err != nil {
		t.Fatal(err)
	}
	pconn, err := standby.Connect(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	defer pconn.Close(context.Background())
	for lsn := uint64(0); lsn <= published; {
		if _, err := pconn.Exec(f.ctx, `INSERT INTO pad SELECT repeat('x', 1000) FROM generate_series(1, 1000)`); err != nil {
			t.Fatal(err)
		}
		if lsn, err = harness.CurrentWALLSN(f.ctx, pconn); err != nil {
			t.Fatal(err)
		}
	}
	thaw()
	ctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
	defer cancel()
	code, err := p.Wait(ctx)
	// The promoted server's timeline forked before what was published
	// (TIMELINE_HISTORY): a gap even once its new WAL passes that position.
	if err != nil || code != 1 || !strings.Contains(p.Log(), "outboxd run: gap: the server's timeline 2 forked from timeline 1 at ") {
		t.Fatalf("exit %d, err %v; want exit 1: the promoted server is behind what was published\n%s", code, err, tailString(p.Log(), 4000))
	}
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.HasPrefix(line, "outboxd run: gap:") {
			t.Logf("%s", line)
		}
	}
}

// sharedVersion is the shared server's server_version_num.
func sharedVersion(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := sharedPG.Connect(ctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	v, err := harness.ServerVersionNum(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// A dropped slot re-created by `outboxd setup` (or its --print SQL run by a
// migration tool) starts at the WAL position of its creation: the event
// committed while no slot existed is in no slot. outboxd never confirms past
// its progress record, so a slot beyond the record was made or moved by
// something else: run reports the gap, whoever created the slot.
func TestGapSlotRecreatedBySetup(t *testing.T) {
	f := newFixture(t)
	super := f.dsn
	f.asSetupRole()
	r := f.startRelay()
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	r.stop(t, f.ctx)
	f.waitSlotInactive(10 * time.Second) // the walsender exits a moment after outboxd
	f.exec(`SELECT pg_drop_replication_slot($1)`, f.slot)
	f.commit(event{2, "a", "E", `{"while": "no slot"}`})
	out := mustCLI(t, f.ctx, "setup", "--postgres", super, "--slot", f.slot)
	if !strings.Contains(out, "created slot "+f.slot) {
		t.Fatalf("setup did not re-create the slot:\n%s", out)
	}
	p, _ := f.spawn()
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	code, err := p.Wait(ctx)
	const want = `outboxd run: gap: replication slot "` // … is confirmed up to X, beyond LSN Y up to which outboxd recorded publishing it
	if err != nil || code != 1 || !strings.Contains(p.Log(), want) || !strings.Contains(p.Log(), "up to which outboxd recorded publishing it") {
		t.Fatalf("exit %d, err %v; want exit 1 with the gap\n%s", code, err, tailString(p.Log(), 4000))
	}
	if n := f.topicCount(f.topic()); n != 1 {
		t.Fatalf("%d records, want event 1 only", n)
	}
}

// A server restored from a cold copy of its data directory taken before
// events A1-A5 were published, which then commits F1-F3 and enough other
// WAL to pass A5's position before outboxd gets back in: outboxd must not
// resume from where it had acked on the old server (past F1-F3's reused
// positions) but from the restored slot's confirmed position, so F1-F3
// reach Kafka. (A1-A5 stay in Kafka without a row: that the restore made
// them phantom is not detectable once the WAL passed them.)
//
// outboxd is frozen (SIGSTOP) from the restored server's start until its
// WAL has passed A5: nothing else keeps a replication connection out
// (PostgreSQL does not apply a role's CONNECTION LIMIT to walsenders, which
// made this test flaky while it relied on one), and an outboxd that got in
// earlier rightly refuses with a gap (the server's WAL ends before what was
// published): that is TestGapRestoreBeforeWALPassed's case, not this one.
func TestGapRestoreFromColdCopy(t *testing.T) {
	f, primary := restoreFixture(t)
	f.exec(`CREATE TABLE pad (x text)`) // not in the publication; created before the copy (its catalog WAL would move F1-F3)
	r := f.startRelay()
	backup := f.coldCopyAfterEvent1(primary, r)
	var evs []event
	for n := 2; n <= 6; n++ {
		evs = append(evs, event{n, "a", "A", `{"pad": "` + strings.Repeat("a", 2000) + `"}`}) // F1-F3 fall inside their WAL
	}
	published := f.commit(evs...)
	f.waitConfirmed(published, 20*time.Second)

	thaw := f.restoreColdCopy(primary, backup, r.Proc) // ends outboxd's session; it retries against a stopped server
	end := f.commit(event{11, "f", "F", `{}`}, event{12, "f", "F", `{}`}, event{13, "f", "F", `{}`})
	for end <= published {
		f.exec(`INSERT INTO pad SELECT repeat('x', 1000) FROM generate_series(1, 1000)`)
		end = f.walLSN()
	}
	thaw()
	poll(t, 60*time.Second, "the restored slot confirmed past F1-F3 and the padding", func() bool {
		if r.Exited() {
			t.Fatalf("outboxd exited instead of streaming from the restored slot:\n%s", tailString(r.Log(), 4000))
		}
		return f.slotState().ConfirmedFlushLSN >= end
	})
	first, _ := byID(t, f.records())
	for _, n := range []int{11, 12, 13} {
		if _, ok := first[eventID(n)]; !ok {
			t.Errorf("event F%d, committed on the restored server, never reached Kafka", n-10)
		}
	}
	if len(first) != 9 {
		t.Errorf("%d distinct events in Kafka, want 9 (1, A1-A5, F1-F3)", len(first))
	}
	if !r.logged(f.ctx, "the server changed since the last session; resuming from the slot's confirmed position") {
		t.Errorf("no \"server changed\" warning:\n%s", tailString(r.Log(), 4000))
	}
	t.Logf("published up to %s on the old server; the restored one passed it at %s", harness.FormatLSN(published), harness.FormatLSN(end))
}

// freeze stops p (SIGSTOP) until the returned thaw (SIGCONT) runs, or the
// test ends: a process the test must keep out of a server for a while
// (a replication connection ignores CONNECTION LIMIT).
// coldCopy stops primary, copies its data directory (skipping the test
// where the backend cannot), starts it again and renews f's connection; it
// returns the copy's path.
func (f *fixture) coldCopy(primary *harness.Postgres) string {
	f.t.Helper()
	if err := primary.Stop(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	backup := f.t.TempDir() + "/data"
	if err := primary.ColdCopy(f.ctx, backup); err != nil {
		if strings.Contains(err.Error(), "not supported") {
			f.t.Skip(err)
		}
		f.t.Fatal(err)
	}
	f.startAgain(primary)
	return backup
}

// restoreFixture is a fixture on a server of its own, which the test may
// stop and restore (it skips against an external one), as the setup role.
func restoreFixture(t *testing.T) (*fixture, *harness.Postgres) {
	t.Helper()
	primary := harness.PostgresForTest(t)
	if primary.External() {
		t.Skip("needs a harness-started server it may stop and restore (" + harness.EnvPostgres + " is set)")
	}
	f := newFixture(t, withPostgres(primary))
	f.asSetupRole()
	return f, primary
}

// coldCopyAfterEvent1 has r publish event 1, takes a cold copy of primary
// (coldCopy) and waits until r streams again; it returns the copy's path.
func (f *fixture) coldCopyAfterEvent1(primary *harness.Postgres, r *relay) string {
	f.t.Helper()
	f.waitConfirmed(f.commit(event{1, "a", "E", `{}`}), 20*time.Second)
	backup := f.coldCopy(primary)
	// Bounds cover outboxd's reconnect backoff (up to 15 s) after the
	// refused connections.
	poll(f.t, 60*time.Second, "outboxd streaming again", func() bool { return f.slotState().Active && r.role(f.t) == "active" })
	return backup
}

// restoreColdCopy stops primary, freezes outboxd's process p (nothing else
// keeps a walsender out: see freeze), restores the copy at backup, starts
// the server and renews f's connection. The caller thaws p.
func (f *fixture) restoreColdCopy(primary *harness.Postgres, backup string, p *harness.Proc) (thaw func()) {
	f.t.Helper()
	if err := primary.Stop(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	thaw = freeze(f.t, p)
	if err := primary.RestoreColdCopy(f.ctx, backup); err != nil {
		f.t.Fatal(err)
	}
	f.startAgain(primary)
	return thaw
}

// startAgain starts the stopped primary and renews f's connection to it.
func (f *fixture) startAgain(primary *harness.Postgres) {
	f.t.Helper()
	if err := primary.Start(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	f.conn.Close(context.Background())
	var err error
	if f.conn, err = primary.Connect(f.ctx, f.db); err != nil {
		f.t.Fatal(err)
	}
}

func freeze(t *testing.T, p *harness.Proc) (thaw func()) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := p.Signal(syscall.SIGCONT); err != nil && !p.Exited() {
				t.Error(err)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}

// Exactly-once, restored from a cold copy of the same cluster (same system
// identifier, same timeline) taken before A1-A5 were published:
//
//   - outboxd back in before the restored server's WAL reaches the
//     checkpoint: the WAL ends before it, a gap (exit 1);
//   - a new outboxd once the restored server committed F1-F3 and enough WAL
//     to pass the checkpoint: nothing at connect shows the restore, but the
//     checkpoint's own transaction is not in the replayed WAL, so it is a gap
//     too (exit 1), where the checkpoint's skip rule used to drop F1-F3 as
//     "already in Kafka" and stream on;
//   - with --accept-gap: F1-F3 reach Kafka.
func TestGapRestoreExactlyOnce(t *testing.T) {
	f, primary := restoreFixture(t)
	f.exec(`CREATE TABLE pad (x text)`) // not in the publication
	eos := []string{"--exactly-once", "--checkpoint-topic", "cp." + f.agg}
	p, r := f.spawn(eos...)
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd did not stream: %v\n%s", err, tailString(p.Log(), 4000))
	}
	backup := f.coldCopyAfterEvent1(primary, r)
	var evs []event
	for n := 2; n <= 6; n++ {
		evs = append(evs, event{n, "a", "A", `{"pad": "` + strings.Repeat("a", 2000) + `"}`})
	}
	published := f.commit(evs...)
	f.waitConfirmed(published, 20*time.Second)
	if n := len(f.readCommitted(6)); n != 6 {
		t.Fatalf("%d committed records before the restore, want 6", n)
	}

	exitsWithGap := func(p *harness.Proc, what, want string) {
		t.Helper()
		wctx, cancel := context.WithTimeout(f.ctx, 60*time.Second)
		defer cancel()
		code, err := p.Wait(wctx)
		if err != nil || code != 1 || !strings.Contains(p.Log(), want) {
			t.Fatalf("%s: outboxd exit %d, err %v; want exit 1 with %q\n%s", what, code, err, want, tailString(p.Log(), 4000))
		}
		for _, line := range strings.Split(p.Log(), "\n") {
			if strings.HasPrefix(line, "outboxd run: gap:") {
				t.Logf("%s: %s", what, line)
			}
		}
	}
	thaw := f.restoreColdCopy(primary, backup, p)
	thaw() // back in before anything is written: the WAL ends before the checkpoint
	exitsWithGap(p, "back in before the WAL passed the checkpoint", "outboxd run: gap: the server's WAL ends at ")

	end := f.commit(event{11, "f", "F", `{}`}, event{12, "f", "F", `{}`}, event{13, "f", "F", `{}`})
	for end <= published {
		f.exec(`INSERT INTO pad SELECT repeat('x', 1000) FROM generate_series(1, 1000)`)
		end = f.walLSN()
	}
	p2, _ := f.spawn(eos...)
	exitsWithGap(p2, "started once the WAL passed the checkpoint", "outboxd run: gap: the exactly-once checkpoint in Kafka records slot ")
	if s := f.slotState(); s.ConfirmedFlushLSN >= end {
		t.Fatalf("the slot was confirmed to %s, past F1-F3", harness.FormatLSN(s.ConfirmedFlushLSN))
	}

	p3, r3 := f.spawn(append(eos, "--accept-gap")...)
	if err := r3.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd --accept-gap did not stream: %v\n%s", err, tailString(p3.Log(), 4000))
	}
	poll(t, 60*time.Second, "the slot confirmed past F1-F3 after the accepted gap", func() bool {
		if p3.Exited() {
			t.Fatalf("outboxd --accept-gap exited:\n%s", tailString(p3.Log(), 4000))
		}
		return f.slotState().ConfirmedFlushLSN >= end
	})
	first, _ := byID(t, f.readCommitted(9)) // and a duplicate of event 1 where the restored slot is before it
	for _, n := range []int{11, 12, 13} {
		if _, ok := first[eventID(n)]; !ok {
			t.Errorf("event F%d, committed on the restored server, never reached Kafka after --accept-gap", n-10)
		}
	}
	if len(first) != 9 {
		t.Errorf("%d distinct events in Kafka, want 9 (1, A1-A5, F1-F3)", len(first))
	}
	if !strings.Contains(p3.Log(), "gap accepted") {
		t.Errorf("no \"gap accepted\" warning:\n%s", tailString(p3.Log(), 4000))
	}
}

// Exactly-once, restored from a cold copy, and the restored server runs the
// same shape of workload (issue 31 item 1): one event, a cold copy, A1-A5
// in one transaction published; then the copy is restored and F1-F5 are
// committed in one transaction with the same row sizes. The restored
// server reuses A's xid, and nothing else writes WAL (no heartbeat), so F
// ends at the LSN the checkpoint records. A new outboxd must not take F
// for A: F1-F5 reach read_committed consumers, or a gap is reported and
// the slot stays before them. On main the boundary check accepted F by its
// LSN alone: F1-F5 were skipped as "already in Kafka" and the slot was
// confirmed past them, silently.
func TestGapRestoreSameShapeExactlyOnce(t *testing.T) {
	f, primary := restoreFixture(t)
	eos := []string{"--exactly-once", "--checkpoint-topic", "cp." + f.agg, "--heartbeat-interval", "0"}
	p, r := f.spawn(eos...)
	if err := r.waitStreaming(f.ctx); err != nil {
		t.Fatalf("outboxd did not stream: %v\n%s", err, tailString(p.Log(), 4000))
	}
	backup := f.coldCopyAfterEvent1(primary, r)
	batch := func(first int, key string) []event {
		var evs []event
		for n := first; n < first+5; n++ {
			evs = append(evs, event{n, key, strings.ToUpper(key), `{"pad": "` + strings.Repeat(key, 2000) + `"}`})
		}
		return evs
	}
	xidOf := func(n int) (xid uint32) {
		t.Helper()
		if err := f.conn.QueryRow(f.ctx, `SELECT xmin::text::bigint FROM outbox WHERE id = $1`, eventID(n)).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		return xid
	}
	published := f.commit(batch(2, "a")...)
	aXid := xidOf(2)
	f.waitConfirmed(published, 20*time.Second)
	if n := len(f.readCommitted(6)); n != 6 {
		t.Fatalf("%d committed records before the restore, want 6", n)
	}
	if err := p.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	if err := primary.Stop(f.ctx); err != nil {
		t.Fatal(err)
	}
	if err := primary.RestoreColdCopy(f.ctx, backup); err != nil {
		t.Fatal(err)
	}
	f.startAgain(primary)
	end := f.commit(batch(12, "f")...)
	if fXid := xidOf(12); end != published || fXid != aXid {
		t.Fatalf("the restored server's transaction does not look like the published one (xid %d ending at %s; A's: xid %d ending at %s): the test shows nothing",
			fXid, harness.FormatLSN(end), aXid, harness.FormatLSN(published))
	}
	t.Logf("F1-F5: xid %d ending at %s, as A1-A5", aXid, harness.FormatLSN(end))

	p2, _ := f.spawn(eos...)
	var gapped bool
	poll(t, 60*time.Second, "F1-F5 confirmed, or a gap reported", func() bool {
		if p2.Exited() {
			gapped = true
			return true
		}
		return f.slotState().ConfirmedFlushLSN >= end
	})
	if gapped {
		code, _ := p2.Wait(f.ctx)
		if code != 1 || !strings.Contains(p2.Log(), "outboxd run: gap: the exactly-once checkpoint in Kafka records slot ") {
			t.Fatalf("outboxd exit %d, want 1 with a gap:\n%s", code, tailString(p2.Log(), 4000))
		}
		if s := f.slotState(); s.ConfirmedFlushLSN >= end {
			t.Fatalf("gap reported, but the slot was confirmed to %s, past F1-F5", harness.FormatLSN(s.ConfirmedFlushLSN))
		}
		for _, line := range strings.Split(p2.Log(), "\n") {
			if strings.HasPrefix(line, "outboxd run: gap:") {
				t.Log(line)
			}
		}
		return
	}
	first, _ := byID(t, f.readCommitted(11))
	for n := 12; n < 17; n++ {
		if _, ok := first[eventID(n)]; !ok {
			t.Errorf("event F%d, committed on the restored server, was confirmed but never reached read_committed consumers", n-11)
		}
	}
}
