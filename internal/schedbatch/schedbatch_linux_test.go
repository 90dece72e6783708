//go:build linux

package schedbatch

import (
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func policies(t *testing.T) map[int]uint32 {
	t.Helper()
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]uint32{}
	for _, tid := range tids {
		a, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			continue // ended
		}
		m[tid] = a.Policy
	}
	return m
}

// lockThreads parks n goroutines, each on an OS thread of its own, which
// makes the runtime start threads it did not have; release ends them (and
// their threads: a goroutine that exits locked takes its thread with it).
func lockThreads(n int) (release func()) {
	var started sync.WaitGroup
	stop := make(chan struct{})
	started.Add(n)
	for range n {
		go func() {
			runtime.LockOSThread()
			started.Done()
			<-stop
		}()
	}
	started.Wait()
	return func() { close(stop) }
}

// Every thread runs under SCHED_BATCH after Set, with its nice value, and
// so does every thread the runtime starts afterwards (inherited at clone).
func TestSetEveryThreadAndLaterOnes(t *testing.T) {
	if _, err := Reset(); err != nil { // an earlier run of this test in the process set them
		t.Fatal(err)
	}
	before, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Set()
	if err != nil {
		t.Fatal(err)
	}
	if r.Threads < 1 || r.Kept != 0 {
		t.Fatalf("Set = %+v, want every thread moved, none kept", r)
	}
	for tid, p := range policies(t) {
		if p != unix.SCHED_BATCH {
			t.Errorf("thread %d: policy %d after Set, want SCHED_BATCH (%d)", tid, p, unix.SCHED_BATCH)
		}
	}
	after, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if after.Nice != before.Nice {
		t.Errorf("nice %d after Set, want %d (kept)", after.Nice, before.Nice)
	}
	n := len(policies(t))
	release := lockThreads(n + 4)
	defer release()
	later := policies(t)
	if len(later) <= n {
		t.Fatalf("%d threads after locking %d goroutines to threads, %d before: the runtime started none", len(later), n+4, n)
	}
	for tid, p := range later {
		if p != unix.SCHED_BATCH {
			t.Errorf("thread %d, started after Set: policy %d, want SCHED_BATCH (%d) inherited", tid, p, unix.SCHED_BATCH)
		}
	}
	if r, err := Set(); err != nil || r.Threads != 0 {
		t.Errorf("Set again = %+v, %v; want nothing to change", r, err)
	}
	if r, err := Reset(); err != nil || r.Threads < len(later) {
		t.Errorf("Reset = %+v, %v; want every thread moved back (%d at least)", r, err, len(later))
	}
	for tid, p := range policies(t) {
		if p != unix.SCHED_NORMAL {
			t.Errorf("thread %d: policy %d after Reset, want SCHED_NORMAL (0)", tid, p)
		}
	}
	if ok, err := Default(); !ok || err != nil {
		t.Errorf("Default after Reset = %v, %v", ok, err)
	}
}

// A thread someone put under another policy keeps it.
func TestSetKeepsAChosenPolicy(t *testing.T) {
	tid := make(chan int)
	done := make(chan uint32)
	go func() {
		runtime.LockOSThread() // exits locked: the thread ends with the test
		a, err := unix.SchedGetAttr(0, 0)
		if err == nil {
			a.Policy, a.Flags = unix.SCHED_IDLE, 0
			err = unix.SchedSetAttr(0, a, 0)
		}
		if err != nil {
			tid <- -1
			return
		}
		tid <- unix.Gettid()
		<-tid
		a, err = unix.SchedGetAttr(0, 0)
		if err != nil {
			done <- 99
			return
		}
		done <- a.Policy
	}()
	id := <-tid
	if id < 0 {
		t.Skip("cannot set SCHED_IDLE here")
	}
	r, err := Set()
	if err != nil {
		t.Fatal(err)
	}
	if r.Kept < 1 {
		t.Errorf("Set = %+v, want the SCHED_IDLE thread counted as kept", r)
	}
	if r, err := Reset(); err != nil || r.Kept < 1 {
		t.Errorf("Reset = %+v, %v; want the SCHED_IDLE thread kept", r, err)
	}
	tid <- 0
	if p := <-done; p != unix.SCHED_IDLE {
		t.Fatalf("the SCHED_IDLE thread has policy %d after Set, want SCHED_IDLE (%d) kept", p, unix.SCHED_IDLE)
	}
	// The goroutine exits locked, which ends its thread: wait for that, so
	// that no test after this one meets it.
	for {
		if _, ok := policies(t)[id]; !ok {
			return
		}
		runtime.Gosched()
	}
}
