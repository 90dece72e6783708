package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/test/harness"
)

// outboxd runs under SCHED_BATCH while a backlog drains (--sched-batch, on
// by default), every thread of it, and under the default policy once the
// stream is quiet; with --sched-batch=false, always the default policy.
func TestSchedBatch(t *testing.T) {
	f := newFixture(t)
	const rows = 100_000
	// The slot, before any backlog: outboxd creates it.
	r := f.startRelay()
	f.waitConfirmed(f.commit(event{1, "a", "E", `{"v": 1}`}), 20*time.Second)
	r.stop(t, f.ctx)
	for i, c := range []struct {
		args  []string
		batch bool
	}{{nil, true}, {[]string{"--sched-batch=false"}, false}} {
		// The backlog first, then outboxd: it starts behind, draining.
		f.exec(`INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
			SELECT ('00000000-0000-0000-000'||$3||'-' || lpad(g::text, 12, '0'))::uuid, $1, 'k' || (g % 100), 'Bulk', jsonb_build_object('n', g)
			FROM generate_series(1, $2) g`, f.agg, rows, fmt.Sprint(i+1))
		end := f.walLSN()
		r := f.startRelay(c.args...)
		t.Logf("outboxd %v: draining %d events", c.args, rows)
		sawBatch := false
		deadline := time.Now().Add(120 * time.Second)
		for harness.MustSlotInfo(f.ctx, t, f.conn, f.slot).ConfirmedFlushLSN < end { // poll the threads while it drains
			if time.Now().After(deadline) {
				t.Fatalf("outboxd %v: not confirmed past %X within 120 s", c.args, end)
			}
			if allPolicy(threadPolicies(t, r.Pid()), "3") {
				sawBatch = true
			}
		}
		if sawBatch != c.batch {
			t.Errorf("outboxd %v: every thread under SCHED_BATCH while draining: %v, want %v\n%s", c.args, sawBatch, c.batch, tailString(r.Log(), 3000))
		}
		// Quiet: back under the default policy (0) soon after.
		for !allPolicy(threadPolicies(t, r.Pid()), "0") {
			if time.Now().After(deadline) {
				t.Fatalf("outboxd %v: threads %v, not all under the default policy (0) once quiet", c.args, threadPolicies(t, r.Pid()))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if logged := strings.Contains(r.Log(), "SCHED_BATCH while a backlog drains"); logged != c.batch {
			t.Errorf("outboxd %v: the policy switch logged %v, want %v", c.args, logged, c.batch)
		}
		r.stop(t, f.ctx)
	}
}

func allPolicy(pols map[string]string, p string) bool {
	for _, q := range pols {
		if q != p {
			return false
		}
	}
	return len(pols) > 0
}

// threadPolicies reads each thread's scheduling policy (the 41st field of
// /proc/<pid>/task/<tid>/stat: 0 SCHED_NORMAL, 3 SCHED_BATCH), by thread id.
func threadPolicies(t *testing.T, pid int) map[string]string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pols := map[string]string{}
	for _, e := range ents {
		data, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		// The command name, in parentheses, may hold spaces: count the
		// fields after it, from the 3rd (state).
		s := string(data)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 39 {
			t.Fatalf("%s/stat has %d fields after the name: %q", e.Name(), len(fields), s)
		}
		pols[e.Name()] = fields[41-3]
	}
	return pols
}
