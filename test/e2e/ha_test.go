package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxd/outboxd/test/harness"
)

// role reads "role" from /status ("" if the endpoint does not answer).
func (r *relay) role(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + r.http + "/status")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var st struct {
		Role string `json:"role"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return ""
	}
	return st.Role
}

// waitRole polls /status every 10 ms until the relay has role, and returns
// how long that took.
func (r *relay) waitRole(t *testing.T, role string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for r.role(t) != role {
		if time.Since(start) > within {
			t.Fatalf("outboxd at %s not %s within %s (role %q)", r.http, role, within, r.role(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// checkStandby asserts what a healthy standby reports.
func checkStandby(t *testing.T, r *relay, slot string) {
	t.Helper()
	if c, _ := r.get(t, "/healthz"); c != 200 {
		t.Errorf("standby /healthz %d", c)
	}
	poll(t, 10*time.Second, "standby /readyz 200", func() bool { c, _ := r.get(t, "/readyz"); return c == 200 })
	if _, body := r.get(t, "/readyz"); !strings.HasPrefix(body, "standby: slot "+slot+" is held by PID ") {
		t.Errorf("standby /readyz body %q", body)
	}
	if v := r.metric(t, "outboxd_active"); v != 0 {
		t.Errorf("standby outboxd_active = %v", v)
	}
}

// haTimeout is the e2e HA tests' --replication-timeout: short, so that a
// test can watch two instances for several of it.
const haTimeout = 3 * time.Second

// Two instances on one slot, as the role `outboxd setup --role` creates
// when run by a role that may not grant pg_read_all_stats (not a
// superuser), so that pg_stat_replication hides its walsenders' reply_time
// from it: one streams, the other stands by (healthy, ready, role standby,
// outboxd_active 0) and leaves the healthy active alone for three times
// --replication-timeout (the same walsender PID throughout: no 57P01), then
// takes over within 2 s of the active's connection closing, on SIGKILL and
// on SIGTERM, under load, with nothing lost.
func TestHAStandbyTakeover(t *testing.T) {
	f := newFixture(t)
	role := f.asSetupRole()
	f.exec(`REVOKE pg_read_all_stats FROM ` + role)
	if f.readsAllStats(role) {
		t.Fatalf("role %s still has pg_read_all_stats; the test needs a standby that cannot see reply_time", role)
	}
	timeout := []string{"--replication-timeout", haTimeout.String()}
	a := f.startRelay(timeout...)
	a.waitRole(t, "active", 30*time.Second)
	b := func() *relay { _, r := f.spawn(timeout...); return r }()
	b.waitRole(t, "standby", 10*time.Second)
	checkStandby(t, b, f.slot)
	if v := a.metric(t, "outboxd_active"); v != 1 {
		t.Errorf("active outboxd_active = %v", v)
	}

	const total = 6000
	done := f.writeInBackground(total)
	f.activeStays(a, 3*haTimeout)
	poll(t, 20*time.Second, "first events relayed", func() bool { return f.topicCount(f.topic()) > 500 })
	if err := a.Kill(); err != nil { // SIGKILL: the kernel closes its connection
		t.Fatal(err)
	}
	took := b.waitRole(t, "active", 30*time.Second)
	t.Logf("takeover after SIGKILL of the active: %s", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("takeover after SIGKILL took %s, want ≤ 2s", took)
	}

	// The killed instance comes back as a standby; SIGTERM the active.
	a = f.startStandby(timeout...)
	checkStandby(t, a, f.slot)
	end := <-done
	if err := b.Signal(syscallSIGTERM); err != nil {
		t.Fatal(err)
	}
	took2 := a.waitRole(t, "active", 35*time.Second)
	// SIGTERM first drains in-flight acks (--shutdown-timeout); the
	// takeover clock starts when the connection closes.
	t.Logf("takeover after SIGTERM of the active (including its shutdown): %s", took2.Round(time.Millisecond))
	if took2 > 2*time.Second {
		t.Errorf("takeover after SIGTERM took %s, want ≤ 2s", took2)
	}

	f.waitConfirmed(end, 60*time.Second)
	first, dups := byID(t, f.records())
	for n := 1; n <= total; n++ {
		if _, ok := first[eventID(n)]; !ok {
			t.Fatalf("event %d lost", n)
		}
	}
	if len(first) != total {
		t.Errorf("%d distinct events, want %d", len(first), total)
	}
	t.Logf("%d events, %d duplicates over two takeovers", total, dups)
}

// startStandby spawns an instance and waits until it stands by.
func (f *fixture) startStandby(extra ...string) *relay {
	f.t.Helper()
	_, r := f.spawn(extra...)
	r.waitRole(f.t, "standby", 20*time.Second)
	return r
}

// statusDoc reads /status.
func (r *relay) statusDoc(t *testing.T) map[string]any {
	t.Helper()
	resp, err := http.Get("http://" + r.http + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st
}

// asSetupRole creates the test's role with `outboxd setup --role --no-slot`
// (as the superuser, which the fixture's conn stays) and points f.dsn, and
// so every outboxd the test spawns, at it: HA, failover and gap tests run
// with the privileges a deployment has, not the superuser's. The role is
// dropped with the test.
func (f *fixture) asSetupRole() string {
	f.t.Helper()
	role := "r_" + strings.TrimPrefix(f.slot, "s_")
	if len(role) > 40 {
		role = role[:40]
	}
	f.exec(`DROP ROLE IF EXISTS ` + role)
	f.t.Cleanup(func() { // after every outboxd of the test (registered later, cleaned up first)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		conn, err := f.pg.Connect(ctx, f.db)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		_, _ = conn.Exec(ctx, `DROP OWNED BY `+role)
		_, _ = conn.Exec(ctx, `DROP ROLE IF EXISTS `+role)
	})
	mustCLI(f.t, f.ctx, "setup", "--postgres", f.dsn, "--no-slot", "--role", role)
	dsn := strings.Replace(f.dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	if dsn == f.dsn {
		f.t.Fatalf("could not rewrite the user of %q", f.dsn)
	}
	f.dsn = dsn
	if stats := f.readsAllStats(role); !stats {
		f.t.Fatalf("role %s lacks pg_read_all_stats after outboxd setup --role: a standby could not see whether the active replies", role)
	}
	return role
}

// readsAllStats reports whether role may see pg_stat_replication's
// reply_time (pg_read_all_stats, which setup --role grants).
func (f *fixture) readsAllStats(role string) bool {
	f.t.Helper()
	var stats bool
	if err := f.conn.QueryRow(f.ctx, `SELECT pg_has_role($1, 'pg_read_all_stats', 'USAGE')`, role).Scan(&stats); err != nil {
		f.t.Fatal(err)
	}
	return stats
}

// activeStays watches the slot for d: the same walsender PID holds it
// throughout (a standby that took it would show a new PID: the active was
// terminated), and a still reports role active.
func (f *fixture) activeStays(a *relay, d time.Duration) {
	f.t.Helper()
	conn, err := f.pg.Connect(f.ctx, f.db) // f.conn may be writing
	if err != nil {
		f.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	state := func() harness.SlotState {
		s, err := harness.SlotInfo(f.ctx, conn, f.slot)
		if err != nil {
			f.t.Fatal(err)
		}
		return s
	}
	pid := state().ActivePID
	if pid == 0 {
		f.t.Fatal("slot not active")
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if s := state(); s.ActivePID != pid {
			f.t.Fatalf("the slot's walsender changed from PID %d to %d within %s of watching: the healthy active was terminated", pid, s.ActivePID, d)
		}
	}
	if r := a.role(f.t); r != "active" {
		f.t.Fatalf("active reports role %q after %s", r, d)
	}
	f.t.Logf("walsender PID %d held the slot for %s with a standby watching", pid, d)
}

// An active whose host clock runs behind the database's by more than
// --replication-timeout is not silent (issue 31 item 5): its replies carry
// its own clock in reply_time, and on main the standby took now() -
// reply_time for its silence, terminated the healthy active at once and
// took the slot (two such hosts took it from each other). The "active" here
// is a replication client named outboxd that replies every 200 ms with its
// clock an hour behind; the standby, as the role `outboxd setup --role`
// creates (pg_read_all_stats lets it see reply_time; without it the standby
// never takes over here and the test fails), must leave it alone for three
// times --replication-timeout, and take over once it stops replying.
func TestHASkewedClockIsNotSilent(t *testing.T) {
	f := newFixture(t)
	f.asSetupRole() // the holder too: the active's walsender runs as outboxd's role
	f.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	pid, holder, release := f.holdSlotAs("outboxd")
	start := pglogrepl.LSN(f.slotState().ConfirmedFlushLSN)
	stop := make(chan struct{})
	replied := make(chan struct{})
	go func() {
		defer close(replied)
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if err := pglogrepl.SendStandbyStatusUpdate(f.ctx, holder, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: start, ClientTime: time.Now().Add(-time.Hour)}); err != nil {
				return
			}
		}
	}()
	p, r := f.spawn("--replication-timeout", haTimeout.String())
	r.waitRole(t, "standby", 20*time.Second)
	deadline := time.Now().Add(3 * haTimeout)
	for time.Now().Before(deadline) {
		if s := f.slotState(); s.ActivePID != pid {
			t.Fatalf("the replying holder (walsender %d, clock an hour behind) was taken for silent: the slot is held by %d\n%s", pid, s.ActivePID, tailString(p.Log(), 3000))
		}
		if p.Exited() {
			t.Fatalf("outboxd exited:\n%s", tailString(p.Log(), 3000))
		}
		time.Sleep(100 * time.Millisecond) // sampling the slot's holder
	}
	close(stop)
	<-replied
	took := r.waitRole(t, "active", 3*haTimeout+10*time.Second)
	t.Logf("took over %s after the holder stopped replying (--replication-timeout %s)", took.Round(100*time.Millisecond), haTimeout)
	release()
	end := f.commit(event{1, "a", "E", `{}`})
	f.waitConfirmed(end, 20*time.Second)
}
