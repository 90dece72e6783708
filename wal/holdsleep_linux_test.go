package wal

import (
	"reflect"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// TestHoldSleepKeepsItsP: with two Ps or more, holdSleep waits without
// parking the goroutine, so the Go scheduler never sees it blocked: in a
// synctest bubble, whose clock moves only while every goroutine in it is
// durably blocked, the wait leaves the clock where it was (time.Sleep
// would move it by exactly the wait). With one P it is time.Sleep, which
// does. The live connection's coalescer waits in it.
func TestHoldSleepKeepsItsP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs int
		moved time.Duration
	}{{2, 0}, {1, 3 * time.Millisecond}} {
		runtime.GOMAXPROCS(tc.procs)
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			holdSleep(3 * time.Millisecond)
			if got := time.Since(start); got != tc.moved {
				t.Errorf("GOMAXPROCS %d: the bubble's clock moved %v during holdSleep(3ms), want %v", tc.procs, got, tc.moved)
			}
		})
	}
	if got, want := reflect.ValueOf(newCoalescer(nil).sleep).Pointer(), reflect.ValueOf(holdSleep).Pointer(); got != want {
		t.Error("the live connection's coalescer does not wait in holdSleep")
	}
}

// TestHoldSleepYieldsToStopTheWorld: a stop-the-world (runtime.GC's) must
// stop the goroutine that holds its P in holdSleep; the runtime's
// preemption signal ends the nanosleep (EINTR), so the collection does not
// wait out the sleep. Without that, the first runtime.GC below would return
// only after the minute.
func TestHoldSleepYieldsToStopTheWorld(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(2)
	done := make(chan struct{})
	go func() { holdSleep(time.Minute); close(done) }()
	start := time.Now()
	for {
		runtime.GC() // until one finds the goroutine in its sleep and ends it
		if time.Since(start) > 30*time.Second {
			t.Fatal("a stop-the-world waited out holdSleep(1m) (30 s and more of garbage collections)")
		}
		select {
		case <-done:
			return
		default:
		}
	}
}
