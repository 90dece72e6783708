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
	for _, tc := range []struct {
		procs int
		moved time.Duration
	}{{2, 0}, {1, 3 * time.Millisecond}} {
		prev := runtime.GOMAXPROCS(tc.procs)
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			holdSleep(3 * time.Millisecond)
			if got := time.Since(start); got != tc.moved {
				t.Errorf("GOMAXPROCS %d: the bubble's clock moved %v during holdSleep(3ms), want %v", tc.procs, got, tc.moved)
			}
		})
		runtime.GOMAXPROCS(prev)
	}
	if got, want := reflect.ValueOf(newCoalescer(nil).sleep).Pointer(), reflect.ValueOf(holdSleep).Pointer(); got != want {
		t.Error("the live connection's coalescer does not wait in holdSleep")
	}
}
