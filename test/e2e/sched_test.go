package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// outboxd runs every one of its threads under SCHED_BATCH (--sched-batch,
// on by default), the ones the Go runtime started while it streamed too,
// and under the default policy with --sched-batch=false.
func TestSchedBatch(t *testing.T) {
	f := newFixture(t)
	for i, c := range []struct {
		args   []string
		policy string // /proc/<pid>/task/<tid>/stat's policy: 3 SCHED_BATCH, 0 SCHED_OTHER
	}{{nil, "3"}, {[]string{"--sched-batch=false"}, "0"}} {
		r := f.startRelay(c.args...)
		end := f.commit(event{i + 1, "a", "E", `{"v": 1}`})
		f.waitConfirmed(end, 20*time.Second)
		pols := threadPolicies(t, r.Pid())
		if len(pols) < 2 {
			t.Fatalf("outboxd %v has %d threads: %v", c.args, len(pols), pols)
		}
		for tid, p := range pols {
			if p != c.policy {
				t.Errorf("outboxd %v: thread %s has scheduling policy %s, want %s (of %d threads: %v)", c.args, tid, p, c.policy, len(pols), pols)
			}
		}
		if logged := strings.Contains(r.Log(), "CPU scheduling policy SCHED_BATCH"); logged != (c.policy == "3") {
			t.Errorf("outboxd %v: SCHED_BATCH logged %v, want %v", c.args, logged, c.policy == "3")
		}
		r.stop(t, f.ctx)
	}
}

// threadPolicies reads each thread's scheduling policy (the 41st field of
// /proc/<pid>/task/<tid>/stat), by thread id.
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
