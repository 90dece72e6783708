package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
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

// Two instances on one slot: one streams, the other stands by (healthy,
// ready, role standby, outboxd_active 0) and takes over within 2 s of the
// active's connection closing, on SIGKILL and on SIGTERM, under load, with
// nothing lost.
func TestHAStandbyTakeover(t *testing.T) {
	f := newFixture(t)
	a := f.startRelay()
	a.waitRole(t, "active", 5*time.Second)
	b := func() *relay { _, r := f.spawn(); return r }()
	b.waitRole(t, "standby", 10*time.Second)
	checkStandby(t, b, f.slot)
	if v := a.metric(t, "outboxd_active"); v != 1 {
		t.Errorf("active outboxd_active = %v", v)
	}

	const total = 6000
	done := f.writeInBackground(total)
	poll(t, 20*time.Second, "first events relayed", func() bool { return f.topicCount(f.topic()) > 500 })
	if err := a.Kill(); err != nil { // SIGKILL: the kernel closes its connection
		t.Fatal(err)
	}
	took := b.waitRole(t, "active", 5*time.Second)
	t.Logf("takeover after SIGKILL of the active: %s", took.Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("takeover after SIGKILL took %s, want ≤ 2s", took)
	}

	// The killed instance comes back as a standby; SIGTERM the active.
	a = f.startStandby()
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
